package core

import (
	"context"
	"errors"
	"hash/maphash"
	"slices"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Deployment bounds. Past MaxDeploymentsPerWorkspace a create is refused with 429
// (LIMIT_REACHED); the others are 400s.
const (
	// MaxDeploymentsPerWorkspace is how many deployments one workspace holds.
	MaxDeploymentsPerWorkspace = 100
	// MaxCheckpointsPerDeployment is how many checkpoints one deployment serves.
	MaxCheckpointsPerDeployment = 32
	// MaxGrantsPerDeployment is how many workspaces one deployment is shared with.
	MaxGrantsPerDeployment = 64
	// MaxDeploymentReplicas is the most replicas a deployment asks for.
	MaxDeploymentReplicas = 8
	// maxDeploymentNameLen is the longest deployment name.
	maxDeploymentNameLen = 63
)

// deploymentLocks serializes the changes to one workspace's deployments (create, delete,
// grant, revoke), so a count bound or a name holds under concurrent requests. They are
// striped by workspace: other workspaces' changes mostly take other stripes.
type deploymentLocks struct {
	seed    maphash.Seed
	stripes [64]sync.Mutex
}

var depLocks = &deploymentLocks{seed: maphash.MakeSeed()}

func (l *deploymentLocks) lock(ws string) func() {
	m := &l.stripes[maphash.String(l.seed, ws)%uint64(len(l.stripes))]
	m.Lock()
	return m.Unlock
}

// validDeploymentName checks a deployment name: 1 to 63 letters, digits, '_', '-' or '.',
// starting with a letter or digit (no '/' or ':', which the model strings use).
func validDeploymentName(name string) error {
	ok := len(name) >= 1 && len(name) <= maxDeploymentNameLen
	for i, r := range name {
		alnum := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || (r != '_' && r != '-' && r != '.')) {
			ok = false
		}
	}
	if !ok {
		return invalidArgument("deployment name %q is not allowed: use 1 to %d letters, digits, '_', '-' or '.', starting with a letter or digit", clip(name), maxDeploymentNameLen)
	}
	return nil
}

// clip shortens a user string quoted in an error.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// DeploymentRef is a parsed deployment model string: "[<owner>:]<name>[/<checkpoint>]".
type DeploymentRef struct {
	Owner, Name, Checkpoint string
}

// ParseDeploymentRef parses "[<owner>:]<name>[/<checkpoint name>]"; owner defaults to ws.
func ParseDeploymentRef(ws, s string) (DeploymentRef, error) {
	var r DeploymentRef
	rest := s
	if o, n, ok := strings.Cut(rest, ":"); ok {
		r.Owner, rest = o, n
		if auth.ValidateWorkspaceName(o) != nil {
			return r, invalidArgument("deployment %q: %q is not a workspace name (write [<owner workspace>:]<name>[/<checkpoint name>])", clip(s), clip(o))
		}
	} else {
		r.Owner = ws
	}
	r.Name, r.Checkpoint, _ = strings.Cut(rest, "/")
	if err := validDeploymentName(r.Name); err != nil {
		return r, err
	}
	return r, nil
}

// String is the canonical model string of the reference: "<owner>:<name>[/<checkpoint>]".
func (r DeploymentRef) String() string {
	s := r.Owner + ":" + r.Name
	if r.Checkpoint != "" {
		s += "/" + r.Checkpoint
	}
	return s
}

// deploymentNotFound is the answer to a deployment the workspace may not see.
func deploymentNotFound(r DeploymentRef) error {
	return notFound("deployment %q not found (it does not exist, belongs to another workspace, or was not shared with yours: see loops deploy list)", r.Owner+":"+r.Name)
}

// deploymentFor returns the deployment a workspace may sample from: its own, or another's
// that grants it.
func (c *Core) deploymentFor(ctx context.Context, ws string, r DeploymentRef) (*loopsv1.Deployment, error) {
	d, err := c.store.GetDeployment(ctx, r.Owner, r.Name)
	if errors.Is(err, store.ErrNotFound) || (err == nil && r.Owner != ws && !slices.Contains(d.GetGrants(), ws)) {
		return nil, deploymentNotFound(r)
	}
	if err != nil {
		return nil, internal("reading deployment", err)
	}
	return d, nil
}

// deploymentCheckpoint resolves a deployment model string for workspace ws: the
// deployment's checkpoint record, its owner, and the canonical string
// "<owner>:<name>/<checkpoint>". Without a checkpoint name the deployment must hold one
// checkpoint.
func (c *Core) deploymentCheckpoint(ctx context.Context, ws, model string) (*loopsv1.Checkpoint, string, string, error) {
	r, err := ParseDeploymentRef(ws, model)
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, "", "", notFound("no deployment is named %q: %s", clip(model), ce.Message())
		}
		return nil, "", "", err
	}
	d, err := c.deploymentFor(ctx, ws, r)
	if err != nil {
		return nil, "", "", err
	}
	var dc *loopsv1.DeploymentCheckpoint
	names := make([]string, 0, len(d.GetCheckpoints()))
	for _, x := range d.GetCheckpoints() {
		names = append(names, x.GetName())
		if x.GetName() == r.Checkpoint || (r.Checkpoint == "" && len(d.GetCheckpoints()) == 1) {
			dc = x
		}
	}
	if dc == nil {
		if r.Checkpoint == "" {
			for i, n := range names {
				names[i] = model + "/" + n
			}
			return nil, "", "", invalidArgument("deployment %q serves %d checkpoints: name one, as %s", r.Name, len(names), strings.Join(names, " or "))
		}
		return nil, "", "", notFound("deployment %q has no checkpoint %q: it serves %s", r.Name, clip(r.Checkpoint), strings.Join(names, ", "))
	}
	runID, kind, name, err := ParsePath(dc.GetTinkerPath())
	if err != nil {
		return nil, "", "", internal("deployment checkpoint path", err)
	}
	ck, err := c.store.GetCheckpoint(ctx, r.Owner, runID, ckfiles.KindSegment(kind)+"/"+name)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, "", "", failedPrecondition("deployment %q: its checkpoint %s is gone", r.Name, dc.GetTinkerPath())
		}
		return nil, "", "", internal("reading deployment checkpoint", err)
	}
	r.Checkpoint = dc.GetName()
	return ck, r.Owner, r.String(), nil
}

// checkDeploymentAccess says whether a sampler created on a deployment (canonical model
// string ref, resolved then to the checkpoint modelPath) may still sample for ws: the
// deployment exists, for another owner's still grants ws, and still serves modelPath under
// the sampler's checkpoint name. Deleting a deployment or revoking a grant thus stops its
// samplers at their next request, and so does replacing it (deleting it and creating one of
// the same name again): a sampler never keeps serving the old checkpoints under a name that
// now means others. The inference APIs create a new sampler on the NotFound.
func (c *Core) checkDeploymentAccess(ctx context.Context, ws, ref, modelPath string) error {
	r, err := ParseDeploymentRef(ws, ref)
	if err != nil {
		return err
	}
	d, err := c.deploymentFor(ctx, ws, r)
	if err != nil {
		return err
	}
	for _, dc := range d.GetCheckpoints() {
		if dc.GetName() == r.Checkpoint && dc.GetTinkerPath() == modelPath {
			return nil
		}
	}
	return deploymentReplaced(ref, modelPath)
}

// deploymentReplaced is the answer to a sampler whose deployment (canonical model string
// ref) no longer serves its checkpoint modelPath.
func deploymentReplaced(ref, modelPath string) error {
	return notFound("the deployment of this sampler was replaced since it was created: %q no longer serves %s; create a new sampler (the OpenAI and Anthropic routes do so by themselves)", ref, modelPath)
}

// deploymentUsage is the usage label of a deployment sampler's canonical model string:
// "<owner>:<name>" (the checkpoint left out).
func deploymentUsage(ref string) string {
	name, _, _ := strings.Cut(ref, "/")
	return name
}

// pinnedBy refuses to remove a checkpoint that deployments of its workspace hold: a 409
// (AlreadyExists) naming them. Callers hold the checkpoint's lock.
func (c *Core) pinnedBy(ctx context.Context, ws, runID, id, path string) error {
	names, err := c.store.CheckpointDeployments(ctx, ws, runID, id)
	if err != nil {
		return internal("reading the checkpoint's deployments", err)
	}
	if len(names) > 0 {
		return connect.NewError(connect.CodeAlreadyExists, errDeployed{path: path, names: names})
	}
	return nil
}

// errDeployed is the error of a deployed checkpoint's delete.
type errDeployed struct {
	path  string
	names []string
}

func (e errDeployed) Error() string {
	return "checkpoint " + e.path + " is deployed (deployment " + strings.Join(e.names, ", ") +
		"): delete the deployment first (loops deploy delete NAME)"
}

// isPinned says whether err is pinnedBy's refusal.
func isPinned(err error) bool {
	var e errDeployed
	return errors.As(err, &e)
}

// DeploymentService implements loops.v1 DeploymentService.
type DeploymentService struct{ c *Core }

// CreateDeployment deploys checkpoints of the workspace.
func (s DeploymentService) CreateDeployment(ctx context.Context, req *loopsv1.CreateDeploymentRequest) (*loopsv1.Deployment, error) {
	c := s.c
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if err := validDeploymentName(req.GetName()); err != nil {
		return nil, err
	}
	paths := req.GetCheckpoints()
	switch {
	case len(paths) == 0:
		return nil, invalidArgument("give at least one checkpoint (--checkpoint tinker://<run>/sampler_weights/<name>)")
	case len(paths) > MaxCheckpointsPerDeployment:
		return nil, invalidArgument("a deployment serves at most %d checkpoints, got %d: split them over several deployments", MaxCheckpointsPerDeployment, len(paths))
	}
	replicas := req.GetReplicas()
	if replicas == 0 {
		replicas = 1
	}
	if replicas < 1 || replicas > MaxDeploymentReplicas {
		return nil, invalidArgument("replicas must be between 1 and %d, got %d", MaxDeploymentReplicas, req.GetReplicas())
	}
	if err := c.policy.CheckDeploymentReplicas(ws, replicas); err != nil {
		return nil, err
	}
	d := &loopsv1.Deployment{
		Name: req.GetName(), Owner: ws, Replicas: replicas, CreateTime: timestamppb.New(c.now()),
	}
	pins := make([]store.CheckpointRef, 0, len(paths))
	for _, p := range paths {
		runID, kind, name, err := ParsePath(p)
		if err != nil {
			return nil, err
		}
		runID = c.canonicalRunID(ws, runID)
		id := ckfiles.KindSegment(kind) + "/" + name
		ck, err := c.store.GetCheckpoint(ctx, ws, runID, id)
		if err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return nil, notFound("checkpoint %s not found in your workspace (a deployment holds checkpoints of its own workspace)", clip(p))
			}
			return nil, internal("reading checkpoint", err)
		}
		if d.BaseModel == "" {
			d.BaseModel = ck.GetBaseModel()
		} else if ck.GetBaseModel() != d.BaseModel {
			return nil, invalidArgument("checkpoint %s is of base model %s, the deployment's first checkpoint of %s: a deployment serves checkpoints of one base model", p, ck.GetBaseModel(), d.BaseModel)
		}
		for _, x := range d.Checkpoints {
			if x.GetName() == ck.GetName() {
				return nil, invalidArgument("two checkpoints named %q (%s and %s): names address a deployment's checkpoints (<deployment>/<checkpoint>), so they must differ", ck.GetName(), x.GetTinkerPath(), ck.GetTinkerPath())
			}
		}
		d.Checkpoints = append(d.Checkpoints, &loopsv1.DeploymentCheckpoint{
			Name: ck.GetName(), TinkerPath: ck.GetTinkerPath(), TrainingRunId: runID, BaseModel: ck.GetBaseModel(), Step: ck.GetStep(),
		})
		pins = append(pins, store.CheckpointRef{RunID: runID, CheckpointID: id})
	}
	if err := c.evalLineage(ctx, ws, d, pins, req.GetRequireEvals()); err != nil {
		return nil, err
	}
	if _, err := c.model(d.BaseModel); err != nil {
		return nil, err
	}
	if err := c.policy.AllowModel(ws, d.BaseModel); err != nil {
		return nil, err
	}
	d.Models = deploymentModels(d)

	unlock := depLocks.lock(ws)
	defer unlock()
	existing, err := c.store.ListDeployments(ctx, ws)
	if err != nil {
		return nil, internal("listing deployments", err)
	}
	for _, e := range existing {
		if e.GetName() == d.Name {
			return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("deployment "+quote(d.Name)+" already exists: delete it first or pick another name"))
		}
	}
	if len(existing) >= MaxDeploymentsPerWorkspace {
		return nil, c.limitReached("LIMIT_REACHED", "max_deployments_per_workspace", "the workspace has %d deployments, the most it may hold: delete one first", len(existing))
	}
	// The pins are written first, then each checkpoint is checked again under its lock: a
	// delete that got there first has removed it (and the deployment is withdrawn), a later
	// one sees the pin.
	if err := c.store.PutDeployment(ctx, ws, d, pins); err != nil {
		return nil, internal("recording deployment", err)
	}
	for i, p := range pins {
		err := func() error {
			defer c.ckpt.Lock(ws, p.RunID, p.CheckpointID)()
			_, err := c.store.GetCheckpoint(ctx, ws, p.RunID, p.CheckpointID)
			return err
		}()
		if err != nil {
			if derr := c.store.DeleteDeployment(ctx, ws, d.Name); derr != nil {
				c.log.Error("withdrawing a deployment whose checkpoint went", "deployment", d.Name, "err", derr)
			}
			if errors.Is(err, store.ErrNotFound) {
				return nil, notFound("checkpoint %s was deleted meanwhile", paths[i])
			}
			return nil, internal("reading checkpoint", err)
		}
	}
	c.log.Info("deployment created", "workspace", ws, "deployment", d.Name, "checkpoints", len(pins))
	c.placer.Set(d.BaseModel, ws, d.Name, d.Replicas)
	return c.placer.View(d), nil
}

// deploymentModels are the OpenAI model strings of a deployment (for its owner).
func deploymentModels(d *loopsv1.Deployment) []string {
	var out []string
	if len(d.GetCheckpoints()) == 1 {
		out = append(out, d.GetName())
	}
	for _, x := range d.GetCheckpoints() {
		out = append(out, d.GetName()+"/"+x.GetName())
	}
	return out
}

// forViewer is the deployment as ws sees it: another workspace sees no grants, and model
// strings prefixed with the owner.
func forViewer(ws string, d *loopsv1.Deployment) *loopsv1.Deployment {
	if d.GetOwner() == ws {
		return d
	}
	v := &loopsv1.Deployment{
		Name: d.GetName(), Owner: d.GetOwner(), BaseModel: d.GetBaseModel(), Checkpoints: d.GetCheckpoints(),
		Replicas: d.GetReplicas(), CreateTime: d.GetCreateTime(),
	}
	for _, m := range d.GetModels() {
		v.Models = append(v.Models, d.GetOwner()+":"+m)
	}
	return v
}

// GetDeployment returns a deployment the caller owns or was granted.
func (s DeploymentService) GetDeployment(ctx context.Context, req *loopsv1.GetDeploymentRequest) (*loopsv1.Deployment, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	r := DeploymentRef{Owner: req.GetOwner(), Name: req.GetName()}
	if r.Owner == "" {
		r.Owner = ws
	} else if auth.ValidateWorkspaceName(r.Owner) != nil {
		return nil, invalidArgument("owner %q is not a workspace name", clip(r.Owner))
	}
	if err := validDeploymentName(r.Name); err != nil {
		return nil, err
	}
	d, err := s.c.deploymentFor(ctx, ws, r)
	if err != nil {
		return nil, err
	}
	return s.c.placer.View(forViewer(ws, d)), nil
}

// ListDeployments lists the caller's deployments, then those shared with it.
func (s DeploymentService) ListDeployments(ctx context.Context, _ *loopsv1.ListDeploymentsRequest) (*loopsv1.ListDeploymentsResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	own, err := s.c.store.ListDeployments(ctx, ws)
	if err != nil {
		return nil, internal("listing deployments", err)
	}
	shared, err := s.c.store.ListGrantedDeployments(ctx, ws)
	if err != nil {
		return nil, internal("listing deployments", err)
	}
	out := &loopsv1.ListDeploymentsResponse{}
	for _, d := range own {
		out.Deployments = append(out.Deployments, s.c.placer.View(d))
	}
	for _, d := range shared {
		out.Deployments = append(out.Deployments, s.c.placer.View(forViewer(ws, d)))
	}
	return out, nil
}

// DeleteDeployment deletes one of the caller's deployments.
func (s DeploymentService) DeleteDeployment(ctx context.Context, req *loopsv1.DeleteDeploymentRequest) (*loopsv1.DeleteDeploymentResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if err := validDeploymentName(req.GetName()); err != nil {
		return nil, err
	}
	defer depLocks.lock(ws)()
	if err := s.c.store.DeleteDeployment(ctx, ws, req.GetName()); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, deploymentNotFound(DeploymentRef{Owner: ws, Name: req.GetName()})
		}
		return nil, internal("deleting deployment", err)
	}
	s.c.log.Info("deployment deleted", "workspace", ws, "deployment", req.GetName())
	s.c.placer.Remove(ws, req.GetName())
	return &loopsv1.DeleteDeploymentResponse{}, nil
}

// GrantDeployment shares one of the caller's deployments with another workspace.
func (s DeploymentService) GrantDeployment(ctx context.Context, req *loopsv1.GrantDeploymentRequest) (*loopsv1.Deployment, error) {
	return s.changeGrants(ctx, req.GetName(), req.GetWorkspace(), func(d *loopsv1.Deployment, ws string) error {
		if slices.Contains(d.Grants, ws) {
			return nil
		}
		if len(d.Grants) >= MaxGrantsPerDeployment {
			return invalidArgument("deployment %q is shared with %d workspaces, the most it may be: revoke a grant first", d.GetName(), len(d.Grants))
		}
		d.Grants = append(d.Grants, ws)
		slices.Sort(d.Grants)
		return nil
	})
}

// RevokeDeployment withdraws a grant.
func (s DeploymentService) RevokeDeployment(ctx context.Context, req *loopsv1.RevokeDeploymentRequest) (*loopsv1.Deployment, error) {
	return s.changeGrants(ctx, req.GetName(), req.GetWorkspace(), func(d *loopsv1.Deployment, ws string) error {
		i := slices.Index(d.Grants, ws)
		if i < 0 {
			return notFound("deployment %q is not shared with workspace %q", d.GetName(), ws)
		}
		d.Grants = slices.Delete(d.Grants, i, i+1)
		return nil
	})
}

func (s DeploymentService) changeGrants(ctx context.Context, name, grantee string, f func(*loopsv1.Deployment, string) error) (*loopsv1.Deployment, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	if err := validDeploymentName(name); err != nil {
		return nil, err
	}
	if err := auth.ValidateWorkspaceName(grantee); err != nil {
		return nil, invalidArgument("workspace %q is not a workspace name: give the name the other API key's workspace has (loops workspace shows it)", clip(grantee))
	}
	if grantee == ws {
		return nil, invalidArgument("the deployment is your workspace's own: grant it to another workspace")
	}
	defer depLocks.lock(ws)()
	d, err := s.c.store.GetDeployment(ctx, ws, name)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, deploymentNotFound(DeploymentRef{Owner: ws, Name: name})
		}
		return nil, internal("reading deployment", err)
	}
	if err := f(d, grantee); err != nil {
		return nil, err
	}
	pins := make([]store.CheckpointRef, 0, len(d.GetCheckpoints()))
	for _, x := range d.GetCheckpoints() {
		runID, kind, n, err := ParsePath(x.GetTinkerPath())
		if err != nil {
			return nil, internal("deployment checkpoint path", err)
		}
		pins = append(pins, store.CheckpointRef{RunID: runID, CheckpointID: ckfiles.KindSegment(kind) + "/" + n})
	}
	if err := s.c.store.PutDeployment(ctx, ws, d, pins); err != nil {
		return nil, internal("recording deployment", err)
	}
	return s.c.placer.View(d), nil
}
