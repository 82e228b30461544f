package auth

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/internal/errs"
)

// DefaultMaxRequestsPerKey is how many requests one API key may have in flight at once
// unless configured otherwise: above the ~2,000 concurrent retrieve_future long-polls a
// sampling-heavy tinker script keeps open, far below what exhausts the server.
const DefaultMaxRequestsPerKey = 4096

// Policy tunes Middleware. The zero value gives the defaults noted per field.
type Policy struct {
	// Public paths need no key: matched exactly or, when they end in "/", as prefixes.
	Public []string
	// MaxRequestsPerKey caps the requests one key has in flight; one more is answered 429
	// with the reason. Default DefaultMaxRequestsPerKey; negative means no cap.
	MaxRequestsPerKey int
	// ErrorShapes answer the refusals of requests under a path prefix in that protocol's own
	// error shape: OpenAI's and Anthropic's clients read only theirs. Other paths get the
	// forms described at refusal.write.
	ErrorShapes []ErrorShape
	// Throttle, when set, counts the wrong keys of each client address and refuses a
	// throttled address with 429 and Retry-After (see Throttle).
	Throttle *Throttle
	// Proxies are the trusted reverse proxies, whose X-Forwarded-For names the client
	// address the throttle counts.
	Proxies TrustedProxies
}

// LimitFailedAuthentications names the throttle's limit in a refusal's ErrorInfo.
const LimitFailedAuthentications = "failed_authentications"

// throttled is the refusal of a throttled client.
func throttled(err error) refusal {
	var te *ThrottledError
	errors.As(err, &te)
	return refusal{connect.CodeResourceExhausted, errs.ReasonRateLimited, err, te.RetryAfter}
}

// ErrorShape writes the refusals of the requests whose path starts with Prefix. Write gets
// a *connect.Error with the refusal's code and reason (errs.Reason); a ResourceExhausted one
// is to carry Retry-After (errs.RetryAfter).
type ErrorShape struct {
	Prefix string
	Write  func(w http.ResponseWriter, r *http.Request, err error)
}

// refuse answers r with f, in the error shape of its path when the policy names one.
func (p Policy) refuse(w http.ResponseWriter, r *http.Request, f refusal) {
	for _, sh := range p.ErrorShapes {
		if strings.HasPrefix(r.URL.Path, sh.Prefix) {
			if f.retry > 0 {
				sh.Write(w, r, errs.Limit(f.code, f.reason, LimitFailedAuthentications, f.retry, f.err))
				return
			}
			sh.Write(w, r, errs.New(f.code, f.reason, f.err))
			return
		}
	}
	f.write(w, r)
}

// loopbackHost reports whether a request's Host names this machine: localhost, any
// 127.0.0.0/8 address or ::1, with or without a port. An empty Host (HTTP/1.0) names no
// one and passes: only a name chosen by someone else, as a DNS-rebinding web page chooses
// it, is refused.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	host = strings.TrimSuffix(host, ".")
	if host == "" || strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// errForeignHost is the 403 of a non-loopback Host in open mode.
func errForeignHost(host string) error {
	return fmt.Errorf("the request's Host %q is not a loopback name: with no API keys configured Loops answers only requests addressed to localhost, 127.0.0.1 or [::1], so that a web page cannot reach it through DNS rebinding; use one of those names in the URL, or configure API keys (--api-key, LOOPS_API_KEYS or --api-key-file) to accept any Host", host)
}

// inflight counts each key's requests in flight. A key has an entry only while it has
// requests in flight, so the map never holds more entries than there are requests.
type inflight struct {
	max int
	mu  sync.Mutex
	n   map[[32]byte]int
}

func newInflight(limit int) *inflight {
	if limit == 0 {
		limit = DefaultMaxRequestsPerKey
	}
	return &inflight{max: limit, n: map[[32]byte]int{}}
}

// acquire counts one more request for key, or reports false when it already has max.
func (f *inflight) acquire(key string) ([32]byte, bool) {
	id := sha256.Sum256([]byte(key))
	if f.max < 0 {
		return id, true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[id] >= f.max {
		return id, false
	}
	f.n[id]++
	return id, true
}

func (f *inflight) release(id [32]byte) {
	if f.max < 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[id] <= 1 {
		delete(f.n, id)
		return
	}
	f.n[id]--
}

// keys is the number of keys with requests in flight.
func (f *inflight) keys() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.n)
}

// refusal is a request the middleware answers itself.
type refusal struct {
	code   connect.Code
	reason string // machine-readable; "" for the code's default
	err    error
	retry  time.Duration // Retry-After of a 429; 0 for the default
}

// write answers r with the refusal in the form its protocol reads, with the status of the
// one error table (internal/errs): gRPC and gRPC-Web get a status in the headers; Connect,
// REST and Tinker clients get the HTTP status and a JSON body with code, reason, message
// (Connect, REST) and detail (Tinker). A 429 carries Retry-After.
func (f refusal) write(w http.ResponseWriter, r *http.Request) {
	e := errs.Lookup(f.code)
	reason := f.reason
	if reason == "" {
		reason = e.Reason
	}
	if e.Code == connect.CodeResourceExhausted {
		retry := f.retry
		if retry <= 0 {
			retry = errs.DefaultRetryAfter
		}
		w.Header().Set(errs.HeaderRetryAfter, errs.RetryAfterValue(retry))
	}
	ct := r.Header.Get("Content-Type")
	if strings.HasPrefix(ct, "application/grpc") {
		w.Header().Set("Content-Type", ct)
		w.Header().Set("Grpc-Status", strconv.Itoa(int(f.code)))
		w.Header().Set("Grpc-Message", grpcPercentEncode(f.err.Error()))
		w.WriteHeader(http.StatusOK)
		return
	}
	body, _ := json.Marshal(map[string]string{"code": f.code.String(), "reason": reason, "message": f.err.Error(), "detail": f.err.Error()})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(e.HTTPStatus)
	_, _ = w.Write(body)
}

// grpcPercentEncode encodes a Grpc-Message value as the gRPC spec asks: bytes outside
// printable ASCII, and '%', as %XX.
func grpcPercentEncode(msg string) string {
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c < ' ' || c > '~' || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
