package pools

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"

	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/gen/go/loops/backend/v1/backendv1connect"
)

// deregisterTimeout bounds the Deregister call of a worker that stops.
const deregisterTimeout = 5 * time.Second

// ErrDrain is returned by Hold when the gateway tells the replica to stop serving.
var ErrDrain = errors.New("the gateway asked this replica to drain")

// Hold registers req at the registry url (https://…, dialled by hc, whose TLS
// configuration accepts only the gateway: mtls.Credentials.RegistryDialConfig) and keeps
// its lease with heartbeats until ctx ends
// (then it deregisters), the gateway says drain (ErrDrain) or the lease is lost for good.
// When the gateway is unreachable or forgot the lease, it registers again with the same
// incarnation. It is the Go side of what a worker does (the fake worker of poolstest uses
// it; the Python worker does the same in loops_worker/register.py).
func Hold(ctx context.Context, hc *http.Client, url string, req *backendv1.RegisterRequest) error {
	cl := backendv1connect.NewRegistryServiceClient(hc, url, connect.WithGRPC())
	backoff := 200 * time.Millisecond
	lease := "" // the last lease the gateway gave: ended when ctx ends, whatever is in flight then
	deregister := func() {
		if lease == "" {
			return
		}
		dctx, cancel := context.WithTimeout(context.Background(), deregisterTimeout)
		_, _ = cl.Deregister(dctx, &backendv1.DeregisterRequest{LeaseId: lease})
		cancel()
	}
	for {
		resp, err := cl.Register(ctx, req)
		if err != nil {
			if ctx.Err() != nil {
				deregister() // a registration again (a broken heartbeat stream) was in flight
				return nil
			}
			switch connect.CodeOf(err) {
			case connect.CodeUnauthenticated, connect.CodePermissionDenied, connect.CodeInvalidArgument, connect.CodeFailedPrecondition:
				return fmt.Errorf("registration refused: %w", err)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 200 * time.Millisecond
		lease = resp.GetLeaseId()
		err = beat(ctx, cl, resp)
		if ctx.Err() != nil {
			deregister()
			return nil
		}
		if errors.Is(err, ErrDrain) {
			return err
		}
	}
}

func beat(ctx context.Context, cl backendv1connect.RegistryServiceClient, resp *backendv1.RegisterResponse) error {
	every := time.Duration(resp.GetHeartbeatIntervalMs()) * time.Millisecond
	if every <= 0 {
		every = 2 * time.Second
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := cl.Heartbeat(sctx)
	if err != nil {
		return err
	}
	defer func() { _ = st.CloseRequest() }()
	errc := make(chan error, 1)
	go func() {
		for {
			r, err := st.Receive()
			if err != nil {
				errc <- err
				return
			}
			if r.GetDrain() {
				errc <- ErrDrain
				return
			}
		}
	}()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := st.Send(&backendv1.HeartbeatRequest{LeaseId: resp.GetLeaseId()}); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			return err
		case <-t.C:
		}
	}
}
