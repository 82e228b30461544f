package ray

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Job statuses of the Ray Jobs API.
const (
	StatusPending   = "PENDING"
	StatusRunning   = "RUNNING"
	StatusStopped   = "STOPPED"
	StatusSucceeded = "SUCCEEDED"
	StatusFailed    = "FAILED"
)

// Terminal reports whether a job status is final.
func Terminal(status string) bool {
	return status == StatusStopped || status == StatusSucceeded || status == StatusFailed
}

// ErrNotFound is returned (wrapped) for a job the cluster does not know.
var ErrNotFound = errors.New("ray job not found")

// ErrExists is returned (wrapped) when a submission id is still taken: a job of that id
// exists, or was deleted so recently that the cluster still holds its name.
var ErrExists = errors.New("ray job id still taken")

// SubmitRequest is the body of POST /api/jobs/.
type SubmitRequest struct {
	Entrypoint        string            `json:"entrypoint"`
	SubmissionID      string            `json:"submission_id,omitempty"`
	RuntimeEnv        map[string]any    `json:"runtime_env,omitempty"`
	Metadata          map[string]string `json:"metadata,omitempty"`
	EntrypointNumCPUs float64           `json:"entrypoint_num_cpus,omitempty"`
}

// JobInfo is what GET /api/jobs/{id} answers (the fields used here).
type JobInfo struct {
	SubmissionID string `json:"submission_id"`
	Entrypoint   string `json:"entrypoint"`
	Status       string `json:"status"`
	Message      string `json:"message"`
	StartTime    int64  `json:"start_time"`
	EndTime      int64  `json:"end_time"`
}

// Client calls a Ray dashboard's Jobs REST API.
type Client struct {
	base   string
	hc     *http.Client
	header http.Header
}

// NewClient returns a client for the dashboard at base (http://host:8265). header is added
// to every request (e.g. an Authorization for a proxy in front of the dashboard).
func NewClient(base string, hc *http.Client, header http.Header) *Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(base, "/"), hc: hc, header: header}
}

const maxBody = 8 << 20 // logs included

// callTimeout bounds one call to the dashboard.
const callTimeout = 30 * time.Second

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	for k, vs := range c.header {
		req.Header[k] = vs
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("ray dashboard %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("ray %s %s: reading the answer: %w", method, path, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("ray %s %s: %w: %s", method, path, ErrNotFound, firstLine(b))
	case resp.StatusCode == http.StatusBadRequest && bytes.Contains(b, []byte("already exists")):
		return fmt.Errorf("ray %s %s: %w: %s", method, path, ErrExists, firstLine(b))
	case resp.StatusCode/100 != 2:
		return fmt.Errorf("ray %s %s: HTTP %d: %s", method, path, resp.StatusCode, firstLine(b))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("ray %s %s: unreadable answer: %w", method, path, err)
	}
	return nil
}

func firstLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = s[len(s)-2000:] // tracebacks end with the error
	}
	return s
}

// Submit submits a job and returns its submission id.
func (c *Client) Submit(ctx context.Context, req SubmitRequest) (string, error) {
	var out struct {
		SubmissionID string `json:"submission_id"`
	}
	if err := c.do(ctx, http.MethodPost, "/api/jobs/", req, &out); err != nil {
		return "", err
	}
	return out.SubmissionID, nil
}

// Job returns a job's status.
func (c *Client) Job(ctx context.Context, id string) (*JobInfo, error) {
	var out JobInfo
	if err := c.do(ctx, http.MethodGet, "/api/jobs/"+url.PathEscape(id), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Logs returns a job's driver log (at most 8 MiB of it).
func (c *Client) Logs(ctx context.Context, id string) (string, error) {
	var out struct {
		Logs string `json:"logs"`
	}
	if err := c.do(ctx, http.MethodGet, "/api/jobs/"+url.PathEscape(id)+"/logs", nil, &out); err != nil {
		return "", err
	}
	return out.Logs, nil
}

// Stop asks a job to stop; it reports whether the job was running.
func (c *Client) Stop(ctx context.Context, id string) (bool, error) {
	var out struct {
		Stopped bool `json:"stopped"`
	}
	err := c.do(ctx, http.MethodPost, "/api/jobs/"+url.PathEscape(id)+"/stop", nil, &out)
	return out.Stopped, err
}

// Delete forgets a finished job (its logs and record).
func (c *Client) Delete(ctx context.Context, id string) (bool, error) {
	var out struct {
		Deleted bool `json:"deleted"`
	}
	err := c.do(ctx, http.MethodDelete, "/api/jobs/"+url.PathEscape(id), nil, &out)
	return out.Deleted, err
}
