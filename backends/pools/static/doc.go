// Package static is the pools.Provider for workers started by someone else at addresses
// given in configuration (a development fallback: nothing is started or restarted). It
// probes each address and announces the live ones in the Registry, so the backend discovers
// them as it discovers registered workers; a worker that stops answering, or answers
// NOT_SERVING on its grpc.health.v1 service (pools.Probe), is lost, and when it serves
// again it is a new incarnation (its adapters are presumed gone).
package static
