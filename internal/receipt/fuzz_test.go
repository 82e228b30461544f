package receipt

import (
	"net/http"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// FuzzDecodeBatch: any bytes decode to a batch or an error, never a panic; a batch that
// decodes re-encodes to one that decodes the same, with the same hash.
func FuzzDecodeBatch(f *testing.F) {
	seed, err := EncodeBatch(&loopsv1.ReceiptBatch{TrainingRunId: "run-1", SeqId: 3, LossFn: "cross_entropy",
		Data: []*loopsv1.Datum{{Tokens: []int32{1, 2, 3}, LossFnInputs: map[string]*loopsv1.Tensor{
			"weights": {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: []int64{3}, Float32Data: []float32{1, 0, -0}},
		}}}})
	require.NoError(f, err)
	f.Add(seed)
	f.Add([]byte{})
	f.Add([]byte{0x10, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := DecodeBatch(data)
		if err != nil {
			return
		}
		again, err := EncodeBatch(b)
		require.NoError(t, err)
		b2, err := DecodeBatch(again)
		require.NoError(t, err)
		require.Equal(t, b.GetBatchSha256(), b2.GetBatchSha256())
		require.Equal(t, BatchHash(b.GetData()), b.GetBatchSha256())
	})
}

// FuzzClientFromHeaders: any header values give a bounded, valid UTF-8 ClientInfo (or
// none), never a panic.
func FuzzClientFromHeaders(f *testing.F) {
	f.Add("AsyncTinker/Python 0.38.0", "0.38.0", "CPython", "3.12.3")
	f.Add("curl/8.5.0", "", "", "")
	f.Add("", "", "", "")
	f.Add("/ /", "\xff", "a", "\x00")
	f.Fuzz(func(t *testing.T, ua, version, runtime, runtimeVersion string) {
		h := http.Header{}
		h.Set("User-Agent", ua)
		h.Set("X-Stainless-Package-Version", version)
		h.Set("X-Stainless-Runtime", runtime)
		h.Set("X-Stainless-Runtime-Version", runtimeVersion)
		c := ClientFromHeaders(h)
		for _, s := range []string{c.GetName(), c.GetVersion(), c.GetRuntime(), c.GetUserAgent()} {
			require.LessOrEqual(t, len(s), maxHeader)
			require.True(t, utf8.ValidString(s), "%q", s)
		}
	})
}
