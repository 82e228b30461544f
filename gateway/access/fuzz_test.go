package access_test

import (
	"testing"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/access"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// FuzzValidateRequest decodes RequestAccess and GrantAccessRequest bodies as the wire gives
// them (JSON as REST and Connect send it, or binary protobuf) and validates them: never a
// panic, every refusal InvalidArgument, and what is accepted is within the documented
// bounds.
func FuzzValidateRequest(f *testing.F) {
	f.Add([]byte(`{"amounts":{"model":"loops/tiny","max_sequence_length":4096},"reason":"longer documents"}`))
	f.Add([]byte(`{"amounts":{"model":"m","max_lora_rank":-3},"reason":"x"}`))
	f.Add([]byte(`{"amounts":{"model":"m\u0000"},"reason":"x"}`))
	f.Add([]byte(`{"id":"acr-0011223344556677","amounts":{"model":"m","max_concurrent_runs":4},"duration_seconds":3600}`))
	f.Add([]byte(`{"id":"acr-1","duration_seconds":-1}`))
	b, _ := proto.Marshal(&loopsv1.RequestAccessRequest{Amounts: &loopsv1.AccessAmounts{Model: "m", MaxConcurrentRuns: 2}, Reason: "r"})
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		var req loopsv1.RequestAccessRequest
		if protojson.Unmarshal(data, &req) == nil || proto.Unmarshal(data, &req) == nil {
			err := access.ValidateRequest(&req)
			if err != nil {
				require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), err.Error())
			} else {
				a := req.GetAmounts()
				require.NotEmpty(t, a.GetModel())
				require.LessOrEqual(t, len(a.GetModel()), access.MaxModelBytes)
				require.True(t, utf8.ValidString(a.GetModel()) && utf8.ValidString(req.GetReason()))
				require.NotEmpty(t, req.GetReason())
				require.LessOrEqual(t, len(req.GetReason()), access.MaxReasonBytes)
				require.True(t, a.GetMaxSequenceLength() >= 0 && a.GetMaxLoraRank() >= 0)
				require.True(t, a.GetMaxConcurrentRuns() >= 0 && a.GetMaxConcurrentRuns() <= access.MaxRuns)
			}
		}
		var g loopsv1.GrantAccessRequestRequest
		if protojson.Unmarshal(data, &g) == nil || proto.Unmarshal(data, &g) == nil {
			if err := access.ValidateGrant(&g); err != nil {
				require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), err.Error())
			} else {
				require.NotEmpty(t, g.GetId())
				require.True(t, g.GetDurationSeconds() >= 0 && g.GetDurationSeconds() <= access.MaxGrantSeconds)
			}
		}
	})
}
