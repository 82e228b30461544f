// Package fairness measures how the scheduler shares one base model between workspaces: a
// light tenant's forward_backward and sampling latency alone and under another tenant's
// flood, Jain's fairness index over equal tenants (and, for sampling, over tenants of
// unequal demand), and forward_backward throughput with 1, 8 and 64 runs batched against
// the same work run one after another. See README.md; run with LOOPS_BENCH=1.
package fairness
