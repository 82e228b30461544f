// Package receipt holds what a training run's receipt (docs/receipts.md) is made of that
// more than one part of Loops computes: the canonical encoding of a forward_backward batch
// and its hash (loops-batch-v1), the stored form of a recorded batch and its decoder, the
// revision of a base model's files, and the client named by a request's headers.
package receipt
