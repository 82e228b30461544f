// Package pools places Loops workers in pools and tells the gateway where they are.
//
// A pool is N replicas of one role (trainer or sampler) for one base model, each replica
// holding GPUsPerReplica GPUs. A Provider starts and stops replicas (EnsurePool, ScalePool,
// DeletePool) and reports what happens to them (Watch): the local provider (package
// pools/local) runs worker processes on this host, static (pools/static) takes addresses
// from configuration, ray (pools/ray) submits a pool driver to a Ray cluster through the Ray
// Jobs REST API. Every provider passes the contract suite in pools/poolstest.
//
// Discovery is the same whoever launched a worker: it registers with the Registry (the
// loops.backend.v1 RegistryService, served by the gateway) with its pool, replica, address,
// capabilities and an incarnation id, authenticated by a join token, over TLS only (the
// Registry's certificate is the gateway's, package mtls), then holds a heartbeat stream.
// The workers themselves serve mutual TLS with credentials the gateway issues (package
// mtls): each provider hands its workers theirs. A missed heartbeat marks the replica lost; a new incarnation of a replica means its
// state (the adapters it held) is gone, and the runs bound to it recover by reloading their
// last checkpoint (the backend answers NotFound for their adapters).
//
// The package lives under backends/ because pools are how a backend's workers come to
// exist: the torch backend (backends/worker) consumes the Registry's membership; the gateway
// core knows nothing of pools.
package pools
