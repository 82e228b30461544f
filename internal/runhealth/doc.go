// Package runhealth is the one definition of the alerts Loops raises on a training run's
// step metrics (loops.v1 StepMetrics, recorded by the core for every forward_backward and
// optim_step): an RL run drifting off-policy (kl_sample_train above KLSampleTrainMax), an
// RL run with no learning signal (zero-advantage share at or above ZeroAdvantageMin over
// the last ZeroAdvantageWindow records), and a loss or gradient norm that is NaN or
// infinite. `loops runs show` and the web console (gateway/console) both call Check, so
// the CLI and the browser flag the same runs for the same reasons.
//
// The rules read only what the server already recorded; they are pure functions of a
// series of records, tested against crafted series.
package runhealth
