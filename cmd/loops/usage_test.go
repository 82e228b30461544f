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
	}, usageView{}))
	require.Equal(t, strings.Join([]string{
		"BUCKET (UTC)      MODEL  KIND             AMOUNT",
		"2025-03-01 12:00  m      training_tokens  15",
		"2025-03-01 13:00  m      checkpoints      1",
		"TOTAL                    training_tokens  15",
		"TOTAL                    checkpoints      1",
		"",
	}, "\n"), out.String())
}

func TestPrintAuditAndCheckpointStorage(t *testing.T) {
	var out strings.Builder
	require.NoError(t, printAudit(&out, []*loopsv1.AuditEvent{{
		Time: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), KeyId: "key-0123456789abcdef", ClientAddr: "192.0.2.1",
		Surface: "tinker", Event: "checkpoint_delete", Target: "tinker://r/weights/c", HttpStatus: 404, Code: "not_found",
	}, {Time: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)), KeyId: "key-1", Surface: "rest", Event: "session_create", HttpStatus: 200, Code: "ok"}}))
	require.Equal(t, strings.Join([]string{
		"TIME (UTC)           KEY                   FROM       SURFACE  EVENT              TARGET                STATUS",
		"2026-01-02 03:04:05  key-0123456789abcdef  192.0.2.1  tinker   checkpoint_delete  tinker://r/weights/c  404 not_found",
		"2026-01-02 03:04:06  key-1                            rest     session_create     -                     200 ok",
		"",
	}, "\n"), out.String())
	out.Reset()
	require.NoError(t, printCheckpointStorage(&out, &loopsv1.GetCheckpointStorageResponse{CheckpointCount: 2, SizeBytes: 1_500_000_000}))
	require.Equal(t, "CHECKPOINTS  BYTES       GB\n2            1500000000  1.500\n", out.String())
}

// TestPrintUsageCost: --cost sums exact costs per row, per kind and in all, marks a partly
// priced row and shows "-" for unpriced usage; --by-day sums the hours of a day.
func TestPrintUsageCost(t *testing.T) {
	h0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	b := func(h int, kind loopsv1.UsageKind, n, priced int64, cost string) *loopsv1.UsageBucket {
		return &loopsv1.UsageBucket{StartTime: timestamppb.New(h0.Add(time.Duration(h) * time.Hour)), BaseModel: "m", Kind: kind, Amount: n, PricedAmount: priced, CostUsd: cost}
	}
	buckets := []*loopsv1.UsageBucket{
		b(0, loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, 10, 10, "0.000004"),
		b(1, loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, 3, 3, "0.0000012"),
		b(1, loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS, 7, 5, "0.000003"),
		b(1, loopsv1.UsageKind_USAGE_KIND_CHECKPOINTS, 1, 0, ""),
		b(30, loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, 1, 1, "0.1"),
	}
	var out strings.Builder
	require.NoError(t, printUsage(&out, buckets, usageView{cost: true, byDay: true}))
	require.Equal(t, strings.Join([]string{
		"DAY (UTC)   MODEL  KIND                    AMOUNT  COST (USD)",
		"2025-03-01  m      training_tokens         13      0.0000052",
		"2025-03-01  m      sampling_sample_tokens  7       0.000003*",
		"2025-03-01  m      checkpoints             1       -",
		"2025-03-02  m      training_tokens         1       0.1",
		"TOTAL              training_tokens         14      0.1000052",
		"TOTAL              sampling_sample_tokens  7       0.000003*",
		"TOTAL              checkpoints             1       -",
		"TOTAL COST                                         0.1000082*",
		"* only part of the amount was priced (usage metered while no price sheet priced it); the cost is that part's",
		"",
	}, "\n"), out.String())

	out.Reset()
	require.NoError(t, printUsage(&out, []*loopsv1.UsageBucket{buckets[0], buckets[3]}, usageView{cost: true}))
	require.Regexp(t, `(?m)^TOTAL COST\s+0\.000004$`, out.String(), "an unpriced kind (checkpoints) does not make the total partial")

	out.Reset()
	require.NoError(t, printUsage(&out, buckets[3:4], usageView{cost: true}))
	require.Contains(t, out.String(), "(no cost: the server has no price sheet")
}

// TestPrintUsageByKey: --by-key gives each API key its rows.
func TestPrintUsageByKey(t *testing.T) {
	start := timestamppb.New(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
	var out strings.Builder
	require.NoError(t, printUsage(&out, []*loopsv1.UsageBucket{
		{StartTime: start, BaseModel: "m", KeyId: "key-b", Kind: loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, Amount: 2, PricedAmount: 2, CostUsd: "0.2"},
		{StartTime: start, BaseModel: "m", KeyId: "key-a", Kind: loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, Amount: 1, PricedAmount: 1, CostUsd: "0.1"},
		{StartTime: start, BaseModel: "m", SessionId: "s2", KeyId: "key-b", Kind: loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, Amount: 3, PricedAmount: 3, CostUsd: "0.3"},
	}, usageView{cost: true, byKey: true}))
	require.Equal(t, strings.Join([]string{
		"BUCKET (UTC)      MODEL  KEY    KIND             AMOUNT  COST (USD)",
		"2025-03-01 12:00  m      key-a  training_tokens  1       0.1",
		"2025-03-01 12:00  m      key-b  training_tokens  5       0.5",
		"TOTAL                           training_tokens  6       0.6",
		"TOTAL COST                                               0.6",
		"",
	}, "\n"), out.String())
}

// TestPrintUsageByRun: --by-run gives each run its storage and pool rows; usage kept per
// session (tokens, storage metered before runs were) is "-".
func TestPrintUsageByRun(t *testing.T) {
	start := timestamppb.New(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
	const storage = loopsv1.UsageKind_USAGE_KIND_CHECKPOINT_BYTE_SECONDS
	var out strings.Builder
	require.NoError(t, printUsage(&out, []*loopsv1.UsageBucket{
		{StartTime: start, SessionId: "s1", TrainingRunId: "run-2", Kind: storage, Amount: 5, PricedAmount: 5, CostUsd: "0.5"},
		{StartTime: start, SessionId: "s1", TrainingRunId: "run-1", Kind: storage, Amount: 2, PricedAmount: 2, CostUsd: "0.2"},
		{StartTime: start, SessionId: "s1", Kind: storage, Amount: 1, PricedAmount: 1, CostUsd: "0.1"},
		{StartTime: start, SessionId: "s2", TrainingRunId: "run-1", Kind: storage, Amount: 3, PricedAmount: 3, CostUsd: "0.3"},
	}, usageView{cost: true, byRun: true}))
	require.Equal(t, strings.Join([]string{
		"BUCKET (UTC)      MODEL  RUN    KIND                     AMOUNT  COST (USD)",
		"2025-03-01 12:00         -      checkpoint_byte_seconds  1       0.1",
		"2025-03-01 12:00         run-1  checkpoint_byte_seconds  5       0.5",
		"2025-03-01 12:00         run-2  checkpoint_byte_seconds  5       0.5",
		"TOTAL                           checkpoint_byte_seconds  11      1.1",
		"TOTAL COST                                                       1.1",
		"",
	}, "\n"), out.String())
}
