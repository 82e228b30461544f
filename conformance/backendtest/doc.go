// Package backendtest is the backend contract suite: every Loops backend (the embedded
// reference engine, the PyTorch worker through its gRPC client, ...) runs it from its own
// _test.go and must pass it. It checks the semantics of DESIGN.md ("Semantics every backend
// implements") against an independent float64 oracle (package conformance/oracle) that
// reads the same model folder and the adapter folders the backend saves.
//
// # Use
//
//	func TestConformance(t *testing.T) {
//		backendtest.Run(t, func(t *testing.T) backends.Backend {
//			b, err := mybackend.New(...) // serving "loops/tiny" from modelDir
//			require.NoError(t, err)
//			return b
//		}, backendtest.Options{
//			ModelName:    "loops/tiny",
//			ModelDir:     modelDir,
//			KnownFailing: "../../conformance/backendtest/known_failing/mybackend.txt",
//		})
//	}
//
// The factory is called once per case and the suite closes what it returns; a factory may
// hand out one shared backend instead (every case uses adapter ids of its own and deletes
// them). Each case is a subtest with a stable name such as "loss/ppo/clip_config"; run one
// group with -run 'TestConformance/sample/'. Cases write adapter folders under t.TempDir,
// so a remote backend must see the same file system (as the gateway's checkpoint folders).
//
// # Known failures
//
// Options.KnownFailing names a file of lines "pattern  # reason" (blank lines and #
// comments are ignored). A pattern is matched with path.Match against the case name and
// each of its parent groups, so "sample/*" covers "sample/stop/token". A matching case
// that fails is reported as skipped with its reason (its failures are logged); a matching
// case that passes fails the run, and so does a pattern that matches no case, so the file
// never goes stale (as in connectrpc/conformance). Files live in known_failing/<backend>.txt.
//
// # How values are checked
//
//   - Outputs: logprobs and elementwise_loss of every datum and loss:sum, for each loss and
//     config key, are compared with the oracle on an adapter the backend trained one step
//     (so B ≠ 0 and LoRA matters) and saved; the oracle loads that folder.
//   - Gradients: the suite cannot see a backend's gradient directly, so it reads it with a
//     probe step: AdamW with lr 1, eps 1 and weight decay 0 moves each weight by
//     −g/(|g|+1) on the first step after a load without optimizer state, which it inverts.
//     That gradient is compared with central finite differences of the oracle along itself,
//     along a random direction and at the largest coordinate of a few tensors. (Finite
//     differences are taken of Σ c·lp with c the loss derivative at the point, which is
//     the gradient for smooth losses and honours cispo's and gspo's stop-gradients.)
//   - Optimizer: every weight after one or two steps is compared with oracle AdamW
//     (torch.optim.AdamW order: global-norm clip, decoupled decay, bias-corrected update)
//     applied to the backend's probe-read gradients, for each AdamParams field.
//   - Sampling: greedy (temperature 0, top_k 1, tiny top_p) equals the oracle's argmax
//     continuation; sampled tokens' logprobs equal the oracle's log softmax(logits/T) of the
//     token; prompt logprobs and top-k prompt logprobs at temperature 1 equal the oracle's.
//
// # Tolerances
//
// A float32 backend is compared with the float64 oracle: 1e-4 absolute on every
// log-probability (Options.LogprobTolerance), 1e-4 relative (floor 1) on losses,
// GradientTolerance (2e-3) on gradients relative to their norm or coordinate, and 1e-7 +
// UpdateTolerance·lr on weights after optimizer steps. Exact-equality checks (same seed,
// snapshot isolation, adapter isolation, checkpoint resume within 1e-7) compare a backend
// with itself. Run logs the largest error measured for each quantity. The reference engine
// measures about 1e-6 on log-probs, 3e-6 on gradients and 1e-5·lr on updates.
//
// # Decisions the suite encodes
//
// Beyond DESIGN.md, the suite pins these choices (each also documented by the reference
// engine): dro's beta defaults to 0.05 (case loss/dro/default_beta); 2-D (N, K)
// cross-entropy targets give logprobs of shape (N, K) and elementwise_loss (N,) summed over
// K; the model's EOS ids (config.json and generation_config.json eos_token_id) end a
// sampled sequence like stop tokens; the first row of top-k prompt logprobs is empty
// (token 0, logprob −99999); at temperature 0 only the tokens are checked, not the
// logprobs; loading an adapter without optimizer state restarts Adam at step 0; bad input
// fails the item with InvalidArgument (3) and an unknown adapter with NotFound (5).
package backendtest
