// Package static is the pools.Provider for workers started by someone else at addresses
// given in configuration (a development fallback: nothing is started or restarted). It
// probes each address and announces the live ones in the Registry, so the backend discovers
// them as it discovers registered workers; a worker that stops answering is lost, and when it
// answers again it is a new incarnation (its adapters are presumed gone).
package static
