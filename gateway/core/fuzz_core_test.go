package core_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// The core fuzz target drives every loops.v1 request type through the real core into the
// reference engine. An input is [method selector, fix-up bits, fix-up choices (8 bytes),
// protobuf-encoded request]. Fix-ups replace fuzzed string fields by ids that exist (a run,
// a sampler, a checkpoint path, the model), so the fuzzer gets past "not found" into the
// validation and the engine. The harness has no recover: a panic anywhere fails it, and so
// does a panic that the core's guards caught (they log it) or an internal error, since a
// client's request must get a 4xx or succeed.

// fuzzMethod is one loops.v1 method: its service and name, and how to call it.
type fuzzMethod struct {
	name string
	req  reflect.Type // the request message type (a pointer type)
	call reflect.Value
}

// fuzzEnv is the core the fuzz target drives, built once per run of the target (a fuzzing
// worker process runs it once and calls the fuzz function many times).
type fuzzEnv struct {
	core    *core.Core
	svc     core.Services
	methods []fuzzMethod
	ctx     context.Context
	ids     []string // values the fix-ups substitute into string fields
	panics  *panicLog
}

// panicLog is a slog handler that remembers records about caught panics.
type panicLog struct {
	mu   sync.Mutex
	msgs []string
}

func (p *panicLog) Enabled(context.Context, slog.Level) bool { return true }
func (p *panicLog) WithAttrs([]slog.Attr) slog.Handler       { return p }
func (p *panicLog) WithGroup(string) slog.Handler            { return p }
func (p *panicLog) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "panicked") {
		return nil
	}
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	p.mu.Lock()
	p.msgs = append(p.msgs, b.String())
	p.mu.Unlock()
	return nil
}

func (p *panicLog) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.msgs
	p.msgs = nil
	return out
}

func newFuzzEnv(tb testing.TB) (*fuzzEnv, error) {
	dir := tb.TempDir()
	if err := tiny.Write(filepath.Join(dir, "models", "loops-tiny")); err != nil {
		return nil, err
	}
	eng, err := reference.New(reference.Options{DataDir: dir, Threads: 1})
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "loops.db"))
	if err != nil {
		return nil, err
	}
	panics := &panicLog{}
	// Small work limits keep every input well under the fuzzing engine's 10 s per-call
	// deadline on one thread (the limits themselves are tested elsewhere).
	c, err := core.New(ctx, st, eng, core.Options{
		DataDir: dir, GapTimeout: 5 * time.Millisecond, Logger: slog.New(panics),
		MaxBatchTokens: 2048, MaxDatumsPerRequest: 16, MaxSamplesPerRequest: 2, SamplingConcurrency: 1,
	})
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	tb.Cleanup(func() {
		_ = c.Close()
		_ = st.Close()
	})
	e := &fuzzEnv{core: c, svc: c.Services(), ctx: auth.WithWorkspace(ctx, "ws-fuzz"), panics: panics}
	e.methods = loopsMethods(e.svc)

	// A run with a checkpoint and a sampler, so fix-ups can point requests at real things.
	wait := func(op *loopsv1.Operation, err error) (*loopsv1.Operation, error) {
		if err != nil {
			return nil, err
		}
		done, err := e.svc.Operations.WaitOperation(e.ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(30 * time.Second)})
		if err == nil && done.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED {
			err = fmt.Errorf("setup operation %s: %s", done.GetKind(), done.GetError().GetMessage())
		}
		return done, err
	}
	sess, err := e.svc.Sessions.CreateSession(e.ctx, &loopsv1.CreateSessionRequest{})
	if err != nil {
		return nil, err
	}
	op, err := wait(e.svc.Training.CreateTrainingRun(e.ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: tiny.Name, SessionId: sess.GetId(), Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true, TrainMlp: true},
	}))
	if err != nil {
		return nil, err
	}
	run := op.GetTrainingRunId()
	save, err := wait(e.svc.Training.SaveWeights(e.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Name: "ck", Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING}))
	if err != nil {
		return nil, err
	}
	sampler, err := e.svc.Sampling.CreateSampler(e.ctx, &loopsv1.CreateSamplerRequest{ModelPath: save.GetSaveWeights().GetPath()})
	if err != nil {
		return nil, err
	}
	e.ids = []string{run, sampler.GetId(), save.GetSaveWeights().GetPath(), tiny.Name, sess.GetId(), op.GetId(), "cross_entropy", "ppo"}
	return e, nil
}

// loopsMethods lists every unary method of the core's loops.v1 services, in a stable order.
func loopsMethods(svc core.Services) []fuzzMethod {
	ctxType := reflect.TypeFor[context.Context]()
	msgType := reflect.TypeFor[proto.Message]()
	var out []fuzzMethod
	sv := reflect.ValueOf(svc)
	for i := range sv.NumField() {
		f := sv.Field(i)
		for j := range f.NumMethod() {
			m := f.Method(j)
			mt := m.Type()
			if mt.NumIn() != 2 || mt.NumOut() != 2 || mt.In(0) != ctxType || !mt.In(1).Implements(msgType) {
				continue
			}
			out = append(out, fuzzMethod{name: sv.Type().Field(i).Name + "." + f.Type().Method(j).Name, req: mt.In(1), call: m})
		}
	}
	slices.SortFunc(out, func(a, b fuzzMethod) int { return strings.Compare(a.name, b.name) })
	return out
}

// fixUp replaces top-level string fields whose bit is set in mask by one of the known ids.
func (e *fuzzEnv) fixUp(m protoreflect.Message, mask byte, choice uint64) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.Kind() != protoreflect.StringKind || fd.IsList() || fd.IsMap() || mask&(1<<(i%8)) == 0 {
			continue
		}
		m.Set(fd, protoreflect.ValueOfString(e.ids[choice%uint64(len(e.ids))]))
		choice /= uint64(len(e.ids))
	}
}

// serverFault reports whether an error is the server's fault (a client's request must
// never cause one).
func serverFault(code connect.Code) bool {
	return code == connect.CodeInternal || code == connect.CodeUnknown || code == connect.CodeDataLoss
}

func (e *fuzzEnv) exercise(t *testing.T, data []byte) {
	if len(data) < 10 {
		return
	}
	m := e.methods[int(data[0])%len(e.methods)]
	req := reflect.New(m.req.Elem()).Interface().(proto.Message)
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data[10:], req); err != nil {
		return
	}
	e.fixUp(req.ProtoReflect(), data[1], binary.LittleEndian.Uint64(data[2:10]))
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
	defer cancel()
	out := m.call.Call([]reflect.Value{reflect.ValueOf(ctx), reflect.ValueOf(req)})
	if err, _ := out[1].Interface().(error); err != nil {
		if serverFault(connect.CodeOf(err)) {
			t.Fatalf("%s(%v) answered a server error: %v", m.name, req, err)
		}
	} else if op, ok := out[0].Interface().(*loopsv1.Operation); ok {
		// Long work (a long sample, work queued behind earlier inputs) may still be running;
		// that is not a fault, so only a finished operation is judged.
		done, err := e.svc.Operations.WaitOperation(e.ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(5 * time.Second)})
		if err != nil {
			t.Fatalf("%s(%v): waiting for its operation: %v", m.name, req, err)
		}
		if code := connect.Code(done.GetError().GetCode()); done.GetError() != nil && serverFault(code) {
			t.Fatalf("%s(%v): its operation failed with a server error: %s", m.name, req, done.GetError().GetMessage())
		}
	}
	if p := e.panics.take(); len(p) > 0 {
		t.Fatalf("%s(%v) caused a panic in the server: %s", m.name, req, p[0])
	}
}

// fuzzSeed encodes a seed input for the method named name.
func fuzzSeed(methods []fuzzMethod, name string, mask byte, choice uint64, req proto.Message) []byte {
	i := slices.IndexFunc(methods, func(m fuzzMethod) bool { return m.name == name })
	if i < 0 {
		panic("no method " + name)
	}
	b := []byte{byte(i), mask}
	b = binary.LittleEndian.AppendUint64(b, choice)
	enc, err := proto.Marshal(req)
	if err != nil {
		panic(err)
	}
	return append(b, enc...)
}

func FuzzCore(f *testing.F) {
	e, err := newFuzzEnv(f)
	if err != nil {
		f.Fatal(err)
	}
	// fix-up choices: index into e.ids (0 run, 1 sampler, 2 checkpoint path, 3 model, …),
	// consumed one per fixed-up field in field order.
	const run, sampler, path, model = 0, 1, 2, 3
	tt := []int64{2, 3, 4, 5}
	w := []float32{1, 1, 1, 1}
	datum := &loopsv1.Datum{Tokens: []int32{1, 2, 3, 4}, LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tt},
		"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
	}}
	wrapped := proto.CloneOf(datum)
	wrapped.LossFnInputs["target_tokens"].Shape = []int64{4, 4611686018427387905}
	wrapped.LossFnInputs["weights"].Shape = []int64{4, 4611686018427387905}
	for _, s := range []struct {
		name   string
		mask   byte
		choice uint64
		req    proto.Message
	}{
		{"Training.ForwardBackward", 1, run, &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum}}},
		{"Training.ForwardBackward", 1, run, &loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{wrapped}}},
		{"Training.OptimStep", 1, run, &loopsv1.OptimStepRequest{Adam: &loopsv1.AdamParams{LearningRate: 1e-3}}},
		{"Training.SaveWeights", 1, run, &loopsv1.SaveWeightsRequest{Name: "x", Overwrite: true, TtlSeconds: proto.Int64(1 << 62)}},
		{"Training.LoadWeights", 3, run + path*8, &loopsv1.LoadWeightsRequest{WithOptimizer: true}},
		{"Training.CreateTrainingRun", 1, model, &loopsv1.CreateTrainingRunRequest{Lora: &loopsv1.LoraConfig{Rank: 1 << 30, TrainMlp: true}}},
		{"Sampling.Sample", 1, sampler, &loopsv1.SampleRequest{Prompt: []int32{1, 2}, NumSamples: 2, Params: &loopsv1.SamplingParams{MaxTokens: 4, Temperature: 1}}},
		{"Sampling.CreateSampler", 2, path, &loopsv1.CreateSamplerRequest{}},
		{"Checkpoints.SetCheckpointTTL", 1, path, &loopsv1.SetCheckpointTTLRequest{TtlSeconds: proto.Int64(10_000_000_000)}},
		{"Checkpoints.GetCheckpointArchiveURL", 1, path, &loopsv1.GetCheckpointArchiveURLRequest{}},
		{"Training.ListTrainingRuns", 0, 0, &loopsv1.ListTrainingRunsRequest{Limit: -1, Offset: 1 << 30}},
		{"Usage.GetUsage", 0, 0, &loopsv1.GetUsageRequest{}},
		{"Deployments.CreateDeployment", 0, 0, &loopsv1.CreateDeploymentRequest{Name: "d", Checkpoints: []string{e.ids[path]}, Replicas: 2}},
		{"Deployments.GrantDeployment", 0, 0, &loopsv1.GrantDeploymentRequest{Name: "d", Workspace: "ws-other"}},
		{"Deployments.RevokeDeployment", 0, 0, &loopsv1.RevokeDeploymentRequest{Name: "d", Workspace: "ws-other"}},
		{"Deployments.GetDeployment", 0, 0, &loopsv1.GetDeploymentRequest{Name: "d", Owner: "ws-other"}},
		{"Deployments.ListDeployments", 0, 0, &loopsv1.ListDeploymentsRequest{}},
		{"Deployments.DeleteDeployment", 0, 0, &loopsv1.DeleteDeploymentRequest{Name: "d"}},
		{"Sampling.CreateSampler", 0, 0, &loopsv1.CreateSamplerRequest{Deployment: "ws-fuzz:d/ck"}},
		{"Checkpoints.DeleteCheckpoint", 1, path, &loopsv1.DeleteCheckpointRequest{}},
	} {
		f.Add(fuzzSeed(e.methods, s.name, s.mask, s.choice, s.req))
	}
	f.Fuzz(func(t *testing.T, data []byte) { e.exercise(t, data) })
}

// TestFuzzCoreCoversEveryMethod keeps the fuzz target honest: it must reach every unary
// method of every loops.v1 service the core implements.
func TestFuzzCoreCoversEveryMethod(t *testing.T) {
	methods := loopsMethods(core.Services{})
	var names []string
	for _, m := range methods {
		names = append(names, m.name)
	}
	for _, want := range []string{"Training.ForwardBackward", "Training.OptimStep", "Training.SaveWeights", "Training.LoadWeights",
		"Training.CreateTrainingRun", "Training.UnloadTrainingRun", "Sampling.Sample", "Sampling.CreateSampler",
		"Checkpoints.DeleteCheckpoint", "Checkpoints.SetCheckpointPublic", "Sessions.CreateSession", "Operations.WaitOperation",
		"Models.ListModels", "Usage.GetUsage", "Deployments.CreateDeployment", "Deployments.GrantDeployment",
		"Deployments.RevokeDeployment", "Deployments.DeleteDeployment", "Deployments.GetDeployment", "Deployments.ListDeployments"} {
		require.Contains(t, names, want)
	}
}
