package imagefetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/loops-dev/loops/internal/vision"
)

// Defaults of Options.
const (
	// DefaultTimeout bounds the fetches of one request together.
	DefaultTimeout = 20 * time.Second
	// DefaultInFlight bounds the fetches running at once in the gateway.
	DefaultInFlight = 8
	// maxLocation bounds a location's length.
	maxLocation = 2048
)

// Options configures a Fetcher.
type Options struct {
	// Hosts are the hosts images may be fetched from, as "name" or "name:port", matched
	// exactly (case-insensitive). Empty: nothing is fetched.
	Hosts []string
	// Timeout bounds the fetches of one request together (DefaultTimeout).
	Timeout time.Duration
	// InFlight bounds the fetches running at once (DefaultInFlight); a fetch waits for a
	// slot within its request's Timeout.
	InFlight int
	// Client makes the requests (tests give one that trusts their server); default: a
	// client with Go's default transport. Its redirects are refused either way.
	Client *http.Client
}

// Fetcher fetches images from the allowed hosts. A nil *Fetcher fetches nothing.
type Fetcher struct {
	hosts   []string
	timeout time.Duration
	slots   chan struct{}
	client  *http.Client
}

// New returns a Fetcher for o, or nil when o allows no hosts. A host that is not a plain
// host name (or name:port) is an error.
func New(o Options) (*Fetcher, error) {
	var hosts []string
	for _, h := range o.Hosts {
		h = strings.ToLower(strings.TrimSpace(h))
		if h == "" {
			continue
		}
		if u, err := url.Parse("https://" + h); err != nil || u.Host != h || u.Hostname() == "" {
			return nil, fmt.Errorf("image fetch host %q is not a host name (give name or name:port, no scheme or path)", h)
		}
		hosts = append(hosts, h)
	}
	if len(hosts) == 0 {
		return nil, nil
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.InFlight <= 0 {
		o.InFlight = DefaultInFlight
	}
	c := http.Client{}
	if o.Client != nil {
		c = *o.Client
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return errRedirect }
	return &Fetcher{hosts: hosts, timeout: o.Timeout, slots: make(chan struct{}, o.InFlight), client: &c}, nil
}

var errRedirect = errors.New("the server answered with a redirect, which is not followed: give the image's final URL")

// Hosts are the allowed hosts (nil for a nil Fetcher).
func (f *Fetcher) Hosts() []string {
	if f == nil {
		return nil
	}
	return slices.Clone(f.hosts)
}

// ForRequest returns the function that fetches one request's images: they share one
// deadline (Options.Timeout) under ctx. nil for a nil Fetcher.
func (f *Fetcher) ForRequest(ctx context.Context) func(location string) ([]byte, error) {
	if f == nil {
		return nil
	}
	deadline := time.Now().Add(f.timeout)
	return func(location string) ([]byte, error) {
		ctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		return f.fetch(ctx, location)
	}
}

// Allowed checks location against the allowed hosts without fetching it: an https URL
// whose host is allowed.
func (f *Fetcher) Allowed(location string) (*url.URL, error) {
	if f == nil {
		return nil, errors.New("this server fetches no images (its operator allows no hosts: loops serve --image-fetch-hosts); send the image's bytes in an image chunk")
	}
	if len(location) > maxLocation {
		return nil, fmt.Errorf("the location is %d bytes, over the %d-byte limit", len(location), maxLocation)
	}
	u, err := url.Parse(location)
	switch {
	case err != nil:
		return nil, fmt.Errorf("the location is not a URL: %v", err)
	case u.Scheme != "https":
		return nil, fmt.Errorf("the location must be an https URL of an allowed host (%s), not %q", strings.Join(f.hosts, ", "), clip(location))
	case u.User != nil:
		return nil, errors.New("the location must not carry credentials")
	case !slices.Contains(f.hosts, strings.ToLower(u.Host)):
		return nil, fmt.Errorf("host %q is not one this server fetches images from (%s): send the image's bytes in an image chunk, or ask the operator to allow the host", clip(u.Host), strings.Join(f.hosts, ", "))
	}
	return u, nil
}

func (f *Fetcher) fetch(ctx context.Context, location string) ([]byte, error) {
	u, err := f.Allowed(location)
	if err != nil {
		return nil, err
	}
	select {
	case f.slots <- struct{}{}:
		defer func() { <-f.slots }()
	case <-ctx.Done():
		return nil, fmt.Errorf("fetching %s: the server is busy fetching other images and the request's %s for fetching ran out; retry", u.Host, f.timeout)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("fetching %s: %v", u.Host, err)
	}
	res, err := f.client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("fetching %s: no answer within the request's %s for fetching images", u.Host, f.timeout)
		}
		if errors.Is(err, errRedirect) {
			return nil, fmt.Errorf("fetching %s: %v", u.Host, errRedirect)
		}
		return nil, fmt.Errorf("fetching %s failed: %v", u.Host, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetching %s: the server answered %s", u.Host, res.Status)
	}
	if res.ContentLength > vision.MaxBytes {
		return nil, fmt.Errorf("fetching %s: the image is %d bytes, over the limit of %d (8 MiB)", u.Host, res.ContentLength, vision.MaxBytes)
	}
	b, err := io.ReadAll(io.LimitReader(res.Body, vision.MaxBytes+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("fetching %s: reading the image: %v", u.Host, err)
	case len(b) > vision.MaxBytes:
		return nil, fmt.Errorf("fetching %s: the image is over the limit of %d bytes (8 MiB)", u.Host, vision.MaxBytes)
	}
	return b, nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}
