// Package auditnote carries, in a request's context, what the layers that handle a call
// learn about it for its audit record: the route it matched, the id it acted on, its
// outcome code, whether it was relayed to another call of the same server. The audit
// middleware (gateway/audit) puts a Note in the context and reads it when the call is
// answered; the layers below only write to it, and do nothing when there is none.
package auditnote

import (
	"context"
	"strings"
	"sync"
)

// MaxTarget bounds a target's length: longer ones are cut.
const MaxTarget = 512

// Note is what is known about one call. It is safe for concurrent use.
type Note struct {
	mu      sync.Mutex
	route   string
	target  string
	code    string
	relayed bool
}

type noteKey struct{}

// With returns a context carrying a new Note, and the Note.
func With(ctx context.Context) (context.Context, *Note) {
	n := &Note{}
	return context.WithValue(ctx, noteKey{}, n), n
}

// From returns the context's Note, or nil.
func From(ctx context.Context) *Note {
	n, _ := ctx.Value(noteKey{}).(*Note)
	return n
}

// SetRoute records the route pattern the call matched ("POST /api/v1/create_model").
func SetRoute(ctx context.Context, pattern string) {
	if n := From(ctx); n != nil {
		n.mu.Lock()
		n.route = pattern
		n.mu.Unlock()
	}
}

// SetTarget records the id the call acted on; the first one set is kept, cut to MaxTarget.
func SetTarget(ctx context.Context, id string) {
	if id == "" {
		return
	}
	if n := From(ctx); n != nil {
		n.mu.Lock()
		if n.target == "" {
			n.target = cut(id)
		}
		n.mu.Unlock()
	}
}

// SetCode records the call's outcome as a canonical code name ("ok", "not_found", …).
func SetCode(ctx context.Context, code string) {
	if n := From(ctx); n != nil {
		n.mu.Lock()
		n.code = code
		n.mu.Unlock()
	}
}

// MarkRelayed records that the call was passed on as another call to this server, which
// is audited itself (a REST request becomes a gRPC call).
func MarkRelayed(ctx context.Context) {
	if n := From(ctx); n != nil {
		n.mu.Lock()
		n.relayed = true
		n.mu.Unlock()
	}
}

// Snapshot is what a Note holds.
type Snapshot struct {
	Route, Target, Code string
	Relayed             bool
}

// Read returns what the note holds.
func (n *Note) Read() Snapshot {
	n.mu.Lock()
	defer n.mu.Unlock()
	return Snapshot{Route: n.route, Target: n.target, Code: n.code, Relayed: n.relayed}
}

// PathTarget is the target named by a route's path wildcards: their values joined by "/";
// a checkpoint route's {run}/{kind}/{name} becomes its tinker:// path. value returns a
// wildcard's value (http.Request.PathValue).
func PathTarget(pattern string, value func(string) string) string {
	var names, vals []string
	for rest := pattern; ; {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			break
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			break
		}
		name := strings.TrimSuffix(rest[i+1:i+j], "...")
		rest = rest[i+j+1:]
		if name == "$" || name == "" {
			continue
		}
		if v := value(name); v != "" {
			names = append(names, name)
			vals = append(vals, v)
		}
	}
	t := strings.Join(vals, "/")
	if len(names) == 3 && names[0] == "run" && names[1] == "kind" {
		t = "tinker://" + t
	}
	return t
}

func cut(s string) string {
	if len(s) > MaxTarget {
		return s[:MaxTarget]
	}
	return s
}
