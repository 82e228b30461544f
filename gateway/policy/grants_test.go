package policy

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

// TestGrantsRaiseLimitsUntilTheyExpire: a grant allows its model, raises the sequence length
// and rank on that model only and the runs at once for the workspace; at its expiry (an
// injected clock) the policy's limits are back; another workspace is never touched. Every
// limit error names the limit, its value and the exact `loops access request` command, and
// is Final (the SDK does not retry it).
func TestGrantsRaiseLimitsUntilTheyExpire(t *testing.T) {
	p, err := Parse([]byte("default:\n  models: [a]\n  max_sequence_length: 16\n  max_lora_rank: 4\n  max_concurrent_runs: 1\n"))
	require.NoError(t, err)
	e, err := NewEnforcer(p, []string{"a", "b"})
	require.NoError(t, err)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e.SetClock(func() time.Time { return now })

	err = e.AllowModel("w", "b")
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err))
	require.Contains(t, err.Error(), `its policy allows a (models in its policy); ask a workspace admin for it: loops access request --model b --reason "..."`)
	require.True(t, errs.IsFinal(err))
	err = e.StartRun("w", "r0", "a", 8)
	require.Contains(t, err.Error(), `limit of 4 (max_lora_rank in its policy, on a): use a rank of at most 4, or ask a workspace admin for more: loops access request --model a --max-rank 8 --reason "..."`)
	require.NoError(t, e.StartRun("w", "r1", "a", 4))
	err = e.StartRun("w", "r2", "a", 4)
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	require.Contains(t, err.Error(), `(max_concurrent_runs in its policy, now 1): unload a run or end its session, then retry; or ask a workspace admin for more: loops access request --model a --runs 2 --reason "..."`)
	require.True(t, errs.IsFinal(err))
	err = e.CheckData("w", "a", []*loopsv1.Datum{{Tokens: make([]int32, 20)}})
	require.Contains(t, err.Error(), `limit of 16 (max_sequence_length in its policy, on a): truncate it, or ask a workspace admin for more: loops access request --model a --max-seq-len 20 --reason "..."`)

	e.SetGrants([]Grant{
		{Workspace: "w", Model: "b", MaxSequenceLength: 32, MaxLoraRank: 8, MaxConcurrentRuns: 2, Expires: now.Add(time.Hour)},
	})
	require.NoError(t, e.AllowModel("w", "b"))
	require.Error(t, e.AllowModel("other", "b"), "another workspace's grant changes nothing here")
	require.NoError(t, e.StartRun("w", "r2", "b", 8), "rank 8 and a second run on b")
	require.Error(t, e.StartRun("w", "r3", "a", 8), "the rank grant is b's only")
	require.NoError(t, e.CheckData("w", "b", []*loopsv1.Datum{{Tokens: make([]int32, 32)}}))
	require.Error(t, e.CheckData("w", "a", []*loopsv1.Datum{{Tokens: make([]int32, 20)}}), "the sequence grant is b's only")
	ms := e.Models("w", []*loopsv1.ModelInfo{{Name: "a", MaxSequenceLength: 64, MaxLoraRank: 32}, {Name: "b", MaxSequenceLength: 64, MaxLoraRank: 32}})
	require.Len(t, ms, 2)
	require.Equal(t, int32(16), ms[0].GetMaxSequenceLength())
	require.Equal(t, int32(32), ms[1].GetMaxSequenceLength())
	require.Equal(t, int32(8), ms[1].GetMaxLoraRank())
	require.Equal(t, 2, e.Limits("w").MaxConcurrentRuns)

	now = now.Add(time.Hour) // the grant expires: the policy's limits are back
	require.Error(t, e.AllowModel("w", "b"))
	require.Equal(t, 1, e.Limits("w").MaxConcurrentRuns)
	require.Len(t, e.Models("w", []*loopsv1.ModelInfo{{Name: "a"}, {Name: "b"}}), 1)
}

func TestAskCommand(t *testing.T) {
	require.Equal(t, `loops access request --model m --max-seq-len 9 --reason "..."`, AskCommand("m", flag("max-seq-len", 9)))
}

// TestFullFinetuneIsOffUntilAllowed: a run of LoRA rank 0 (full fine-tuning) is refused by
// default, with the exact access request and the policy key; allow_full_finetune allows it
// on every model, a grant with FullFinetune on its model only, until it expires.
func TestFullFinetuneIsOffUntilAllowed(t *testing.T) {
	p, err := Parse([]byte("default:\n  models: [a, b]\nworkspaces:\n  open:\n    allow_full_finetune: true\n"))
	require.NoError(t, err)
	e, err := NewEnforcer(p, []string{"a", "b"})
	require.NoError(t, err)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e.SetClock(func() time.Time { return now })

	err = e.StartRun("w", "r1", "a", 0)
	code, reason := codeReason(t, err)
	require.Equal(t, connect.CodePermissionDenied, code)
	require.Equal(t, ReasonFullFinetuneNotAllowed, reason)
	require.True(t, errs.IsFinal(err))
	require.Equal(t, `workspace "w" may not start full fine-tuning runs (LoRA rank 0) on a: allow_full_finetune is off in its policy (the default); `+
		`give a LoRA rank of at least 1, or ask a workspace admin for it: loops access request --model a --full-finetune --reason "..." `+
		`(an operator may instead set allow_full_finetune: true in the workspace's section of the policy file, loops serve --workspace-policy FILE)`, errs.Message(err))
	require.NoError(t, e.StartRun("w", "r2", "a", 8)) // LoRA runs are not concerned
	require.NoError(t, e.StartRun("open", "r3", "b", 0))
	require.True(t, e.ModelLimits("open", "a").AllowFullFinetune)

	e.SetGrants([]Grant{{Workspace: "w", Model: "a", FullFinetune: true, Expires: now.Add(time.Hour)}})
	require.NoError(t, e.StartRun("w", "r4", "a", 0))
	require.Error(t, e.StartRun("w", "r5", "b", 0), "the grant is for model a only")
	now = now.Add(2 * time.Hour)
	require.Error(t, e.StartRun("w", "r6", "a", 0), "the grant expired")

	_, err = Parse([]byte("default:\n  allow_full_finetune: 3\n"))
	require.Error(t, err)
}
