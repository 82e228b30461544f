package core

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

// Bounds of projects and of a session search's request.
const (
	// maxProjectNameLen is the longest project name.
	maxProjectNameLen = 64
	// maxProjectDescriptionBytes bounds a project's description.
	maxProjectDescriptionBytes = 1024
	// maxSearchProjects, maxSearchLabels, maxSearchStatuses, maxSearchOwners bound the
	// lists of a session search.
	maxSearchProjects = 20
	maxSearchLabels   = 20
	maxSearchStatuses = 10
	maxSearchOwners   = 10
	// maxSearchDisplayBytes and maxSearchDisplayWords bound a search's display name.
	maxSearchDisplayBytes = 256
	maxSearchDisplayWords = 8
	// maxDisplayNameBytes bounds a session's display name.
	maxDisplayNameBytes = 256
	// maxIDBytes bounds an id a request names (a session's, an owner's).
	maxIDBytes = 128
	// defaultSearchLimit is the page size of a search that gives none.
	defaultSearchLimit = 50
)

// projectLocks serializes the creations of one workspace's projects, so the project limit
// holds under concurrent requests (striped by workspace, as deploymentLocks).
var projectLocks = &deploymentLocks{seed: maphash.MakeSeed()}

// validProjectName checks a project name: 1 to 64 letters, digits, '.', '_' or '-',
// starting with a letter or digit.
func validProjectName(name string) error {
	ok := len(name) >= 1 && len(name) <= maxProjectNameLen
	for i, r := range name {
		alnum := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || (r != '_' && r != '-' && r != '.')) {
			ok = false
		}
	}
	if !ok {
		return invalidArgument("project name %q is not valid: use 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", clip(name), maxProjectNameLen)
	}
	return nil
}

// ensureDefaultProject creates the workspace's default project if it has none yet (every
// workspace has one; it is created on the first use of projects).
func (c *Core) ensureDefaultProject(ctx context.Context, ws string) error {
	if _, err := c.store.GetProject(ctx, ws, store.DefaultProject); !errors.Is(err, store.ErrNotFound) {
		if err != nil {
			return internal("reading the default project", err)
		}
		return nil
	}
	err := c.store.CreateProject(ctx, ws, &loopsv1.Project{
		Name: store.DefaultProject, Description: "sessions created without a project", CreateTime: timestamppb.New(c.now()),
	})
	if err != nil && !errors.Is(err, store.ErrExists) {
		return internal("creating the default project", err)
	}
	return nil
}

// createProject adds a project to the workspace, refusing past Limits.MaxProjectsPerWorkspace
// (the default project counts).
func (c *Core) createProject(ctx context.Context, ws string, p *loopsv1.Project) (*loopsv1.Project, error) {
	if err := c.ensureDefaultProject(ctx, ws); err != nil {
		return nil, err
	}
	unlock := projectLocks.lock(ws)
	defer unlock()
	list, err := c.store.ListProjects(ctx, ws)
	if err != nil {
		return nil, internal("listing projects", err)
	}
	if slices.ContainsFunc(list, func(x *loopsv1.Project) bool { return x.GetName() == p.GetName() }) {
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("project "+p.GetName()+" already exists in this workspace"))
	}
	if limit := c.opts.Limits.MaxProjectsPerWorkspace; len(list) >= limit {
		return nil, c.limitReached(errs.ReasonLimitReached, "max_projects_per_workspace",
			"this workspace has %d projects, the limit (max_projects_per_workspace): delete projects you no longer use (loops projects delete), or ask the operator for more", limit)
	}
	if err := c.store.CreateProject(ctx, ws, p); errors.Is(err, store.ErrExists) {
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("project "+p.GetName()+" already exists in this workspace"))
	} else if err != nil {
		return nil, internal("creating a project", err)
	}
	return p, nil
}

// ResolveProject returns the workspace's project named name ("" means the default project,
// which it creates if the workspace has none yet). A project that does not exist is a
// NotFound error saying how to create it; an invalid name is InvalidArgument. It is what
// another feature naming a project (a destination of copied weights, a filter) uses.
func (c *Core) ResolveProject(ctx context.Context, workspace, name string) (*loopsv1.Project, error) {
	if name == "" {
		name = store.DefaultProject
	}
	if err := validProjectName(name); err != nil {
		return nil, err
	}
	if name == store.DefaultProject {
		if err := c.ensureDefaultProject(ctx, workspace); err != nil {
			return nil, err
		}
	}
	p, err := c.store.GetProject(ctx, workspace, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, notFound("project %q not found in this workspace: create it with `loops projects create %s` (or loops.v1 CreateProject)", name, name)
	}
	if err != nil {
		return nil, internal("reading a project", err)
	}
	return p, nil
}

// projectForUse is ResolveProject for a session being created or moved: a valid name of a
// project that does not exist yet creates it (within the workspace's project limit), so a
// tinker script that names its project runs unchanged.
func (c *Core) projectForUse(ctx context.Context, ws, name string) (*loopsv1.Project, error) {
	p, err := c.ResolveProject(ctx, ws, name)
	if connect.CodeOf(err) != connect.CodeNotFound {
		return p, err
	}
	p, err = c.createProject(ctx, ws, &loopsv1.Project{Name: name, CreateTime: timestamppb.New(c.now())})
	if connect.CodeOf(err) == connect.CodeAlreadyExists { // created meanwhile
		return c.ResolveProject(ctx, ws, name)
	}
	return p, err
}

// ProjectService implements loops.v1 ProjectService.
type ProjectService struct{ c *Core }

// CreateProject adds a project to the workspace.
func (s ProjectService) CreateProject(ctx context.Context, req *loopsv1.CreateProjectRequest) (*loopsv1.Project, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if err := validProjectName(req.GetName()); err != nil {
		return nil, err
	}
	if len(req.GetDescription()) > maxProjectDescriptionBytes {
		return nil, invalidArgument("description is %d bytes, over the maximum of %d", len(req.GetDescription()), maxProjectDescriptionBytes)
	}
	return s.c.createProject(ctx, ws, &loopsv1.Project{Name: req.GetName(), Description: req.GetDescription(), CreateTime: timestamppb.New(s.c.now())})
}

// GetProject returns a project of the workspace.
func (s ProjectService) GetProject(ctx context.Context, req *loopsv1.GetProjectRequest) (*loopsv1.Project, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetName() == "" {
		return nil, invalidArgument("name is required")
	}
	return s.c.ResolveProject(ctx, ws, req.GetName())
}

// ListProjects lists the workspace's projects by name (the default one included).
func (s ProjectService) ListProjects(ctx context.Context, _ *loopsv1.ListProjectsRequest) (*loopsv1.ListProjectsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.c.ensureDefaultProject(ctx, ws); err != nil {
		return nil, err
	}
	list, err := s.c.store.ListProjects(ctx, ws)
	if err != nil {
		return nil, internal("listing projects", err)
	}
	return &loopsv1.ListProjectsResponse{Projects: list}, nil
}

// DeleteProject removes a project that holds no session.
func (s ProjectService) DeleteProject(ctx context.Context, req *loopsv1.DeleteProjectRequest) (*loopsv1.DeleteProjectResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if err := validProjectName(req.GetName()); err != nil {
		return nil, err
	}
	if req.GetName() == store.DefaultProject {
		return nil, failedPrecondition("the default project cannot be deleted: it holds the sessions created without a project")
	}
	switch err := s.c.store.DeleteProject(ctx, ws, req.GetName()); {
	case errors.Is(err, store.ErrNotFound):
		return nil, notFound("project %q not found in this workspace", req.GetName())
	case errors.Is(err, store.ErrProjectInUse):
		return nil, failedPrecondition("project %s still holds sessions: move them to another project first (PUT /api/v1/sessions/{id}/project, or loops.v1 SetSessionProject)", req.GetName())
	case err != nil:
		return nil, internal("deleting a project", err)
	}
	return &loopsv1.DeleteProjectResponse{}, nil
}

// SetSessionProject moves a session, and so its training runs, into a project.
func (s SessionService) SetSessionProject(ctx context.Context, req *loopsv1.SetSessionProjectRequest) (*loopsv1.Session, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetId() == "" || len(req.GetId()) > maxIDBytes {
		return nil, invalidArgument("id must be a session id (1 to %d bytes)", maxIDBytes)
	}
	if req.GetProjectId() == "" {
		return nil, invalidArgument("project_id is required: the project to move the session into")
	}
	// The session must be the workspace's before anything is created for it.
	if _, err := s.GetSession(ctx, &loopsv1.GetSessionRequest{Id: req.GetId()}); err != nil {
		return nil, err
	}
	p, err := s.c.projectForUse(ctx, ws, req.GetProjectId())
	if err != nil {
		return nil, err
	}
	if info, ok := s.c.moveLiveSession(ws, req.GetId(), p.GetName()); ok {
		if err := s.c.store.PutSession(ctx, ws, info); err != nil {
			return nil, internal("recording the session's project", err)
		}
		return info, nil
	}
	// A stored session is rewritten under the project lock (see indexOldSession).
	unlock := projectLocks.lock(ws)
	stored, err := s.c.store.GetSession(ctx, ws, req.GetId())
	if err != nil {
		unlock()
		return nil, storeErr(err, "session "+quote(req.GetId()))
	}
	stored.ProjectId = p.GetName()
	err = s.c.store.PutSession(ctx, ws, stored)
	unlock()
	if err != nil {
		return nil, internal("recording the session's project", err)
	}
	// Revived meanwhile from the record read before: it takes the project too.
	if info, ok := s.c.moveLiveSession(ws, req.GetId(), p.GetName()); ok {
		return info, nil
	}
	return stored, nil
}

// moveLiveSession sets the project of a live session of the workspace in memory (marked
// to be persisted) and returns its record; ok is false when it is not in memory.
func (c *Core) moveLiveSession(ws, id, project string) (*loopsv1.Session, bool) {
	c.mu.Lock()
	st, ok := c.sessions[id]
	c.mu.Unlock()
	if !ok || st.ws != ws {
		return nil, false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.info = proto.CloneOf(st.info)
	st.info.ProjectId = project
	st.dirty = true
	return st.info, true
}

// SearchSessions finds the workspace's sessions, newest first.
func (s SessionService) SearchSessions(ctx context.Context, req *loopsv1.SearchSessionsRequest) (*loopsv1.SearchSessionsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	q, err := s.c.sessionQuery(ctx, ws, req)
	if err != nil {
		return nil, err
	}
	limit := q.Limit
	q.Limit++ // one more tells whether another page follows
	if q.Statuses != nil && !q.Statuses.Active && len(q.Statuses.EndReasons) == 0 && len(q.Statuses.EndReasonPrefixes) == 0 {
		return &loopsv1.SearchSessionsResponse{}, nil // only statuses no Loops session has
	}
	hits, err := s.c.store.SearchSessions(ctx, ws, q)
	if err != nil {
		return nil, internal("searching sessions", err)
	}
	out := &loopsv1.SearchSessionsResponse{}
	if len(hits) > limit {
		hits = hits[:limit]
		out.NextPageToken = s.c.pageTokens.Encode(ws, searchList, store.CursorOf(hits[limit-1].Session))
	}
	for _, h := range hits {
		out.Results = append(out.Results, &loopsv1.SessionSearchResult{Session: h.Session, CheckpointCount: h.CheckpointCount})
	}
	return out, nil
}

// searchList is the list name session search page tokens are bound to.
const searchList = "sessions/search"

// sessionQuery checks a search request and turns it into the store's query.
func (c *Core) sessionQuery(ctx context.Context, ws string, req *loopsv1.SearchSessionsRequest) (store.SessionQuery, error) {
	var q store.SessionQuery
	if err := noNULs(req); err != nil {
		return q, err
	}
	switch l := req.GetLimit(); {
	case l < 0 || l > store.MaxSearchLimit:
		return q, invalidArgument("limit %d is out of range: use 1 to %d (0 means %d)", l, store.MaxSearchLimit, defaultSearchLimit)
	case l == 0:
		q.Limit = defaultSearchLimit
	default:
		q.Limit = int(l)
	}
	if len(req.GetSessionId()) > maxIDBytes {
		return q, invalidArgument("session_id is %d bytes, over the maximum of %d", len(req.GetSessionId()), maxIDBytes)
	}
	q.SessionID = req.GetSessionId()
	if dn := req.GetDisplayName(); dn != "" {
		q.DisplayWords = strings.Fields(dn)
		if len(dn) > maxSearchDisplayBytes || len(q.DisplayWords) > maxSearchDisplayWords {
			return q, invalidArgument("display_name must be at most %d bytes and %d words", maxSearchDisplayBytes, maxSearchDisplayWords)
		}
		if len(q.DisplayWords) == 0 {
			return q, invalidArgument("display_name has no words: give at least one non-space character, or leave it out")
		}
	}
	if n := len(req.GetProjectIds()); n > maxSearchProjects {
		return q, invalidArgument("%d project_ids, over the maximum of %d", n, maxSearchProjects)
	}
	for _, name := range req.GetProjectIds() {
		p, err := c.ResolveProject(ctx, ws, name)
		if err != nil {
			return q, err
		}
		q.Projects = append(q.Projects, p.GetName())
	}
	if n := len(req.GetUserMetadata()); n > maxSearchLabels {
		return q, invalidArgument("%d user_metadata pairs, over the maximum of %d", n, maxSearchLabels)
	}
	for k, v := range req.GetUserMetadata() {
		if k == "" || len(k) > store.MaxLabelKeyBytes || len(v) > store.MaxLabelValueBytes {
			return q, invalidArgument("user_metadata key %q: keys are 1 to %d bytes and values at most %d bytes (longer ones are not searchable)", clip(k), store.MaxLabelKeyBytes, store.MaxLabelValueBytes)
		}
	}
	q.Metadata = req.GetUserMetadata()
	if n := len(req.GetTags()); n > maxSearchLabels {
		return q, invalidArgument("%d tags, over the maximum of %d", n, maxSearchLabels)
	}
	for _, t := range req.GetTags() {
		if t == "" || len(t) > store.MaxLabelKeyBytes {
			return q, invalidArgument("tag %q: tags are 1 to %d bytes (longer ones are not searchable)", clip(t), store.MaxLabelKeyBytes)
		}
	}
	q.Tags = req.GetTags()
	var err error
	if q.CreatedAfter, err = searchTime("created_after", req.GetCreatedAfter()); err != nil {
		return q, err
	}
	if q.CreatedBefore, err = searchTime("created_before", req.GetCreatedBefore()); err != nil {
		return q, err
	}
	if q.Statuses, err = statusMatch(req.GetStatuses()); err != nil {
		return q, err
	}
	if n := len(req.GetOwners()); n > maxSearchOwners {
		return q, invalidArgument("%d owners, over the maximum of %d", n, maxSearchOwners)
	}
	for _, o := range req.GetOwners() {
		if o == "" || len(o) > maxIDBytes {
			return q, invalidArgument("owner %q: an owner is an API key id (key-<16 hex>)", clip(o))
		}
	}
	q.Owners = req.GetOwners()
	if req.GetOwn() {
		me := auth.CallerOf(ctx).KeyID
		if len(q.Owners) > 0 && !slices.Contains(q.Owners, me) {
			q.Statuses = &store.StatusMatch{} // own and only other owners: nothing matches
		}
		q.Owners = []string{me}
	}
	switch {
	case req.GetPageToken() != "" && req.GetAfter() != nil:
		return q, invalidArgument("give page_token or after, not both")
	case req.GetPageToken() != "":
		if q.After, err = c.pageTokens.Decode(ws, searchList, req.GetPageToken()); err != nil {
			return q, invalidArgument("page_token: %v", err)
		}
	case req.GetAfter() != nil:
		a := req.GetAfter()
		if a.GetSessionId() == "" || len(a.GetSessionId()) > maxIDBytes {
			return q, invalidArgument("after.session_id must be a session id (1 to %d bytes)", maxIDBytes)
		}
		t, err := searchTime("after.create_time", a.GetCreateTime())
		if err != nil || t.IsZero() {
			return q, invalidArgument("after.create_time must be a valid time: pass the previous page's cursor unchanged")
		}
		q.After = &store.Cursor{CreateTime: t, ID: a.GetSessionId()}
	}
	return q, nil
}

// searchTime checks a search's time bound; unset is the zero time (no bound).
func searchTime(field string, ts *timestamppb.Timestamp) (time.Time, error) {
	if ts == nil {
		return time.Time{}, nil
	}
	if err := ts.CheckValid(); err != nil {
		return time.Time{}, invalidArgument("%s is not a valid time: %v", field, err)
	}
	t := ts.AsTime()
	if t.Year() < 1678 || t.Year() > 2261 { // unix nanoseconds in an int64
		return time.Time{}, invalidArgument("%s is out of range: use a time between the years 1678 and 2261", field)
	}
	return t, nil
}

// statusMatch turns a search's statuses into the store's condition (nil: any status).
func statusMatch(statuses []string) (*store.StatusMatch, error) {
	if len(statuses) == 0 {
		return nil, nil
	}
	if len(statuses) > maxSearchStatuses {
		return nil, invalidArgument("%d statuses, over the maximum of %d", len(statuses), maxSearchStatuses)
	}
	m := &store.StatusMatch{}
	for _, st := range statuses {
		switch reason, finished := strings.CutPrefix(st, "finished:"); {
		case st == "active":
			m.Active = true
		case st == "finished":
			m.EndReasonPrefixes = append(m.EndReasonPrefixes, "finished: ")
		case finished && reason != "" && len(reason) <= 64:
			m.EndReasons = append(m.EndReasons, "finished: "+reason)
		case st == "timed_out":
			m.EndReasons = append(m.EndReasons, "heartbeat timeout")
		case st == "failed" || st == "cancelled":
			// Loops never fails or cancels a session: these match none.
		default:
			return nil, invalidArgument("status %q is not one of active, finished, finished:<reason>, timed_out, failed, cancelled", clip(st))
		}
	}
	return m, nil
}

// noNULs refuses a search with a NUL character in any of its strings: no stored session
// label or column holds one.
func noNULs(req *loopsv1.SearchSessionsRequest) error {
	all := []string{req.GetSessionId(), req.GetDisplayName(), req.GetPageToken(), req.GetAfter().GetSessionId()}
	all = append(all, req.GetProjectIds()...)
	all = append(all, req.GetTags()...)
	all = append(all, req.GetStatuses()...)
	all = append(all, req.GetOwners()...)
	for k, v := range req.GetUserMetadata() {
		all = append(all, k, v)
	}
	for _, s := range all {
		if strings.ContainsRune(s, 0) {
			return invalidArgument("a search's strings must not contain NUL characters")
		}
	}
	return nil
}

// indexBatch is how many sessions indexOldSessions reads at once.
const indexBatch = 500

// indexOldSessions writes again, once, the sessions stored before sessions were indexed for
// search (schema version 6), so that a search finds them by project, status, display name,
// user_metadata and tags (their owner stays unknown). It runs in the background from start-up
// until every such session is written or ctx ends; a session changed meanwhile by a request
// is written by that request instead (its record in memory is the newer one).
func (c *Core) indexOldSessions(ctx context.Context) {
	after, n := "", 0
	for ctx.Err() == nil {
		batch, err := c.store.ListUnindexedSessions(ctx, after, indexBatch)
		if err != nil {
			if ctx.Err() == nil {
				c.log.Error("indexing sessions stored before search existed", slog.Any("err", err))
			}
			return
		}
		for _, o := range batch {
			after = o.Session.GetId()
			if err := c.indexOldSession(ctx, o.Workspace, after); err != nil {
				if ctx.Err() == nil {
					c.log.Error("indexing a session stored before search existed", slog.String("session", after), slog.Any("err", err))
				}
				return
			}
			n++
		}
		if len(batch) < indexBatch {
			break
		}
	}
	if n > 0 {
		c.log.Info("indexed sessions stored before search existed", slog.Int("count", n))
	}
}

// indexOldSession writes a session's newest record again: a live one's from memory, a
// stored one's as the store has it now, under the workspace's project lock, which
// SetSessionProject also holds while it rewrites a stored session, so neither write
// undoes the other.
func (c *Core) indexOldSession(ctx context.Context, ws, id string) error {
	unlock := projectLocks.lock(ws)
	defer unlock()
	c.mu.Lock()
	st, live := c.sessions[id]
	c.mu.Unlock()
	if live && st.ws == ws {
		st.mu.Lock()
		st.dirty = true
		st.mu.Unlock()
		c.persistSession(ctx, st)
		return nil
	}
	stored, err := c.store.GetSession(ctx, ws, id)
	if err != nil {
		return err
	}
	return c.store.PutSession(ctx, ws, stored)
}
