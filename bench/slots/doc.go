// Package slots holds the adapter-slot benchmark (issue 9, item 4): what it costs to move a
// training run's adapter out of its trainer slot with its complete training state (weights,
// Adam moments and step, accumulated gradient) and back, next to one forward_backward of the
// same run. Run with
//
//	go run ./bench/slots/cmd/slotbench -model loops/tiny
//
// Figures are recorded in README.md in this folder.
package slots
