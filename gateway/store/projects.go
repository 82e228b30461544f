package store

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// DefaultProject is the name of the project every workspace has: it holds the sessions
// created without a project (stored with an empty project).
const DefaultProject = "default"

// ErrExists is returned by CreateProject when the workspace has a project of that name.
var ErrExists = errors.New("store: already exists")

// Bounds of the session labels a search can match: a user_metadata pair or a tag longer than
// these is kept in the session's record but not indexed, so no search finds it by that
// label (and a search naming such a label is refused before it reaches the store).
const (
	// MaxLabelKeyBytes bounds a user_metadata key or a tag.
	MaxLabelKeyBytes = 128
	// MaxLabelValueBytes bounds a user_metadata value.
	MaxLabelValueBytes = 512
	// MaxSearchLimit is the largest page a client may ask of a search. SearchSessions
	// returns up to one more, so that a caller asking for a full page plus one learns
	// whether another page follows.
	MaxSearchLimit = 200
)

// ProjectStore keeps a workspace's projects and finds its sessions by their labels.
type ProjectStore interface {
	// CreateProject inserts a project of the workspace; ErrExists when one of its name is
	// there already. p.Name must not be empty.
	CreateProject(ctx context.Context, workspace string, p *loopsv1.Project) error
	// GetProject returns a project of the workspace by name.
	GetProject(ctx context.Context, workspace, name string) (*loopsv1.Project, error)
	// ListProjects lists the workspace's projects by name.
	ListProjects(ctx context.Context, workspace string) ([]*loopsv1.Project, error)
	// DeleteProject removes a project of the workspace that no session belongs to:
	// ErrNotFound when there is none, ErrProjectInUse (changing nothing) when sessions
	// belong to it.
	DeleteProject(ctx context.Context, workspace, name string) error
	// SearchSessions returns the workspace's sessions that match q, newest first (by
	// create_time, then id, descending), at most q.Limit of them (bounded as
	// SearchLimit), with how many checkpoints each holds.
	SearchSessions(ctx context.Context, workspace string, q SessionQuery) ([]SessionHit, error)
	// ListProjectTrainingRuns lists the workspace's training runs whose session belongs to
	// the project (DefaultProject: also the sessions stored without one), and their count.
	ListProjectTrainingRuns(ctx context.Context, workspace, project string, page Page) ([]*loopsv1.TrainingRun, int64, error)
	// ListUnindexedSessions lists, by id, at most limit sessions of every workspace after
	// afterID that were stored before sessions were indexed for search (schema version 6):
	// a PutSession of each indexes it (its project, status, owner, display name and
	// labels), after which it is no longer listed.
	ListUnindexedSessions(ctx context.Context, afterID string, limit int) ([]OwnedSession, error)
}

// OwnedSession is a session with its workspace.
type OwnedSession struct {
	Workspace string
	Session   *loopsv1.Session
}

// ErrProjectInUse is returned by DeleteProject when sessions belong to the project.
var ErrProjectInUse = errors.New("store: project holds sessions")

// SessionQuery selects sessions of a workspace; every condition set must hold. A session's
// status, project, owner and display name are those of its last PutSession; its labels
// (user_metadata pairs and tags within the Max* bounds) those of its first PutSession that
// had any.
type SessionQuery struct {
	// SessionID and DisplayWords: a session matches when its id is SessionID, or when its
	// display name contains every word of DisplayWords (ignoring ASCII case). Both empty:
	// every session.
	SessionID    string
	DisplayWords []string
	// Projects: the session's project is one of these (DefaultProject also matches a
	// session stored without a project).
	Projects []string
	// Metadata pairs and Tags the session carries, all of them.
	Metadata map[string]string
	Tags     []string
	// CreatedAfter <= create_time < CreatedBefore; a zero time is no bound.
	CreatedAfter, CreatedBefore time.Time
	// Statuses, when any is set, are the statuses to match: Active (not ended),
	// EndReasons (ended with exactly one of these end reasons) and EndReasonPrefixes
	// (ended with a reason that starts with one of these).
	Statuses *StatusMatch
	// Owners: the session's owner is one of these.
	Owners []string
	// After: only sessions strictly after this position (the last of the previous page).
	After *Cursor
	// Limit bounds the answer (see SearchLimit).
	Limit int
}

// StatusMatch is a SessionQuery's status condition: a session matches when any part holds.
type StatusMatch struct {
	Active            bool
	EndReasons        []string
	EndReasonPrefixes []string
}

// SessionHit is a session a search found, with how many checkpoints its runs hold.
type SessionHit struct {
	Session         *loopsv1.Session
	CheckpointCount int64
}

// SearchLimit bounds a SessionQuery's Limit: not positive means 50, at most
// MaxSearchLimit+1.
func SearchLimit(limit int) int {
	switch {
	case limit <= 0:
		return 50
	case limit > MaxSearchLimit+1:
		return MaxSearchLimit + 1
	}
	return limit
}

// SessionStatus is the status a store records for a session, for SearchSessions: empty
// while it is active, else its end reason ("ended" when it has none).
func SessionStatus(s *loopsv1.Session) string {
	if !s.GetExpired() {
		return ""
	}
	if r := s.GetEndReason(); r != "" {
		return r
	}
	return "ended"
}

// SessionLabel is one searchable label of a session: Kind is LabelMetadata (Name, Value)
// or LabelTag (Name, empty Value).
type SessionLabel struct {
	Kind, Name, Value string
}

// Kinds of SessionLabel.
const (
	LabelMetadata = "m"
	LabelTag      = "t"
)

// SessionLabels returns the labels of s that a store indexes: its user_metadata pairs and
// tags within the Max* bounds and without a NUL (which PostgreSQL's text refuses), in a fixed order (tags, then metadata, each sorted).
func SessionLabels(s *loopsv1.Session) []SessionLabel {
	var out []SessionLabel
	for _, t := range sortedUnique(s.GetTags()) {
		if t != "" && len(t) <= MaxLabelKeyBytes && !strings.ContainsRune(t, 0) {
			out = append(out, SessionLabel{Kind: LabelTag, Name: t})
		}
	}
	md := s.GetUserMetadata()
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	for _, k := range sortedUnique(keys) {
		if v := md[k]; len(k) <= MaxLabelKeyBytes && len(v) <= MaxLabelValueBytes && !strings.ContainsRune(k+v, 0) {
			out = append(out, SessionLabel{Kind: LabelMetadata, Name: k, Value: v})
		}
	}
	return out
}

func sortedUnique(in []string) []string {
	out := slices.Clone(in)
	slices.Sort(out)
	return slices.Compact(out)
}
