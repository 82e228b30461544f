package resultcache

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

// HasLarge reports whether op carries a result that only the cache holds: it succeeded, and
// its kind (forward, forward_backward, sample) has per-token outputs or sequences.
func HasLarge(op *loopsv1.Operation) bool {
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

// Small returns what the store keeps of a finished operation: op itself, or, for an
// operation with a large result, a copy without per-token outputs or sequences (metrics kept).
func Small(op *loopsv1.Operation) *loopsv1.Operation {
	if !HasLarge(op) {
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

// Cache holds full results by operation id, oldest first, within a budget of bytes and of
// time. Its methods are safe for concurrent use; its lock is a leaf (nothing is taken or
// called under it, encode included).
type Cache struct {
	maxBytes int64
	ttl      time.Duration
	now      func() time.Time

	mu    sync.Mutex
	bytes int64
	order *list.List // of *resultEntry, oldest at the front
	byID  map[string]*list.Element
}

// New returns an empty cache that keeps up to maxBytes of results (an operation's encoded
// size, and the encodings kept with it), each for ttl after it was put, by the clock now.
func New(maxBytes int64, ttl time.Duration, now func() time.Time) *Cache {
	return &Cache{maxBytes: maxBytes, ttl: ttl, now: now, order: list.New(), byID: map[string]*list.Element{}}
}

// Put keeps op's full result (op itself, which must not change afterwards), making room by
// dropping the oldest entries; it reports false, keeping nothing, for a result larger than
// the whole budget.
func (rc *Cache) Put(op *loopsv1.Operation) bool {
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

// Get returns the full operation, if it is still kept (put less than the TTL ago).
func (rc *Cache) Get(id string) (*loopsv1.Operation, bool) {
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

// Encoded returns the result's encoding in format, made by encode at most once while the
// entry is kept. A result not in the cache is encoded every time.
func (rc *Cache) Encoded(id, format string, encode func() ([]byte, error)) ([]byte, error) {
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

// Sweep drops the entries past the TTL.
func (rc *Cache) Sweep() {
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
func (rc *Cache) shrinkLocked(keep *list.Element) {
	for el := rc.order.Front(); rc.bytes > rc.maxBytes && el != nil; {
		next := el.Next()
		if el != keep {
			rc.removeLocked(el)
		}
		el = next
	}
}

func (rc *Cache) removeLocked(el *list.Element) {
	e := el.Value.(*resultEntry)
	rc.order.Remove(el)
	delete(rc.byID, e.id)
	rc.bytes -= e.size
}

// Usage returns the bytes and entries held.
func (rc *Cache) Usage() (int64, int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.bytes, len(rc.byID)
}

// MaxBytes is the cache's budget of bytes.
func (rc *Cache) MaxBytes() int64 { return rc.maxBytes }

// ErrExpired answers a request for the large result of op that the cache no longer holds
// (FailedPrecondition, RESULT_EXPIRED), saying how long and how much it keeps; kind is the
// operation's kind as clients name the call (forward_backward, …).
func (rc *Cache) ErrExpired(op *loopsv1.Operation, kind string) error {
	return errs.New(connect.CodeFailedPrecondition, errs.ReasonResultExpired, fmt.Errorf(
		"result expired: the result of operation %s (%s, succeeded) is no longer kept; results are kept for %s and up to %d MiB in all (oldest leave first), and a server restart drops them: rerun the step",
		op.GetId(), kind, rc.ttl, rc.maxBytes>>20))
}
