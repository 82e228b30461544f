package main

import (
	"strings"
	"testing"
	"time"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestParseSince(t *testing.T) {
	for in, want := range map[string]time.Duration{"24h": 24 * time.Hour, "90m": 90 * time.Minute, "7d": 7 * 24 * time.Hour} {
		got, err := parseSince(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "x", "0h", "-1h", "1.5d"} {
		_, err := parseSince(bad)
		require.Error(t, err, bad)
	}
}

func TestPrintUsageSumsSessionsAndTotalsKinds(t *testing.T) {
	h0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	b := func(h int, session string, kind loopsv1.UsageKind, n int64) *loopsv1.UsageBucket {
		return &loopsv1.UsageBucket{StartTime: timestamppb.New(h0.Add(time.Duration(h) * time.Hour)), BaseModel: "m", SessionId: session, Kind: kind, Amount: n}
	}
	var out strings.Builder
	require.NoError(t, printUsage(&out, []*loopsv1.UsageBucket{
		b(1, "s1", loopsv1.UsageKind_USAGE_KIND_CHECKPOINTS, 1),
		b(0, "s1", loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, 10),
		b(0, "s2", loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, 5),
	}))
	require.Equal(t, strings.Join([]string{
		"BUCKET (UTC)      MODEL  KIND             AMOUNT",
		"2025-03-01 12:00  m      training_tokens  15",
		"2025-03-01 13:00  m      checkpoints      1",
		"TOTAL                    training_tokens  15",
		"TOTAL                    checkpoints      1",
		"",
	}, "\n"), out.String())
}
