package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"sync"
	"time"
)

// Defaults of Options' session bounds.
const (
	// DefaultMaxSessions bounds the console sessions signed in at once, all workspaces
	// together.
	DefaultMaxSessions = 1024
	// DefaultMaxSessionsPerWorkspace bounds one workspace's sessions; signing in once more
	// ends that workspace's least recently used one, so one tenant cannot push out
	// another's.
	DefaultMaxSessionsPerWorkspace = 16
	// DefaultSessionIdle ends a session unused this long.
	DefaultSessionIdle = 8 * time.Hour
	// DefaultSessionLifetime ends a session this long after sign-in, used or not.
	DefaultSessionLifetime = 24 * time.Hour
)

// errSessionsFull is sign-in's answer when every session slot is in use.
var errSessionsFull = errors.New("too many console sessions are signed in on this server: sign out of one, or wait for idle ones to expire")

// session is one signed-in browser. The API key stays on the server: the browser holds
// only the session's id, in a cookie without expiry (gone when the browser closes).
type session struct {
	id        string
	key       string // the API key, put on each of the session's requests for the auth middleware
	workspace string
	csrf      string // the token every state-changing form carries
	created   time.Time
	used      time.Time
}

// sessions is the bounded, expiring set of console sessions. Nothing under its lock does
// I/O; each operation is O(sessions) at worst (a sweep over at most MaxSessions entries).
type sessions struct {
	maxAll, maxPerWS int
	idle, lifetime   time.Duration
	now              func() time.Time

	mu   sync.Mutex
	byID map[string]*session
}

func newSessions(o Options) *sessions {
	return &sessions{maxAll: o.MaxSessions, maxPerWS: o.MaxSessionsPerWorkspace, idle: o.SessionIdle,
		lifetime: o.SessionLifetime, now: o.Now, byID: map[string]*session{}}
}

// randomToken is 32 random bytes, base64url.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (s *sessions) expired(x *session, now time.Time) bool {
	return now.Sub(x.used) > s.idle || now.Sub(x.created) > s.lifetime
}

// create signs a key in: a new session for its workspace. A workspace at its bound loses
// its least recently used session. On a full server, the workspace holding the most
// sessions loses its least recently used one, if it holds more than the signing-in
// workspace (so no workspace can keep another out); otherwise the answer is
// errSessionsFull.
func (s *sessions) create(key, workspace string) (*session, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	count := map[string]int{}
	lru := map[string]*session{}
	for id, x := range s.byID {
		if s.expired(x, now) {
			delete(s.byID, id)
			continue
		}
		count[x.workspace]++
		if o := lru[x.workspace]; o == nil || x.used.Before(o.used) {
			lru[x.workspace] = x
		}
	}
	if count[workspace] >= s.maxPerWS {
		delete(s.byID, lru[workspace].id)
		count[workspace]--
	}
	if len(s.byID) >= s.maxAll {
		top := ""
		for ws, n := range count {
			if n > count[top] || (n == count[top] && ws < top) {
				top = ws
			}
		}
		if count[top] <= count[workspace]+1 {
			return nil, errSessionsFull
		}
		delete(s.byID, lru[top].id)
	}
	x := &session{id: randomToken(), key: key, workspace: workspace, csrf: randomToken(), created: now, used: now}
	s.byID[x.id] = x
	return x, nil
}

// get returns the live session with this id and marks it used, or nil.
func (s *sessions) get(id string) *session {
	if id == "" {
		return nil
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	x := s.byID[id]
	if x == nil {
		return nil
	}
	if s.expired(x, now) {
		delete(s.byID, id)
		return nil
	}
	x.used = now
	cp := *x
	return &cp
}

// remove ends a session.
func (s *sessions) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, id)
}

// len is the number of sessions held (expired ones included until swept).
func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// validCSRF reports whether a form's token is the session's, in constant time.
func (x *session) validCSRF(token string) bool {
	return token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(x.csrf)) == 1
}
