// Package fairness measures how the scheduler shares one base model between workspaces:
// a light tenant's forward_backward latency alone and under another tenant's flood, and
// Jain's fairness index over equal tenants. See README.md; run with LOOPS_BENCH=1.
package fairness
