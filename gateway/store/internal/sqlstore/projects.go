package sqlstore

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// PutSessionLabels is the insert of a session's labels (store.SessionLabels), to run in
// the transaction of its PutSession, after it: only while the session has none (a session's
// tags and user_metadata never change), and only when the session is the workspace's. ok is false when the session has no labels.
func PutSessionLabels(workspace string, m *loopsv1.Session) (q Query, ok bool) {
	labels := store.SessionLabels(m)
	if len(labels) == 0 {
		return Query{}, false
	}
	args := []any{m.GetId(), workspace}
	var b strings.Builder
	b.WriteString(`INSERT INTO session_labels (session_id, workspace, kind, name, value)
		SELECT $1, $2, column1, column2, column3 FROM (VALUES `)
	for i, l := range labels {
		if i > 0 {
			b.WriteString(", ")
		}
		n := len(args)
		fmt.Fprintf(&b, "($%d, $%d, $%d)", n+1, n+2, n+3)
		args = append(args, l.Kind, l.Name, l.Value)
	}
	// Both conditions are evaluated once, not per label: a session's later puts (its
	// heartbeats' bookkeeping) find its labels there and insert nothing.
	b.WriteString(`) AS l WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $1 AND workspace = $2)
		AND NOT EXISTS (SELECT 1 FROM session_labels WHERE session_id = $1)
		ON CONFLICT (session_id, kind, name) DO NOTHING`)
	return Query{SQL: b.String(), Args: args}, true
}

// ListUnindexedSessions selects (workspace, data) of the sessions stored before migration
// 0006 (whose project column is still empty: every later write sets it), by id after $1,
// at most $2.
const ListUnindexedSessions = `SELECT workspace, data FROM sessions WHERE project = '' AND id > $1 ORDER BY id LIMIT $2`

// Projects.
const (
	ListProjects  = `SELECT workspace, data FROM projects WHERE workspace = $1 ORDER BY name`
	DeleteProject = `DELETE FROM projects WHERE workspace = $1 AND name = $2
		AND NOT EXISTS (SELECT 1 FROM sessions WHERE workspace = $1 AND project = $3)`
)

// GetProject is the lookup of a project by name.
func GetProject(workspace, name string) Get[*loopsv1.Project] {
	return get("project", name, NewProject, `SELECT data FROM projects WHERE workspace = $1 AND name = $2`, workspace, name)
}

// CreateProject is the insert of a project; it changes no row when the name is taken.
func CreateProject(workspace string, p *loopsv1.Project) (Query, error) {
	if p.GetName() == "" {
		return Query{}, fmt.Errorf("create project: missing name")
	}
	data, err := proto.Marshal(p)
	if err != nil {
		return Query{}, fmt.Errorf("create project %s: encode: %w", p.GetName(), err)
	}
	return Query{SQL: `INSERT INTO projects (workspace, name, create_time, data) VALUES ($1, $2, $3, $4)
		ON CONFLICT (workspace, name) DO NOTHING`, Args: []any{workspace, p.GetName(), Nanos(p.GetCreateTime()), data}}, nil
}

// DeleteProjectArgs are DeleteProject's arguments. The default project is never deleted by
// the core; its sessions stored without a project are not counted here.
func DeleteProjectArgs(workspace, name string) []any { return []any{workspace, name, name} }

// projectValues is what a session's project column holds for a project name.
func projectValues(name string) []string {
	if name == store.DefaultProject {
		return []string{name, ""}
	}
	return []string{name}
}

// ListProjectTrainingRuns lists the runs of the sessions of one project: arguments
// ListProjectTrainingRunsArgs.
var ListProjectTrainingRuns = ListQuery{
	From: `SELECT data FROM training_runs WHERE workspace = $1
		AND session_id IN (SELECT id FROM sessions WHERE workspace = $1 AND project IN ($2, $3))`,
	Count: `SELECT count(*) FROM training_runs WHERE workspace = $1
		AND session_id IN (SELECT id FROM sessions WHERE workspace = $1 AND project IN ($2, $3))`,
}

// ListProjectTrainingRunsArgs are ListProjectTrainingRuns' arguments.
func ListProjectTrainingRunsArgs(workspace, project string) []any {
	v := projectValues(project)
	return []any{workspace, v[0], v[len(v)-1]}
}

// SearchSessions is the query of a session search: it selects (data, checkpoint count)
// rows (ScanSessionHits).
func SearchSessions(workspace string, q store.SessionQuery) Query {
	args := []any{workspace}
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	in := func(vs []string) string {
		ps := make([]string, len(vs))
		for i, v := range vs {
			ps[i] = arg(v)
		}
		return "(" + strings.Join(ps, ", ") + ")"
	}
	var b strings.Builder
	// The checkpoint count goes from the session's runs (training_runs_by_session) to their
	// checkpoints (checkpoints_by_run), never through the workspace's other checkpoints.
	b.WriteString(`SELECT s.data, (SELECT count(*) FROM checkpoints c WHERE c.workspace = s.workspace
		AND c.training_run_id IN (SELECT r.id FROM training_runs r WHERE r.session_id = s.id AND r.workspace = s.workspace))
		FROM sessions s WHERE s.workspace = $1`)
	if q.SessionID != "" || len(q.DisplayWords) > 0 {
		var or []string
		if q.SessionID != "" {
			or = append(or, "s.id = "+arg(q.SessionID))
		}
		if len(q.DisplayWords) > 0 {
			var and []string
			for _, w := range q.DisplayWords {
				and = append(and, `lower(s.display_name) LIKE `+arg("%"+likeEscape(asciiLower(w))+"%")+` ESCAPE '\'`)
			}
			or = append(or, "("+strings.Join(and, " AND ")+")")
		}
		b.WriteString(" AND (" + strings.Join(or, " OR ") + ")")
	}
	if len(q.Projects) > 0 {
		var vs []string
		for _, p := range q.Projects {
			vs = append(vs, projectValues(p)...)
		}
		b.WriteString(" AND s.project IN " + in(vs))
	}
	label := func(kind, name, value string) {
		b.WriteString(` AND EXISTS (SELECT 1 FROM session_labels l WHERE l.workspace = $1 AND l.session_id = s.id AND l.kind = ` +
			arg(kind) + ` AND l.name = ` + arg(name) + ` AND l.value = ` + arg(value) + `)`)
	}
	for _, t := range sortedUnique(q.Tags) {
		label(store.LabelTag, t, "")
	}
	keys := make([]string, 0, len(q.Metadata))
	for k := range q.Metadata {
		keys = append(keys, k)
	}
	for _, k := range sortedUnique(keys) {
		label(store.LabelMetadata, k, q.Metadata[k])
	}
	if !q.CreatedAfter.IsZero() {
		b.WriteString(" AND s.create_time >= " + arg(q.CreatedAfter.UnixNano()))
	}
	if !q.CreatedBefore.IsZero() {
		b.WriteString(" AND s.create_time < " + arg(q.CreatedBefore.UnixNano()))
	}
	if st := q.Statuses; st != nil {
		or := []string{"1 = 0"}
		if st.Active {
			or = append(or, "s.status = ''")
		}
		if len(st.EndReasons) > 0 {
			or = append(or, "s.status IN "+in(st.EndReasons))
		}
		for _, p := range st.EndReasonPrefixes {
			or = append(or, `s.status LIKE `+arg(likeEscape(p)+"%")+` ESCAPE '\'`)
		}
		b.WriteString(" AND (" + strings.Join(or, " OR ") + ")")
	}
	if len(q.Owners) > 0 {
		b.WriteString(" AND s.owner IN " + in(q.Owners))
	}
	if c := q.After; c != nil {
		b.WriteString(" AND (s.create_time, s.id) < (" + arg(c.CreateTime.UnixNano()) + ", " + arg(c.ID) + ")")
	}
	b.WriteString(" ORDER BY s.create_time DESC, s.id DESC LIMIT " + arg(int64(store.SearchLimit(q.Limit))))
	return Query{SQL: b.String(), Args: args}
}

// ScanSessionHits reads the rows of SearchSessions (never nil).
func ScanSessionHits(rows Rows) ([]store.SessionHit, error) {
	out := []store.SessionHit{}
	for rows.Next() {
		var data []byte
		var n int64
		if err := rows.Scan(&data, &n); err != nil {
			return nil, err
		}
		m := NewSession()
		if err := proto.Unmarshal(data, m); err != nil {
			return nil, fmt.Errorf("decode: %w", err)
		}
		out = append(out, store.SessionHit{Session: m, CheckpointCount: n})
	}
	return out, rows.Err()
}

// likeEscape escapes LIKE's wildcards and its escape character '\'.
func likeEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

// asciiLower lowers ASCII letters only, as SQLite's lower() does.
func asciiLower(s string) string {
	return strings.Map(func(r rune) rune {
		if 'A' <= r && r <= 'Z' {
			return r + ('a' - 'A')
		}
		return r
	}, s)
}

// sortedUnique returns the distinct strings of in, sorted.
func sortedUnique(in []string) []string {
	out := append([]string(nil), in...)
	slices.Sort(out)
	return slices.Compact(out)
}

// NewProject is the constructor of a project's message.
func NewProject() *loopsv1.Project { return &loopsv1.Project{} }
