// Package replicaplan is the arithmetic of how many devices a replica of a served model
// needs and how long a sequence a replica of a given size can train on: the one
// implementation the gateway (loops serve, the catalog, loops models) uses.
//
// A replica shards the frozen weights over its devices (FSDP2, as the torch worker's
// N-rank replicas do) and replicates the LoRA state (fp32 weights, gradients and Adam's
// two moments) on each; each device runs whole sequences, so a sequence's activations
// (checkpointed decoder layers, one layer recomputed at a time, flash-style attention)
// and the loss head's chunk of logits sit on one device.
// docs/scale-out.md writes the formulas out.
package replicaplan
