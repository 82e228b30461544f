package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// accessView is the Access page: the request form, the requests the key may see (an
// admin's: the workspace's, with grant and deny forms on pending ones; a member's: its
// own), and, for admins, the webhook deliveries.
type accessView struct {
	Requests   []*loopsv1.AccessRequest
	Admin      bool
	Deliveries []*loopsv1.WebhookDelivery
	Models     []*loopsv1.ModelInfo
	Message    string
}

func (c *Console) accessPage(w http.ResponseWriter, r *http.Request, s *session) error {
	if c.svc.Access == nil {
		c.fail(w, r, http.StatusNotFound, "this server keeps no access requests")
		return nil
	}
	list, err := c.svc.Access.ListAccessRequests(r.Context(), &loopsv1.ListAccessRequestsRequest{})
	if err != nil {
		return err
	}
	v := accessView{Requests: list.GetRequests()}
	// Only an admin may list deliveries: that answer is how the page knows it is one.
	ds, err := c.svc.Access.ListWebhookDeliveries(r.Context(), &loopsv1.ListWebhookDeliveriesRequest{Limit: 50})
	switch {
	case err == nil:
		v.Admin, v.Deliveries = true, ds.GetDeliveries()
	case connect.CodeOf(err) != connect.CodePermissionDenied:
		return err
	}
	if ws, err := c.svc.Workspace.GetWorkspace(r.Context(), &loopsv1.GetWorkspaceRequest{}); err == nil {
		v.Models = ws.GetLimits().GetModels()
	}
	if msg := r.URL.Query().Get("done"); len(msg) <= 200 {
		v.Message = msg
	}
	c.render(w, http.StatusOK, "access", "Access requests", "access", s, v)
	return nil
}

// formInt reads a whole, non-negative number field of a form (empty: 0).
func formInt(r *http.Request, name string) (int32, error) {
	v := strings.TrimSpace(r.PostForm.Get(name))
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 0 {
		return 0, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s %q: give a whole number of 0 or more, or leave it empty", name, v))
	}
	return int32(n), nil
}

func backToAccess(w http.ResponseWriter, r *http.Request, done string) {
	http.Redirect(w, r, Prefix+"access?"+url.Values{"done": {done}}.Encode(), http.StatusSeeOther)
}

func (c *Console) accessRequest(w http.ResponseWriter, r *http.Request, s *session) error {
	if c.svc.Access == nil {
		return connect.NewError(connect.CodeNotFound, errors.New("this server keeps no access requests"))
	}
	a := &loopsv1.AccessAmounts{Model: strings.TrimSpace(r.PostForm.Get("model"))}
	var err error
	for _, f := range []struct {
		name string
		dst  *int32
	}{{"max_sequence_length", &a.MaxSequenceLength}, {"max_lora_rank", &a.MaxLoraRank}, {"max_concurrent_runs", &a.MaxConcurrentRuns}} {
		if *f.dst, err = formInt(r, f.name); err != nil {
			return err
		}
	}
	req, err := c.svc.Access.RequestAccess(r.Context(), &loopsv1.RequestAccessRequest{Amounts: a, Reason: r.PostForm.Get("reason")})
	if err != nil {
		return err
	}
	backToAccess(w, r, "request "+req.GetId()+" is pending")
	return nil
}

func (c *Console) accessDecide(w http.ResponseWriter, r *http.Request, s *session) error {
	if c.svc.Access == nil {
		return connect.NewError(connect.CodeNotFound, errors.New("this server keeps no access requests"))
	}
	id, reason := r.PostForm.Get("id"), r.PostForm.Get("reason")
	switch r.PostForm.Get("decision") {
	case "grant":
		hours, err := formInt(r, "hours")
		if err != nil {
			return err
		}
		if _, err := c.svc.Access.GrantAccessRequest(r.Context(), &loopsv1.GrantAccessRequestRequest{Id: id, Reason: reason, DurationSeconds: int64(hours) * 3600}); err != nil {
			return err
		}
		backToAccess(w, r, "granted "+id)
	case "deny":
		if _, err := c.svc.Access.DenyAccessRequest(r.Context(), &loopsv1.DenyAccessRequestRequest{Id: id, Reason: reason}); err != nil {
			return err
		}
		backToAccess(w, r, "denied "+id)
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("decision: grant or deny"))
	}
	return nil
}
