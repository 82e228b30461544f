package poolsvc

import (
	"context"
	"fmt"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/pools"
	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

// fakePools is a PoolManager with one pool, "p", within 8 slots.
type fakePools struct {
	backends.Backend
	replicas int
	deleted  bool
}

func (f *fakePools) ListPools(context.Context) ([]backends.PoolInfo, error) {
	if f.deleted {
		return nil, nil
	}
	return []backends.PoolInfo{{ID: "p", Role: "trainer", BaseModel: "m", Provider: "local", DesiredReplicas: f.replicas}}, nil
}

func (f *fakePools) find(id string) error {
	if id != "p" || f.deleted {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("pool %q does not exist", id))
	}
	return nil
}

func (f *fakePools) ScalePool(_ context.Context, id string, n int) error {
	if err := f.find(id); err != nil {
		return err
	}
	if n < 0 || n > pools.MaxReplicas {
		panic(fmt.Sprintf("the service passed replicas %d on", n))
	}
	if n > 8 {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%d replicas do not fit in 8 slots", n))
	}
	f.replicas = n
	return nil
}

func (f *fakePools) DeletePool(_ context.Context, id string) error {
	if err := f.find(id); err != nil {
		return err
	}
	f.deleted = true
	return nil
}

func (f *fakePools) Allocations(_ context.Context, id string) ([]backends.Allocation, error) {
	if id != "" {
		if err := f.find(id); err != nil {
			return nil, err
		}
	}
	var out []backends.Allocation
	for i := range f.replicas {
		out = append(out, backends.Allocation{Pool: "p", Role: "trainer", Replica: i, State: backends.AllocationAttached, Adapters: []string{"run"}})
	}
	return out, nil
}

// FuzzPoolService feeds PoolService's request surface arbitrary bytes, decoded as each
// method's request in the binary (Connect, gRPC) or JSON (REST bodies) form, and calls the
// method as an operator and as a workspace: never a panic; a workspace is always refused
// with PermissionDenied; an operator's refusal is a client error (4xx) with a message, never
// a 5xx; a scale that succeeds sets a count in range; nothing out of range reaches the
// backend (the fake panics on it).
func FuzzPoolService(f *testing.F) {
	seed := func(method byte, m proto.Message, json bool) {
		var b []byte
		var err error
		if json {
			b, err = protojson.Marshal(m)
		} else {
			b, err = proto.Marshal(m)
		}
		require.NoError(f, err)
		f.Add(method, json, b)
	}
	n := func(v int32) *int32 { return &v }
	seed(0, &loopsv1.ListPoolsRequest{}, false)
	seed(1, &loopsv1.GetPoolRequest{Id: "p"}, false)
	seed(2, &loopsv1.ScalePoolRequest{Id: "p", Replicas: n(3)}, false)
	seed(2, &loopsv1.ScalePoolRequest{Id: "p", Replicas: n(-1)}, true)
	seed(2, &loopsv1.ScalePoolRequest{Id: "p", Replicas: n(2000)}, true)
	seed(2, &loopsv1.ScalePoolRequest{Id: "p"}, true)
	seed(2, &loopsv1.ScalePoolRequest{Id: "../p", Replicas: n(1)}, false)
	seed(3, &loopsv1.DeletePoolRequest{Id: "p"}, false)
	seed(4, &loopsv1.ListAllocationsRequest{PoolId: "p"}, true)
	seed(4, &loopsv1.ListAllocationsRequest{PoolId: "q/r"}, false)
	f.Add(byte(2), true, []byte(`{"id":"p","replicas":99999999999}`))
	f.Add(byte(2), true, []byte(`{"id":"p","replicas":"7"}`))
	f.Fuzz(func(t *testing.T, method byte, json bool, b []byte) {
		reqs := []proto.Message{&loopsv1.ListPoolsRequest{}, &loopsv1.GetPoolRequest{}, &loopsv1.ScalePoolRequest{},
			&loopsv1.DeletePoolRequest{}, &loopsv1.ListAllocationsRequest{}}
		req := reqs[int(method)%len(reqs)]
		var err error
		if json {
			err = protojson.Unmarshal(b, req)
		} else {
			err = proto.Unmarshal(b, req)
		}
		if err != nil {
			return // the transport answers 400 before the service sees it
		}
		fake := &fakePools{replicas: 2}
		s := New(fake)
		call := func(ctx context.Context) error {
			switch r := req.(type) {
			case *loopsv1.ListPoolsRequest:
				_, err := s.ListPools(ctx, r)
				return err
			case *loopsv1.GetPoolRequest:
				_, err := s.GetPool(ctx, r)
				return err
			case *loopsv1.ScalePoolRequest:
				p, err := s.ScalePool(ctx, r)
				if err == nil {
					require.Equal(t, r.GetReplicas(), p.GetDesiredReplicas())
					require.GreaterOrEqual(t, p.GetDesiredReplicas(), int32(0))
				}
				return err
			case *loopsv1.DeletePoolRequest:
				_, err := s.DeletePool(ctx, r)
				return err
			case *loopsv1.ListAllocationsRequest:
				_, err := s.ListAllocations(ctx, r)
				return err
			}
			return nil
		}
		err = call(auth.WithWorkspace(t.Context(), "ws"))
		require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err))
		if err := call(auth.WithOperator(t.Context())); err != nil {
			e := errs.Of(err)
			require.Less(t, e.HTTPStatus, 500, "%v", err)
			require.Equal(t, errs.User, e.Category, "%v", err)
			require.NotEmpty(t, err.Error())
			require.LessOrEqual(t, len(err.Error()), 1024, "an error does not echo the input at length")
		}
	})
}
