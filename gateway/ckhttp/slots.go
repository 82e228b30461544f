package ckhttp

import (
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/internal/errs"
)

// slots counts the transfers of one kind running now: at most max in all and perWS for
// one workspace. The map holds only workspaces with a transfer running, so it never has
// more than max entries.
type slots struct {
	what           string // "merged exports", for messages
	limit, wsLimit string // the limits' names, for messages and ErrorInfo
	max, perWS     int
	retry          time.Duration
	mu             sync.Mutex
	total          int
	per            map[string]int
}

func newSlots(what, limit, wsLimit string, max, perWS int, retry time.Duration) *slots {
	return &slots{what: what, limit: limit, wsLimit: wsLimit, max: max, perWS: perWS, retry: retry, per: map[string]int{}}
}

// acquire takes a slot for workspace ws and returns its release (call it once), or a
// ResourceExhausted error naming the limit that refused it.
func (s *slots) acquire(ws string) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.per[ws]; n >= s.perWS {
		return nil, errs.Limit(connect.CodeResourceExhausted, errs.ReasonLimitReached, s.wsLimit, s.retry, fmt.Errorf(
			"this workspace already runs %d %s, the most one workspace may run at once (%s = %d, of the server's %d): retry when one ends",
			n, s.what, s.wsLimit, s.perWS, s.max))
	}
	if s.total >= s.max {
		return nil, errs.Limit(connect.CodeResourceExhausted, errs.ReasonLimitReached, s.limit, s.retry, fmt.Errorf(
			"%d %s are running, the most this server runs at once (%s): retry later", s.total, s.what, s.limit))
	}
	s.total++
	s.per[ws]++
	var once sync.Once
	return func() { once.Do(func() { s.release(ws) }) }, nil
}

func (s *slots) release(ws string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.per[ws]--; s.per[ws] <= 0 {
		delete(s.per, ws)
	}
}
