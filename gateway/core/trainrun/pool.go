package trainrun

// pool is a run's dedicated pool ("" for the shared pools), its replicas (trainers and
// samplers: the most it runs at once), its GPUs per replica and their kind, and the
// replica-seconds already metered.
type pool struct {
	name, gpuKind  string
	replicas, gpus int
	metered        int64
}

// SetPool binds a dedicated pool of replicas replicas to the run.
func (r *Run[O]) SetPool(name string, replicas, gpusPerReplica int, gpuKind string) {
	r.mu.Lock()
	r.pool = pool{name: name, replicas: replicas, gpus: gpusPerReplica, gpuKind: gpuKind}
	r.mu.Unlock()
}

// PoolShape is the run's dedicated pool's replicas, GPUs per replica and GPU kind.
func (r *Run[O]) PoolShape() (replicas, gpusPerReplica int, gpuKind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pool.replicas, r.pool.gpus, r.pool.gpuKind
}

// PoolGPUKind is the kind of GPU of the run's dedicated pool ("" unnamed or none).
func (r *Run[O]) PoolGPUKind() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pool.gpuKind
}

// Pool is the run's dedicated pool ("" for the shared pools).
func (r *Run[O]) Pool() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pool.name
}

// ClearPool unbinds the run's dedicated pool.
func (r *Run[O]) ClearPool() {
	r.mu.Lock()
	r.pool = pool{}
	r.mu.Unlock()
}

// MeterPool takes the pool's replica-seconds so far (total, whole seconds) and returns
// what is new since the last call, with the pool's GPUs per replica.
func (r *Run[O]) MeterPool(total int64) (delta int64, gpus int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delta = total - r.pool.metered
	if delta <= 0 {
		return 0, r.pool.gpus
	}
	r.pool.metered += delta
	return delta, r.pool.gpus
}
