package compat

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/testing/protocmp"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/semantics"
)

// TestDefaultsAreTheCores checks that the Tinker routes fill what a Tinker request omits
// with the same defaults that loops.v1 zeros mean, and leave the limits to the core.
func TestDefaultsAreTheCores(t *testing.T) {
	e := newEnv(t)
	sid, run := e.newRun()

	// adam_params with only a learning rate: beta1, beta2 and eps are what an AdamParams with
	// zeros there means on loops.v1 (and in every backend).
	r := e.postJSON("/api/v1/optim_step", fmt.Sprintf(`{"adam_params":{"learning_rate":0.01},"model_id":%q,"seq_id":1}`, run))
	require.Equal(t, 200, r.status, string(r.body))
	want := semantics.AdamWithDefaults(&loopsv1.AdamParams{LearningRate: 0.01})
	require.Empty(t, cmp.Diff(want, e.core.lastReq("OptimStep").(*loopsv1.OptimStepRequest).GetAdam(), protocmp.Transform()))
	r = e.postJSON("/api/v1/optim_step", fmt.Sprintf(`{"adam_params":{},"model_id":%q,"seq_id":2}`, run))
	require.Equal(t, 200, r.status, string(r.body))
	require.InDelta(t, semantics.DefaultLearningRate, e.core.lastReq("OptimStep").(*loopsv1.OptimStepRequest).GetAdam().GetLearningRate(), 0)

	// num_samples over the cap reaches the core, which alone refuses it (with the cap
	// loops.v1 names), rather than a second cap of compat's own.
	r = e.postJSON("/api/v1/create_sampling_session", fmt.Sprintf(`{"session_id":%q,"sampling_session_seq_id":1,"base_model":"m"}`, sid))
	require.Equal(t, 200, r.status, string(r.body))
	smp := r.json(t)["sampling_session_id"].(string)
	for _, n := range []int64{semantics.MaxNumSamples + 1, 1 << 20} {
		r = e.postJSON("/api/v1/asample", fmt.Sprintf(`{"num_samples":%d,"prompt":{"chunks":[{"tokens":[1],"type":"encoded_text"}]},"sampling_params":{},"sampling_session_id":%q,"seq_id":%d}`, n, smp, n))
		require.Equal(t, 200, r.status, string(r.body)) // the fake core applies no cap
		require.Equal(t, int32(n), e.core.lastReq("Sample").(*loopsv1.SampleRequest).GetNumSamples())
	}
}
