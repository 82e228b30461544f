// Package poolstest is the contract suite every pools.Provider passes (Run; a provider that
// is also a pools.SpecReader has its specs checked too), and a fake worker that registers
// and heartbeats like the real one (FakeWorker, and FakeWorkerMain for providers that start
// processes: a test binary re-executes itself as the worker).
package poolstest
