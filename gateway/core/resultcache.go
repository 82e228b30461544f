package core

import (
	"container/list"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"google.golang.org/protobuf/proto"
)

// Large results (docs/semantics.md, "Operations"): the per-token outputs of forward and
// forward_backward and the sequences of sample live only in memory, in a cache bounded in
// bytes (Options.ResultCacheBytes) and in time (Options.ResultCacheTTL). Entries leave oldest
// first: when they pass the TTL, or when newer results need the room. The store and the
// operation registry keep the small part only (state, error, metrics); asking for a large
// result that has left the cache, or that a restart dropped, is answered FailedPrecondition
// with reason RESULT_EXPIRED. Compat's encodings of a result (JSON, protobuf) are kept in its
// entry and count against the same budget.

// hasLargeResult reports whether op's kind carries a result that only the cache holds.
func hasLargeResult(op *loopsv1.Operation) bool {
	if op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED {
		return false
	}
	switch op.GetKind() {
	case loopsv1.OperationKind_OPERATION_KIND_FORWARD, loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD,
		loopsv1.OperationKind_OPERATION_KIND_SAMPLE:
		return true
	}
	return false
}

// smallCopy returns what the store keeps of a finished operation: op itself, or, for an
// operation with a large result, a copy without per-token outputs or sequences (metrics kept).
func smallCopy(op *loopsv1.Operation) *loopsv1.Operation {
	if !hasLargeResult(op) {
		return op
	}
	small := proto.CloneOf(op)
	switch r := small.GetResult().(type) {
	case *loopsv1.Operation_ForwardBackward:
		if r.ForwardBackward != nil {
			r.ForwardBackward = &loopsv1.ForwardBackwardResult{Metrics: r.ForwardBackward.GetMetrics()}
		}
	case *loopsv1.Operation_Sample:
		if r.Sample != nil {
			r.Sample = &loopsv1.SampleResult{}
		}
	}
	return small
}

type resultEntry struct {
	id      string
	op      *loopsv1.Operation
	size    int64
	added   time.Time
	encoded map[string][]byte
}

// resultCache holds full results by operation id, oldest first.
type resultCache struct {
	maxBytes int64
	ttl      time.Duration
	now      func() time.Time

	mu    sync.Mutex
	bytes int64
	order *list.List // of *resultEntry, oldest at the front
	byID  map[string]*list.Element
}

func newResultCache(maxBytes int64, ttl time.Duration, now func() time.Time) *resultCache {
	return &resultCache{maxBytes: maxBytes, ttl: ttl, now: now, order: list.New(), byID: map[string]*list.Element{}}
}

// put keeps op's full result. A result larger than the whole budget is not kept.
func (rc *resultCache) put(op *loopsv1.Operation) bool {
	size := int64(proto.Size(op))
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if size > rc.maxBytes {
		return false
	}
	if el, ok := rc.byID[op.GetId()]; ok {
		rc.removeLocked(el)
	}
	rc.bytes += size
	rc.byID[op.GetId()] = rc.order.PushBack(&resultEntry{id: op.GetId(), op: op, size: size, added: rc.now()})
	rc.shrinkLocked(nil)
	return true
}

// get returns the full operation, if it is still kept.
func (rc *resultCache) get(id string) (*loopsv1.Operation, bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	el, ok := rc.byID[id]
	if !ok {
		return nil, false
	}
	e := el.Value.(*resultEntry)
	if rc.now().Sub(e.added) > rc.ttl {
		rc.removeLocked(el)
		return nil, false
	}
	return e.op, true
}

// encoded returns the result's encoding in format, made by encode at most once while the
// entry is kept. A result not in the cache is encoded every time.
func (rc *resultCache) encoded(id, format string, encode func() ([]byte, error)) ([]byte, error) {
	rc.mu.Lock()
	if el, ok := rc.byID[id]; ok {
		if b, ok := el.Value.(*resultEntry).encoded[format]; ok {
			rc.mu.Unlock()
			return b, nil
		}
	}
	rc.mu.Unlock()
	b, err := encode() // outside the lock: it may take milliseconds
	if err != nil {
		return nil, err
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if el, ok := rc.byID[id]; ok {
		e := el.Value.(*resultEntry)
		if _, ok := e.encoded[format]; !ok && int64(len(b))+e.size <= rc.maxBytes {
			if e.encoded == nil {
				e.encoded = map[string][]byte{}
			}
			e.encoded[format] = b
			e.size += int64(len(b))
			rc.bytes += int64(len(b))
			rc.shrinkLocked(el)
		}
	}
	return b, nil
}

// sweep drops the entries past the TTL.
func (rc *resultCache) sweep() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	now := rc.now()
	for el := rc.order.Front(); el != nil; el = rc.order.Front() {
		if now.Sub(el.Value.(*resultEntry).added) <= rc.ttl {
			return
		}
		rc.removeLocked(el)
	}
}

// shrinkLocked evicts oldest entries (never keep) until the cache fits its budget.
func (rc *resultCache) shrinkLocked(keep *list.Element) {
	for el := rc.order.Front(); rc.bytes > rc.maxBytes && el != nil; {
		next := el.Next()
		if el != keep {
			rc.removeLocked(el)
		}
		el = next
	}
}

func (rc *resultCache) removeLocked(el *list.Element) {
	e := el.Value.(*resultEntry)
	rc.order.Remove(el)
	delete(rc.byID, e.id)
	rc.bytes -= e.size
}

// usage returns the bytes and entries held.
func (rc *resultCache) usage() (int64, int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.bytes, len(rc.byID)
}

// errResultExpired answers a request for a large result the cache no longer holds.
func (rc *resultCache) errExpired(op *loopsv1.Operation) error {
	return errs.New(connect.CodeFailedPrecondition, errs.ReasonResultExpired, fmt.Errorf(
		"result expired: the result of operation %s (%s, succeeded) is no longer kept; results are kept for %s and up to %d MiB in all (oldest leave first), and a server restart drops them: rerun the step",
		op.GetId(), kindName(op.GetKind()), rc.ttl, rc.maxBytes>>20))
}
