package compat

import (
	"net/http"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/httpedge"
)

// checkpointJSON is the SDK's Checkpoint.
type checkpointJSON struct {
	CheckpointID   string  `json:"checkpoint_id"`
	CheckpointType string  `json:"checkpoint_type"`
	Time           string  `json:"time"`
	TinkerPath     string  `json:"tinker_path"`
	SizeBytes      *int64  `json:"size_bytes,omitempty"`
	Public         bool    `json:"public"`
	ExpiresAt      *string `json:"expires_at,omitempty"`
}

// rfc3339 formats a timestamp; an unset one is the Unix epoch (the SDK requires a value).
func rfc3339(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return time.Unix(0, 0).UTC().Format(time.RFC3339Nano)
	}
	return ts.AsTime().UTC().Format(time.RFC3339Nano)
}

func kindSegment(k loopsv1.CheckpointKind) string {
	switch k {
	case loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER:
		return "sampler_weights"
	case loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL:
		return "external_weights"
	}
	return "weights"
}

func checkpointToJSON(c *loopsv1.Checkpoint) *checkpointJSON {
	if c == nil {
		return nil
	}
	out := &checkpointJSON{
		CheckpointID: c.GetId(), CheckpointType: "training", Time: rfc3339(c.GetCreateTime()),
		TinkerPath: c.GetTinkerPath(), Public: c.GetPublic(),
	}
	switch c.GetKind() {
	case loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER:
		out.CheckpointType = "sampler"
	case loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL:
		out.CheckpointType = "external"
	}
	if out.CheckpointID == "" {
		out.CheckpointID = kindSegment(c.GetKind()) + "/" + c.GetName()
	}
	if out.TinkerPath == "" {
		out.TinkerPath = "tinker://" + c.GetTrainingRunId() + "/" + out.CheckpointID
	}
	if c.GetSizeBytes() > 0 {
		sz := c.GetSizeBytes()
		out.SizeBytes = &sz
	}
	if c.GetExpireTime() != nil {
		e := rfc3339(c.GetExpireTime())
		out.ExpiresAt = &e
	}
	return out
}

// trainingRunJSON is the SDK's TrainingRun.
type trainingRunJSON struct {
	TrainingRunID         string            `json:"training_run_id"`
	BaseModel             string            `json:"base_model"`
	ModelOwner            string            `json:"model_owner"`
	IsLora                bool              `json:"is_lora"`
	Corrupted             bool              `json:"corrupted"`
	LoraRank              int32             `json:"lora_rank"`
	LastRequestTime       string            `json:"last_request_time"`
	LastCheckpoint        *checkpointJSON   `json:"last_checkpoint"`
	LastSamplerCheckpoint *checkpointJSON   `json:"last_sampler_checkpoint"`
	UserMetadata          map[string]string `json:"user_metadata,omitempty"`
}

func (s *server) trainingRunToJSON(r *http.Request, t *loopsv1.TrainingRun) trainingRunJSON {
	last := t.GetLastRequestTime()
	if last == nil {
		last = t.GetCreateTime()
	}
	return trainingRunJSON{
		TrainingRunID: t.GetId(), BaseModel: t.GetBaseModel(), ModelOwner: s.opt.Owner(r.Context()), IsLora: t.GetLora().GetRank() > 0,
		Corrupted: t.GetCorrupted(), LoraRank: t.GetLora().GetRank(), LastRequestTime: rfc3339(last),
		LastCheckpoint: checkpointToJSON(t.GetLastCheckpoint()), LastSamplerCheckpoint: checkpointToJSON(t.GetLastSamplerCheckpoint()),
		UserMetadata: t.GetUserMetadata(),
	}
}

type cursorJSON struct {
	Offset     int64 `json:"offset"`
	Limit      int64 `json:"limit"`
	TotalCount int64 `json:"total_count"`
}

func (s *server) listTrainingRuns(w http.ResponseWriter, r *http.Request) error {
	limit, offset, err := queryPage(r, 20)
	if err != nil {
		return err
	}
	// project_id (RestClient.list_training_runs(project_id=...)): only the runs of that
	// project's sessions.
	res, err := s.svc.Training.ListTrainingRuns(r.Context(), &loopsv1.ListTrainingRunsRequest{
		Limit: int32(limit), Offset: int32(offset), ProjectId: r.URL.Query().Get("project_id"),
	})
	if err != nil {
		return err
	}
	out := struct {
		TrainingRuns []trainingRunJSON `json:"training_runs"`
		Cursor       cursorJSON        `json:"cursor"`
	}{TrainingRuns: []trainingRunJSON{}, Cursor: cursorJSON{Offset: int64(offset), Limit: int64(limit), TotalCount: res.GetTotalCount()}}
	for _, t := range res.GetTrainingRuns() {
		out.TrainingRuns = append(out.TrainingRuns, s.trainingRunToJSON(r, t))
	}
	s.edge.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *server) getTrainingRun(w http.ResponseWriter, r *http.Request) error {
	id, err := s.resolveModel(r.Context(), r.PathValue("run"))
	if err != nil {
		return err
	}
	t, err := s.svc.Training.GetTrainingRun(r.Context(), &loopsv1.GetTrainingRunRequest{Id: id})
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, s.trainingRunToJSON(r, t))
	return nil
}

type checkpointsList struct {
	Checkpoints []*checkpointJSON `json:"checkpoints"`
	Cursor      *cursorJSON       `json:"cursor"`
}

func (s *server) listRunCheckpoints(w http.ResponseWriter, r *http.Request) error {
	id, err := s.resolveModel(r.Context(), r.PathValue("run"))
	if err != nil {
		return err
	}
	res, err := s.svc.Checkpoints.ListCheckpoints(r.Context(), &loopsv1.ListCheckpointsRequest{TrainingRunId: id})
	if err != nil {
		return err
	}
	out := checkpointsList{Checkpoints: []*checkpointJSON{}}
	for _, c := range res.GetCheckpoints() {
		out.Checkpoints = append(out.Checkpoints, checkpointToJSON(c))
	}
	s.edge.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *server) listUserCheckpoints(w http.ResponseWriter, r *http.Request) error {
	limit, offset, err := queryPage(r, 100)
	if err != nil {
		return err
	}
	res, err := s.svc.Checkpoints.ListCheckpoints(r.Context(), &loopsv1.ListCheckpointsRequest{Limit: int32(limit), Offset: int32(offset)})
	if err != nil {
		return err
	}
	out := checkpointsList{Checkpoints: []*checkpointJSON{},
		Cursor: &cursorJSON{Offset: int64(offset), Limit: int64(limit), TotalCount: res.GetTotalCount()}}
	for _, c := range res.GetCheckpoints() {
		out.Checkpoints = append(out.Checkpoints, checkpointToJSON(c))
	}
	s.edge.WriteJSON(w, http.StatusOK, out)
	return nil
}

// checkpointPath rebuilds tinker://<run>/<kind>/<name> from the REST path.
func (s *server) checkpointPath(r *http.Request) (string, error) {
	run, kind, name := r.PathValue("run"), r.PathValue("kind"), r.PathValue("name")
	if kind != "weights" && kind != "sampler_weights" && kind != "external_weights" {
		return "", badRequest("checkpoint id %q must be weights/<name>, sampler_weights/<name> or external_weights/<name>", kind+"/"+name)
	}
	if name == "" || strings.Contains(name, "/") {
		return "", badRequest("checkpoint name %q is invalid", name)
	}
	id, err := s.resolveModel(r.Context(), run)
	if err != nil {
		return "", err
	}
	return "tinker://" + id + "/" + kind + "/" + name, nil
}

func (s *server) deleteCheckpoint(w http.ResponseWriter, r *http.Request) error {
	p, err := s.checkpointPath(r)
	if err != nil {
		return err
	}
	if _, err := s.svc.Checkpoints.DeleteCheckpoint(r.Context(), &loopsv1.DeleteCheckpointRequest{Path: p}); err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, struct{}{})
	return nil
}

func (s *server) publishCheckpoint(public bool) httpedge.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		p, err := s.checkpointPath(r)
		if err != nil {
			return err
		}
		c, err := s.svc.Checkpoints.SetCheckpointPublic(r.Context(), &loopsv1.SetCheckpointPublicRequest{Path: p, Public: public})
		if err != nil {
			return err
		}
		s.edge.WriteJSON(w, http.StatusOK, checkpointToJSON(c))
		return nil
	}
}

func (s *server) setCheckpointTTL(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		TTLSeconds *int64 `json:"ttl_seconds"`
	}
	if err := s.decodeJSONBody(w, r, &req); err != nil {
		return err
	}
	if err := checkTTL(req.TTLSeconds); err != nil {
		return err
	}
	p, err := s.checkpointPath(r)
	if err != nil {
		return err
	}
	c, err := s.svc.Checkpoints.SetCheckpointTTL(r.Context(), &loopsv1.SetCheckpointTTLRequest{Path: p, TtlSeconds: req.TTLSeconds})
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, checkpointToJSON(c))
	return nil
}

// externalWeightsURLs answers {"urls": {file: url}, "expires"} for an exported checkpoint
// (tinker 0.38's `tinker checkpoint download`); relative URLs are made absolute.
func (s *server) externalWeightsURLs(w http.ResponseWriter, r *http.Request) error {
	p, err := s.checkpointPath(r)
	if err != nil {
		return err
	}
	res, err := s.svc.Checkpoints.GetCheckpointFileURLs(r.Context(), &loopsv1.GetCheckpointFileURLsRequest{Path: p})
	if err != nil {
		return err
	}
	urls := make(map[string]string, len(res.GetUrls()))
	for name, u := range res.GetUrls() {
		urls[name] = absoluteURL(r, u)
	}
	s.edge.WriteJSON(w, http.StatusOK, map[string]any{"urls": urls, "expires": rfc3339(res.GetExpireTime())})
	return nil
}

// absoluteURL makes a server-relative URL ("/…") absolute with the request's scheme and Host.
func absoluteURL(r *http.Request, u string) string {
	if !strings.HasPrefix(u, "/") {
		return u
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if fp := r.Header.Get("X-Forwarded-Proto"); fp == "https" || fp == "http" {
		scheme = fp
	}
	return scheme + "://" + r.Host + u
}

// checkpointArchive answers 302 with the archive's URL in Location and its expiry in
// Expires (every SDK release accepts that; 0.18 accepts nothing else), and the same as JSON
// {"url","expires"} in the body. A relative URL from the core is made absolute with the
// request's scheme and Host.
func (s *server) checkpointArchive(w http.ResponseWriter, r *http.Request) error {
	p, err := s.checkpointPath(r)
	if err != nil {
		return err
	}
	res, err := s.svc.Checkpoints.GetCheckpointArchiveURL(r.Context(), &loopsv1.GetCheckpointArchiveURLRequest{Path: p})
	if err != nil {
		return err
	}
	u := absoluteURL(r, res.GetUrl())
	exp := res.GetExpireTime()
	if exp == nil {
		exp = timestamppb.New(time.Now().Add(15 * time.Minute))
	}
	w.Header().Set("Location", u)
	w.Header().Set("Expires", exp.AsTime().UTC().Format(http.TimeFormat))
	s.edge.WriteJSON(w, http.StatusFound, map[string]string{"url": u, "expires": rfc3339(exp)})
	return nil
}

func (s *server) listSessions(w http.ResponseWriter, r *http.Request) error {
	limit, offset, err := queryPage(r, 20)
	if err != nil {
		return err
	}
	res, err := s.svc.Sessions.ListSessions(r.Context(), &loopsv1.ListSessionsRequest{Limit: int32(limit), Offset: int32(offset)})
	if err != nil {
		return err
	}
	ids := []string{}
	for _, ss := range res.GetSessions() {
		ids = append(ids, ss.GetId())
	}
	s.edge.WriteJSON(w, http.StatusOK, map[string][]string{"sessions": ids})
	return nil
}

func (s *server) getSession(w http.ResponseWriter, r *http.Request) error {
	ss, err := s.svc.Sessions.GetSession(r.Context(), &loopsv1.GetSessionRequest{Id: r.PathValue("id")})
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, struct {
		TrainingRunIDs []string          `json:"training_run_ids"`
		SamplerIDs     []string          `json:"sampler_ids"`
		UserMetadata   map[string]string `json:"user_metadata,omitempty"`
		DisplayName    string            `json:"display_name,omitempty"`
	}{nonNil(ss.GetTrainingRunIds()), nonNil(ss.GetSamplerIds()), ss.GetUserMetadata(), ss.GetDisplayName()})
	return nil
}
