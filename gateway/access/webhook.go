package access

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// WebhookOptions configure the operator's webhook (loops serve --access-webhook-url,
// --access-webhook-secret-file): never a tenant's setting.
type WebhookOptions struct {
	// URL receives a POST per event; empty: no webhook.
	URL string
	// Secret keys the HMAC-SHA256 signature of each body.
	Secret []byte
	// MaxPending bounds the deliveries waiting to be sent (default 10,000); an event over
	// it is recorded as failed ("queue full"), visible to its workspace's admins.
	MaxPending int
	// MaxAttempts is how many times one delivery is tried before it is failed (default 12:
	// with the backoff, about an hour and a half).
	MaxAttempts int
	// Backoff is the wait after the first failed attempt, doubled after each (default 2 s,
	// at most MaxBackoff).
	Backoff time.Duration
	// MaxBackoff caps the wait between attempts (default 15 minutes).
	MaxBackoff time.Duration
	// Timeout bounds one attempt (default 10 s).
	Timeout time.Duration
	// Client sends the requests (default: one that follows no redirects).
	Client *http.Client
}

// The webhook's headers.
const (
	// HeaderSignature is "sha256=" and the hex HMAC-SHA256 of the body under the secret.
	HeaderSignature = "X-Loops-Signature"
	// HeaderEventID is the event's id: receivers dedupe on it (delivery is at least once).
	HeaderEventID = "X-Loops-Event-Id"
	// HeaderEvent is the event's type (access_request.created, …).
	HeaderEvent = "X-Loops-Event"
)

// deliverBatch bounds the deliveries one sweep sends.
const deliverBatch = 64

type webhook struct {
	o   WebhookOptions
	st  store.AccessStore
	now func() time.Time
	log *slog.Logger
}

func newWebhook(o WebhookOptions, st store.AccessStore, now func() time.Time, log *slog.Logger) *webhook {
	if o.MaxPending <= 0 {
		o.MaxPending = 10000
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 12
	}
	if o.Backoff <= 0 {
		o.Backoff = 2 * time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 15 * time.Minute
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Client == nil {
		o.Client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	return &webhook{o: o, st: st, now: now, log: log}
}

// Sign returns the X-Loops-Signature value of body under secret.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Verify reports whether sig is body's signature under secret (for receivers and tests).
func Verify(secret, body []byte, sig string) bool {
	return hmac.Equal([]byte(sig), []byte(Sign(secret, body)))
}

// eventBody is a webhook event as sent.
type eventBody struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	Time      time.Time       `json:"time"`
	Workspace string          `json:"workspace"`
	Request   json.RawMessage `json:"request"`
}

// event returns the webhook delivery of an event about r, to be written with it; nil when
// no webhook is configured. A full queue makes it a failed delivery (recorded, not sent).
func (s *Service) event(ctx context.Context, typ string, r *loopsv1.AccessRequest) *store.WebhookEvent {
	h := s.hook
	if h.o.URL == "" {
		return nil
	}
	now := h.now()
	req, _ := protojson.Marshal(r)
	d := &loopsv1.WebhookDelivery{Id: newID("evt"), Event: typ, RequestId: r.GetId(), State: store.WebhookPending,
		CreateTime: timestamppb.New(now), NextAttemptTime: timestamppb.New(now)}
	body, _ := json.Marshal(eventBody{ID: d.GetId(), Type: typ, Time: now.UTC(), Workspace: r.GetWorkspace(), Request: req})
	n, err := h.st.CountPendingWebhookDeliveries(ctx)
	if err == nil && n >= h.o.MaxPending {
		d.State, d.NextAttemptTime = store.WebhookFailed, nil
		d.LastError = fmt.Sprintf("the webhook queue is full (%d deliveries pending): this event was not sent", n)
		h.log.Warn("access: webhook queue full", "event", d.GetId(), "pending", n)
	}
	return &store.WebhookEvent{Workspace: r.GetWorkspace(), Delivery: d, Body: body}
}

// deliverDue sends the due deliveries, one at a time, and records each outcome.
func (h *webhook) deliverDue(ctx context.Context) {
	if h.o.URL == "" {
		return
	}
	due, err := h.st.DueWebhookDeliveries(ctx, h.now(), deliverBatch)
	if err != nil {
		h.log.Warn("access: reading webhook deliveries", "err", err)
		return
	}
	for _, ev := range due {
		if ctx.Err() != nil {
			return
		}
		d := ev.Delivery
		d.Attempts++
		err := h.send(ctx, ev)
		now := h.now()
		switch {
		case err == nil:
			d.State, d.DeliveredTime, d.NextAttemptTime, d.LastError = store.WebhookDelivered, timestamppb.New(now), nil, ""
		case int(d.GetAttempts()) >= h.o.MaxAttempts:
			d.State, d.NextAttemptTime, d.LastError = store.WebhookFailed, nil, err.Error()
			h.log.Warn("access: webhook delivery failed for good", "event", d.GetId(), "attempts", d.GetAttempts(), "err", err)
		default:
			d.NextAttemptTime, d.LastError = timestamppb.New(now.Add(h.backoff(int(d.GetAttempts())))), err.Error()
		}
		if err := h.st.UpdateWebhookDelivery(ctx, d); err != nil {
			h.log.Warn("access: recording a webhook delivery", "event", d.GetId(), "err", err)
		}
	}
}

// backoff is the wait after the n-th failed attempt: Backoff·2^(n-1), at most MaxBackoff.
func (h *webhook) backoff(n int) time.Duration {
	d := h.o.Backoff
	for i := 1; i < n && d < h.o.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, h.o.MaxBackoff)
}

func (h *webhook) send(ctx context.Context, ev store.WebhookEvent) error {
	ctx, cancel := context.WithTimeout(ctx, h.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.o.URL, bytes.NewReader(ev.Body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "loops-webhook/1")
	req.Header.Set(HeaderSignature, Sign(h.o.Secret, ev.Body))
	req.Header.Set(HeaderEventID, ev.Delivery.GetId())
	req.Header.Set(HeaderEvent, ev.Delivery.GetEvent())
	resp, err := h.o.Client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return errors.New("the receiver answered " + resp.Status)
	}
	return nil
}
