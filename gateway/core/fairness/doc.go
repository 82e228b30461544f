// Package fairness watches how fairly the scheduler shares the server, live: for every
// operation it is told of (Tracker.Observe) it records the workspace's queue wait (from
// submission until the work started) and its latency inflation (time from submission to
// the end, over the operation's own service time: how much the others slowed it), and it
// exports them to Prometheus with a service-level objective an operator sets (the p99
// inflation a workspace may see, e.g. 3×):
//
//	loops_queue_wait_seconds{workspace,kind}          histogram
//	loops_latency_inflation{workspace,kind}           histogram (latency ÷ service time)
//	loops_fairness_p99_inflation{workspace}           gauge, over the window
//	loops_fairness_slo_target                         gauge, the target (0: none)
//	loops_fairness_slo_breached{workspace}            gauge, 1 while the p99 is over it
//	loops_fairness_jain_index                         gauge, over the active workspaces
//
// The window is the last Window (5 min) of operations; a workspace with none in it leaves.
// Jain's index is (Σx)²/(n·Σx²) over the active workspaces' x = 1 / mean inflation: 1 when
// every workspace is slowed alike, 1/n when one is slowed and the others are not.
package fairness
