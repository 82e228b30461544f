// Package poolsvc is the loops.v1 PoolService: the gateway's worker pools as an operator
// sees and changes them (list, show, scale, delete) and what each replica holds (its GPUs,
// state, address, incarnation, the training runs whose adapters it holds, GPU-seconds).
// It translates onto the backend's optional backends.PoolManager; a backend without it, or
// one that runs no pools, answers FailedPrecondition (reason NO_POOLS). Every call needs
// the operator role (auth.RequireOperator): PermissionDenied (reason OPERATOR_REQUIRED)
// otherwise. See docs/pools.md.
package poolsvc
