// Package ray is the pools.Provider that runs pools on a Ray cluster. It drives the cluster
// through the Ray Jobs REST API of the dashboard (POST /api/jobs/, GET /api/jobs/{id},
// GET /api/jobs/{id}/logs, POST /api/jobs/{id}/stop, DELETE /api/jobs/{id}; Client), with
// one job per pool: the pool driver (python -m loops_worker.ray_pool, in backends/torch)
// reserves a placement group per replica, starts a worker actor in each (restarted by Ray
// when it dies), and follows the pool's desired size from the gateway's Registry
// (WatchPool). The workers register with the Registry like any other, so the backend finds
// them the same way.
//
// A driver job that ends while its pool should exist is submitted again (with back-off).
// The dashboard has no authentication of its own: keep it on a private network or behind an
// authenticating proxy (Options.Header carries a token for such a proxy).
package ray
