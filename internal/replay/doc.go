// Package replay runs a training run again from its receipt (docs/receipts.md): through
// the loops.v1 API, as the run owner's own work (so through admission, policy and the fair
// queue like any other run), it creates a fresh run with the same base model and LoRA
// config (seed included), sends the recorded batches and optimizer steps in their order,
// and reports the first step whose loss differs from the recorded one, bit for bit.
package replay
