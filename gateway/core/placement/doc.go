// Package placement places the sampler replicas that deployments ask for
// (docs/deployments.md): a Placer keeps, per base model, the replicas each deployment wants,
// and has the backend (backends.SamplerScaler: the worker backend in pool mode) scale the
// model's pool to the most any of them asks for, on a goroutine of its own, so that creating
// or deleting a deployment never waits for the backend. A deployment shows what was placed
// for it (Placer.View).
package placement
