package policy

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/stretchr/testify/require"
)

const example = `
# comment
default:
  models: ["loops/*"]
  max_sequence_length: 256
  max_concurrent_runs: 4
workspaces:
  team-a:
    models: [loops/tiny]
    max_lora_rank: 8
    max_concurrent_runs: 0
  team-b:
    sampling_concurrency: 2
`

func TestParseInheritsFromDefault(t *testing.T) {
	p, err := Parse([]byte(example))
	require.NoError(t, err)
	require.Equal(t, Limits{Models: []string{"loops/*"}, MaxSequenceLength: 256, MaxConcurrentRuns: 4}, p.For("someone-else"))
	require.Equal(t, Limits{Models: []string{"loops/tiny"}, MaxSequenceLength: 256, MaxLoraRank: 8}, p.For("team-a"),
		"0 overrides the default's limit with none; left-out keys are inherited")
	require.Equal(t, Limits{Models: []string{"loops/*"}, MaxSequenceLength: 256, MaxConcurrentRuns: 4, SamplingConcurrency: 2}, p.For("team-b"))
	require.Equal(t, []string{"team-a", "team-b"}, p.Workspaces())

	// JSON is YAML too.
	j, err := Parse([]byte(`{"workspaces":{"w":{"max_queued_operations":3}}}`))
	require.NoError(t, err)
	require.Equal(t, Limits{MaxQueuedOperations: 3}, j.For("w"))
	require.Equal(t, Limits{}, j.For("x"))

	// Budgets, as strings or numbers, inherited like the rest.
	b, err := Parse([]byte("default: {budget_usd_month: 250}\nworkspaces:\n  w: {budget_usd_total: \"1000.5\"}\n"))
	require.NoError(t, err)
	require.Equal(t, Limits{BudgetMonth: 250_000_000_000_000, BudgetTotal: 1000_500_000_000_000}, b.For("w"))
	require.Equal(t, Limits{BudgetMonth: 250_000_000_000_000}, b.For("x"))

	// No file: no limits.
	var none *Policy
	require.Equal(t, Limits{}, none.For("w"))
	require.Equal(t, Limits{}, Default().For("w"))
}

func TestParseErrors(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"unknown key":          {"default:\n  max_seq_len: 5\n", `unknown field "max_seq_len"`},
		"unknown top key":      {"defaults: {}\n", `unknown field "defaults"`},
		"not yaml":             {"default: [\n", "yaml"},
		"wrong type":           {"default:\n  max_lora_rank: many\n", "max_lora_rank"},
		"negative":             {"workspaces:\n  w:\n    max_concurrent_runs: -1\n", "workspaces.w.max_concurrent_runs is -1: use a positive limit, or 0"},
		"too large":            {"default:\n  max_queued_operations: 9999999999\n", "default.max_queued_operations"},
		"empty models":         {"workspaces:\n  w:\n    models: []\n", "workspaces.w.models is empty"},
		"empty model entry":    {"default:\n  models: ['']\n", "default.models has an empty entry"},
		"bad pattern":          {"default:\n  models: ['loops/[']\n", "not a valid pattern"},
		"bad workspace name":   {"workspaces:\n  'a b':\n    max_lora_rank: 4\n", `"a b" is not a workspace name`},
		"workspace name slash": {"workspaces:\n  ../x: {}\n", `"../x" is not a workspace name`},
		"negative budget":      {"workspaces:\n  w: {budget_usd_month: -5}\n", "workspaces.w.budget_usd_month: a budget may not be negative"},
		"budget not money":     {"default: {budget_usd_total: \"lots\"}\n", "invalid number literal"},
		"budget too precise":   {"default: {budget_usd_total: \"0.0000001\"}\n", "more than 6 decimal places"},
		"unknown modality":     {"default: {allowed_modalities: [text, video]}\n", `default.allowed_modalities has "video": use text or image`},
		"modalities sans text": {"workspaces:\n  w: {allowed_modalities: [image]}\n", "workspaces.w.allowed_modalities must list text"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in))
			require.ErrorContains(t, err, tc.want)
		})
	}

	log := slog.New(slog.DiscardHandler)
	_, err := Watch(filepath.Join(t.TempDir(), "missing.yaml"), log)
	require.ErrorContains(t, err, "workspace policy")
	f := filepath.Join(t.TempDir(), "p.yaml")
	require.NoError(t, os.WriteFile(f, []byte("default:\n  max_lora_rank: -2\n"), 0o600))
	_, err = Watch(f, log)
	require.ErrorContains(t, err, f)
	require.ErrorContains(t, err, "default.max_lora_rank is -2")
}

func TestCheckModelsAgainstServed(t *testing.T) {
	p, err := Parse([]byte("workspaces:\n  w:\n    models: [loops/tiny, Qwen/*]\n"))
	require.NoError(t, err)
	_, err = NewEnforcer(p, []string{"loops/tiny"})
	require.ErrorContains(t, err, `workspaces.w.models has "Qwen/*", which matches no model this server serves (loops/tiny)`)
	_, err = NewEnforcer(p, []string{"loops/tiny", "Qwen/Qwen3-8B"})
	require.NoError(t, err)
	_, err = NewEnforcer(nil, []string{"loops/tiny"})
	require.NoError(t, err)
}

// TestSetPolicy: a policy put in force while the gateway runs (an operator reloaded it)
// applies to the next check, a workspace's budget included; what was counted before stays
// counted; one naming a model the gateway does not serve is refused and the one in force
// kept; nil is the default policy.
func TestSetPolicy(t *testing.T) {
	before, err := Parse([]byte("workspaces:\n  w: {max_concurrent_runs: 1, budget_usd_total: \"0.075\"}\n"))
	require.NoError(t, err)
	e, err := NewEnforcer(before, []string{"loops/tiny"})
	require.NoError(t, err)
	require.NoError(t, e.StartRun("w", "r1", "loops/tiny", 4))
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(e.StartRun("w", "r2", "loops/tiny", 4)))
	require.Equal(t, "0.075", e.Limits("w").BudgetTotal.String())

	after, err := Parse([]byte("workspaces:\n  w: {max_concurrent_runs: 2, budget_usd_total: \"1\"}\n"))
	require.NoError(t, err)
	require.NoError(t, e.SetPolicy(after))
	require.Equal(t, "1", e.Limits("w").BudgetTotal.String(), "the budget raised")
	require.Equal(t, 1, e.Use("w").LiveRuns, "the live run still counted")
	require.NoError(t, e.StartRun("w", "r2", "loops/tiny", 4))
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(e.StartRun("w", "r3", "loops/tiny", 4)))

	bad, err := Parse([]byte("workspaces:\n  w: {models: [Qwen/*]}\n"))
	require.NoError(t, err)
	require.ErrorContains(t, e.SetPolicy(bad), "matches no model this server serves")
	require.Equal(t, "1", e.Limits("w").BudgetTotal.String(), "the policy in force kept")

	require.NoError(t, e.SetPolicy(nil))
	require.Zero(t, e.Limits("w").BudgetTotal, "the default policy has no budget")
	require.NoError(t, (*Enforcer)(nil).SetPolicy(after))
}

func codeReason(t *testing.T, err error) (connect.Code, string) {
	t.Helper()
	require.Error(t, err)
	return connect.CodeOf(err), errs.Reason(err)
}

func TestEnforcerChecks(t *testing.T) {
	p, err := Parse([]byte(`
default: {models: [a]}
workspaces:
  w: {models: [a, "b*"], max_sequence_length: 8, max_lora_rank: 4, max_concurrent_runs: 1, max_queued_operations: 2}
`))
	require.NoError(t, err)
	e, err := NewEnforcer(p, []string{"a", "b1", "c"})
	require.NoError(t, err)

	// Models.
	require.NoError(t, e.AllowModel("w", "b1"))
	err = e.AllowModel("w", "c")
	code, reason := codeReason(t, err)
	require.Equal(t, connect.CodePermissionDenied, code)
	require.Equal(t, ReasonModelNotAllowed, reason)
	require.ErrorContains(t, err, `workspace "w" may not use base model "c": its policy allows a, b1`)
	models := e.Models("w", []*loopsv1.ModelInfo{{Name: "a", MaxSequenceLength: 100, MaxLoraRank: 2}, {Name: "b1", MaxSequenceLength: 4, MaxLoraRank: 64}, {Name: "c"}})
	require.Len(t, models, 2)
	require.Equal(t, int32(8), models[0].GetMaxSequenceLength())
	require.Equal(t, int32(2), models[0].GetMaxLoraRank())
	require.Equal(t, int32(4), models[1].GetMaxSequenceLength())
	require.Equal(t, int32(4), models[1].GetMaxLoraRank())
	require.Len(t, e.Models("other", []*loopsv1.ModelInfo{{Name: "a"}, {Name: "b1"}}), 1)

	// Runs: model, rank, then the live-run cap.
	code, _ = codeReason(t, e.StartRun("w", "r0", "c", 1))
	require.Equal(t, connect.CodePermissionDenied, code)
	err = e.StartRun("w", "r0", "a", 5)
	code, reason = codeReason(t, err)
	require.Equal(t, connect.CodeInvalidArgument, code)
	require.Equal(t, ReasonWorkspaceLimit, reason)
	require.ErrorContains(t, err, `LoRA rank 5 is over workspace "w"'s limit of 4 (max_lora_rank`)
	require.NoError(t, e.StartRun("w", "r1", "a", 4))
	require.NoError(t, e.StartRun("w", "r1", "a", 4), "starting a live run again is a no-op")
	err = e.StartRun("w", "r2", "a", 4)
	code, _ = codeReason(t, err)
	require.Equal(t, connect.CodeResourceExhausted, code)
	require.ErrorContains(t, err, `workspace "w" has 1 training runs live, its limit (max_concurrent_runs`)
	require.NoError(t, e.StartRun("other", "r3", "a", 64), "another workspace has its own count")
	e.EndRun("r1")
	e.EndRun("r1")
	require.NoError(t, e.StartRun("w", "r2", "a", 4))
	require.Equal(t, Use{LiveRuns: 1}, e.Use("w"))

	// Queue: creates and unloads always pass, the rest stop at the cap.
	fb := loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD
	require.NoError(t, e.StartOp("w", "o1", fb))
	require.NoError(t, e.StartOp("w", "o2", loopsv1.OperationKind_OPERATION_KIND_SAMPLE))
	err = e.StartOp("w", "o3", fb)
	code, reason = codeReason(t, err)
	require.Equal(t, connect.CodeResourceExhausted, code)
	require.Equal(t, errs.ReasonQueueFull, reason)
	require.ErrorContains(t, err, `workspace "w" has 2 operations queued or running, its limit (max_queued_operations`)
	require.NoError(t, e.StartOp("w", "o4", loopsv1.OperationKind_OPERATION_KIND_UNLOAD_TRAINING_RUN))
	require.Equal(t, Use{LiveRuns: 1, QueuedOperations: 3}, e.Use("w"))
	e.EndRun("r2")
	code, _ = codeReason(t, e.StartRun("w", "r4", "a", 1))
	require.Equal(t, connect.CodeResourceExhausted, code, "a new run needs room in the queue for its create")
	for _, id := range []string{"o1", "o2", "o4", "o4", "nope"} {
		e.EndOp(id)
	}
	require.Equal(t, Use{}, e.Use("w"))
	e.EndRun("r3")
	require.Zero(t, e.tracked(), "idle workspaces are dropped from the counters")

	// Sequence lengths.
	d := func(n int) *loopsv1.Datum { return &loopsv1.Datum{Tokens: make([]int32, n)} }
	require.NoError(t, e.CheckData("w", "a", []*loopsv1.Datum{d(8)}))
	err = e.CheckData("w", "a", []*loopsv1.Datum{d(3), d(9)})
	code, _ = codeReason(t, err)
	require.Equal(t, connect.CodeInvalidArgument, code)
	require.ErrorContains(t, err, `datum 1: sequence of 9 tokens is over workspace "w"'s limit of 8 (max_sequence_length`)
	code, _ = codeReason(t, e.CheckData("w", "c", []*loopsv1.Datum{d(1)}))
	require.Equal(t, connect.CodePermissionDenied, code)
	require.NoError(t, e.CheckData("other", "a", []*loopsv1.Datum{d(1000)}))

	sample := func(prompt, maxTokens int32, filled int32) (*loopsv1.SamplingParams, error) {
		req := &loopsv1.SampleRequest{Prompt: make([]int32, prompt), Params: &loopsv1.SamplingParams{MaxTokens: maxTokens}}
		params := &loopsv1.SamplingParams{MaxTokens: filled}
		return params, e.CheckSample("w", "a", req, params)
	}
	params, err := sample(3, 0, 1024)
	require.NoError(t, err)
	require.Equal(t, int32(5), params.GetMaxTokens(), "a defaulted max_tokens is lowered to fit")
	_, err = sample(3, 5, 5)
	require.NoError(t, err)
	_, err = sample(3, 6, 6)
	require.ErrorContains(t, err, `prompt (3 tokens) + max_tokens (6) is over workspace "w"'s limit of 8 tokens`)
	_, err = sample(8, 0, 1)
	require.ErrorContains(t, err, `prompt of 8 tokens leaves no room under workspace "w"'s limit of 8 tokens`)
	// An embedding generates nothing: its input may fill the limit, not pass it.
	embed := func(n int) error {
		return e.CheckSample("w", "a", &loopsv1.SampleRequest{Prompt: make([]int32, n), Embed: true}, &loopsv1.SamplingParams{})
	}
	require.NoError(t, embed(8))
	require.ErrorContains(t, embed(9), `input of 9 tokens is over workspace "w"'s limit of 8 tokens`)
}

func TestNilEnforcerEnforcesNothing(t *testing.T) {
	var e *Enforcer
	require.NoError(t, e.StartRun("w", "r", "m", 1000))
	require.NoError(t, e.StartOp("w", "o", 0))
	require.NoError(t, e.CheckData("w", "m", nil))
	e.EndRun("r")
	e.EndOp("o")
	e.AcquireSample(t.Context(), "w")()
	require.Equal(t, Use{}, e.Use("w"))
}

func TestSamplingConcurrencyQueues(t *testing.T) {
	p, err := Parse([]byte("workspaces:\n  w: {sampling_concurrency: 2}\n"))
	require.NoError(t, err)
	e, err := NewEnforcer(p, nil)
	require.NoError(t, err)
	ctx := t.Context()

	r1, r2 := e.AcquireSample(ctx, "w"), e.AcquireSample(ctx, "w")
	e.AcquireSample(ctx, "other")() // no limit there
	require.Equal(t, Use{RunningSamples: 2}, e.Use("w"))

	// A third waits until a slot is given back, in arrival order.
	got := make(chan int, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel := e.AcquireSample(ctx, "w")
			got <- i
			rel()
		}()
		require.Eventually(t, func() bool { return e.Use("w").WaitingSamples == i+1 }, 5*time.Second, time.Millisecond)
	}
	select {
	case <-got:
		t.Fatal("a sample ran over the workspace's sampling_concurrency")
	case <-time.After(50 * time.Millisecond):
	}
	r1()
	r1() // releasing twice gives back one slot
	require.Equal(t, 0, <-got)
	r2()
	require.Equal(t, 1, <-got)
	wg.Wait()
	require.Equal(t, Use{}, e.Use("w"))
	require.Zero(t, e.tracked())

	// A waiter whose context ends leaves the queue.
	hold := e.AcquireSample(ctx, "w")
	hold2 := e.AcquireSample(ctx, "w")
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		e.AcquireSample(cctx, "w")()
		close(done)
	}()
	require.Eventually(t, func() bool { return e.Use("w").WaitingSamples == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	<-done
	require.Equal(t, Use{RunningSamples: 2}, e.Use("w"))
	hold()
	hold2()
	require.Zero(t, e.tracked())
}

// TestAllowedModalities: allowed_modalities is inherited like every key; an image from a
// workspace that leaves image out is PermissionDenied (MODALITY_NOT_ALLOWED) naming the key,
// in CheckData and AllowModality, and its catalog lists only the modalities it may send and
// the availability its dedicated key allows.
func TestAllowedModalities(t *testing.T) {
	p, err := Parse([]byte(`
default:
  allowed_modalities: [text]
workspaces:
  vis: {allowed_modalities: [text, image], dedicated: "off"}
  solo: {dedicated: always}
`))
	require.NoError(t, err)
	e, err := NewEnforcer(p, []string{"m"})
	require.NoError(t, err)
	require.NoError(t, e.AllowModality("vis", ModalityImage, "x"))
	require.NoError(t, e.AllowModality("other", ModalityText, "x"))
	err = e.AllowModality("other", ModalityImage, "an image part")
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err))
	require.Equal(t, ReasonModalityNotAllowed, errs.Reason(err))
	require.ErrorContains(t, err, `workspace "other" may not send image input (an image part): its policy allows text input only (allowed_modalities in its workspace policy)`)

	img := &loopsv1.Datum{Tokens: []int32{1, 0}, Images: []*loopsv1.Image{{Offset: 1, Tokens: 1}}}
	err = e.CheckData("solo", "m", []*loopsv1.Datum{{Tokens: []int32{1}}, img})
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err))
	require.ErrorContains(t, err, "(datum 1 has image chunks)")
	require.NoError(t, e.CheckData("vis", "m", []*loopsv1.Datum{img}))
	require.NoError(t, e.CheckData("solo", "m", []*loopsv1.Datum{{Tokens: []int32{1}}}))

	m := &loopsv1.ModelInfo{Name: "m", Modalities: []string{"text", "image"}, Trainable: true, Sampleable: true,
		Availability: []string{AvailabilityServerless, AvailabilityDedicated}}
	view := func(ws string) *loopsv1.ModelInfo { return e.Models(ws, []*loopsv1.ModelInfo{m})[0] }
	require.Equal(t, []string{"text"}, view("other").GetModalities())
	require.Equal(t, []string{"text", "image"}, view("vis").GetModalities())
	require.Equal(t, []string{AvailabilityServerless}, view("vis").GetAvailability())
	require.Equal(t, []string{AvailabilityDedicated}, view("solo").GetAvailability())
	require.True(t, view("solo").GetTrainable())
	require.Equal(t, []string{"text", "image"}, m.GetModalities(), "the served entry is not changed")
	text := &loopsv1.ModelInfo{Name: "m", Trainable: true, Availability: []string{AvailabilityServerless}}
	require.False(t, e.Models("solo", []*loopsv1.ModelInfo{text})[0].GetTrainable(), "dedicated always without dedicated pools: no run can be created")
}
