// Package optrace draws operations as a trace in the Chrome trace event format (the JSON
// object form, {"traceEvents": [...]}), which Perfetto (ui.perfetto.dev), chrome://tracing
// and speedscope open. It is a pure function of the operations: no clocks, no I/O.
//
// Layout: one process per track (a training run or a sampler), one thread per operation
// (named by its seq_id and kind, in submission order), and on each thread the stages of
// the operation's life as complete ("X") events, nested where one holds the other:
//
//	queued          create_time → timeline.start_time (or its end, if it never started)
//	running         start_time → done_time
//	  backend       timeline.backend_start_time → backend_end_time (batch items, pieces)
//	persist         done_time → timeline.persist_time
//	await retrieval persist_time → timeline.retrieve_time
//
// and instants ("i") for its submission, a cancel request and its first retrieval.
// Timestamps are microseconds since the first operation's submission (otherData.base_time
// says when that was).
package optrace

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Track is one process of the trace: a training run's or a sampler's operations.
type Track struct {
	// Name is the process's name ("training run run-…", "sampler smp-…").
	Name string
	Ops  []*loopsv1.Operation
}

// event is one Chrome trace event.
type event struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  *float64       `json:"dur,omitempty"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	S    string         `json:"s,omitempty"`
	Args map[string]any `json:"args,omitempty"`
}

// trace is the JSON object form of a trace.
type trace struct {
	TraceEvents     []event        `json:"traceEvents"`
	DisplayTimeUnit string         `json:"displayTimeUnit"`
	OtherData       map[string]any `json:"otherData"`
}

// Encode draws the tracks of session as trace JSON.
func Encode(session string, tracks []Track) ([]byte, error) {
	var base time.Time
	for _, tr := range tracks {
		for _, op := range tr.Ops {
			if c := op.GetCreateTime(); c != nil && (base.IsZero() || c.AsTime().Before(base)) {
				base = c.AsTime()
			}
		}
	}
	out := trace{TraceEvents: []event{}, DisplayTimeUnit: "ms", OtherData: map[string]any{"session_id": session}}
	if !base.IsZero() {
		out.OtherData["base_time"] = base.UTC().Format(time.RFC3339Nano)
	}
	us := func(t *timestamppb.Timestamp) float64 {
		return float64(t.AsTime().Sub(base).Nanoseconds()) / 1e3
	}
	for i, tr := range tracks {
		pid := i + 1
		out.TraceEvents = append(out.TraceEvents,
			meta("process_name", pid, 0, map[string]any{"name": tr.Name}),
			meta("process_sort_index", pid, 0, map[string]any{"sort_index": pid}))
		ops := slices.Clone(tr.Ops)
		slices.SortStableFunc(ops, func(a, b *loopsv1.Operation) int {
			return a.GetCreateTime().AsTime().Compare(b.GetCreateTime().AsTime())
		})
		for j, op := range ops {
			if op.GetCreateTime() == nil {
				continue
			}
			tid := j + 1
			out.TraceEvents = append(out.TraceEvents,
				meta("thread_name", pid, tid, map[string]any{"name": threadName(op)}),
				meta("thread_sort_index", pid, tid, map[string]any{"sort_index": tid}))
			out.TraceEvents = append(out.TraceEvents, stages(op, pid, tid, us)...)
		}
	}
	return json.Marshal(out)
}

func meta(name string, pid, tid int, args map[string]any) event {
	return event{Name: name, Ph: "M", Pid: pid, Tid: tid, Args: args}
}

// threadName names an operation's row: its seq_id (for ordered work) and kind.
func threadName(op *loopsv1.Operation) string {
	kind := strings.ToLower(strings.TrimPrefix(op.GetKind().String(), "OPERATION_KIND_"))
	if op.GetSeqId() > 0 && op.GetTrainingRunId() != "" {
		return fmt.Sprintf("seq %d %s", op.GetSeqId(), kind)
	}
	return kind + " " + op.GetId()
}

// stages are an operation's events (see the package doc).
func stages(op *loopsv1.Operation, pid, tid int, us func(*timestamppb.Timestamp) float64) []event {
	tl := op.GetTimeline()
	args := map[string]any{
		"id":    op.GetId(),
		"kind":  op.GetKind().String(),
		"state": op.GetState().String(),
	}
	if op.GetSeqId() > 0 {
		args["seq_id"] = op.GetSeqId()
	}
	if e := op.GetError(); e != nil {
		args["error"] = e.GetMessage()
	}
	var out []event
	span := func(name string, from, to *timestamppb.Timestamp, args map[string]any) {
		if from == nil || to == nil || to.AsTime().Before(from.AsTime()) {
			return
		}
		d := us(to) - us(from)
		out = append(out, event{Name: name, Cat: "operation", Ph: "X", Ts: us(from), Dur: &d, Pid: pid, Tid: tid, Args: args})
	}
	instant := func(name string, at *timestamppb.Timestamp) {
		if at != nil {
			out = append(out, event{Name: name, Cat: "operation", Ph: "i", S: "t", Ts: us(at), Pid: pid, Tid: tid})
		}
	}
	instant("submitted", op.GetCreateTime())
	queuedUntil := tl.GetStartTime()
	if queuedUntil == nil {
		queuedUntil = op.GetDoneTime() // it never started: removed, failed or cancelled in its queue
	}
	span("queued", op.GetCreateTime(), queuedUntil, args)
	span("running", tl.GetStartTime(), op.GetDoneTime(), args)
	if tl.GetBackendStartTime() != nil {
		b := map[string]any{"pieces": tl.GetPieces()}
		if tl.GetBatchItems() > 0 {
			b["batch_items"] = tl.GetBatchItems()
		}
		// Within "running", so that viewers nest it there (the clocks are read a moment apart).
		from, to := tl.GetBackendStartTime(), tl.GetBackendEndTime()
		if st := tl.GetStartTime(); st != nil && from.AsTime().Before(st.AsTime()) {
			from = st
		}
		if d := op.GetDoneTime(); d != nil && to != nil && to.AsTime().After(d.AsTime()) {
			to = d
		}
		span("backend", from, to, b)
	}
	instant("cancel requested", op.GetCancelTime())
	span("persist", op.GetDoneTime(), tl.GetPersistTime(), nil)
	waitFrom := tl.GetPersistTime()
	if waitFrom == nil {
		waitFrom = op.GetDoneTime()
	}
	span("await retrieval", waitFrom, tl.GetRetrieveTime(), nil)
	instant("retrieved", tl.GetRetrieveTime())
	return out
}
