package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/backends"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
)

// maxPathBytes bounds a folder named in a request.
const maxPathBytes = 4096

// confinement is what the folders and URLs of a request may name: folders inside the
// worker's own (AllowDirs), URLs of the checkpoint store (CheckpointOrigins). Every
// request is checked before the engine sees it. The checks resolve symbolic links, so a
// link inside an allowed folder that leads out of it is refused; a link put in place
// between the check and the engine's use is not caught, so an allowed folder must be
// writable only by the user the gateway and the worker run as (the gateway's data dir is).
type confinement struct {
	roots   []string // absolute, symbolic links resolved
	origins []origin
}

// origin is a URL's scheme, host and port (the port explicit).
type origin struct{ scheme, host, port string }

func (o origin) String() string { return o.scheme + "://" + net.JoinHostPort(o.host, o.port) }

// newConfinement resolves the allowed folders (each must exist) and parses the origins
// (scheme://host[:port], nothing else).
func newConfinement(dirs, origins []string) (*confinement, error) {
	c := &confinement{}
	for _, d := range dirs {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("--allow-dir %q must be an absolute path", d)
		}
		r, err := filepath.EvalSymlinks(d)
		if err != nil {
			return nil, fmt.Errorf("--allow-dir %s: %w", d, err)
		}
		if fi, err := os.Stat(r); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("--allow-dir %s is not a folder", d)
		}
		c.roots = append(c.roots, r)
	}
	for _, s := range origins {
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("--checkpoint-origin %q must be scheme://host[:port] of the checkpoint store (e.g. https://s3.example.com)", s)
		}
		c.origins = append(c.origins, originOf(u))
	}
	return c, nil
}

func originOf(u *url.URL) origin {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return origin{scheme: u.Scheme, host: strings.ToLower(u.Hostname()), port: port}
}

// invalid is the error of a refused request field.
func invalid(format string, a ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, a...))
}

// dir checks a folder a request names (field is its name in the message): an absolute
// path without "..", inside an allowed folder once symbolic links are resolved (those of
// its existing part; what does not exist yet has none), and the entries it already holds
// links to nothing outside (the engine reads and writes them). It returns nil for "".
func (c *confinement) dir(field, p string) error {
	if p == "" {
		return nil
	}
	switch {
	case len(p) > maxPathBytes || strings.ContainsRune(p, 0):
		return invalid("%s is not a usable path", field)
	case !filepath.IsAbs(p):
		return invalid("%s must be an absolute path", field)
	case slices.Contains(strings.Split(filepath.ToSlash(p), "/"), ".."):
		return invalid("%s must not contain '..'", field)
	case len(c.roots) == 0:
		return invalid("%s names a folder, but this worker reads and writes none: start it with --allow-dir FOLDER (a folder it shares with the gateway), or have the gateway send checkpoints as URLs", field)
	}
	real, err := resolve(filepath.Clean(p))
	if err != nil {
		return invalid("%s cannot be resolved", field)
	}
	if !c.inside(real) {
		return invalid("%s is outside the folders this worker may use (its --allow-dir folders)", field)
	}
	entries, err := os.ReadDir(real)
	if err != nil {
		return nil // not there yet (a save creates it), or not a folder: the engine says so
	}
	for _, e := range entries {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		target, err := filepath.EvalSymlinks(filepath.Join(real, e.Name()))
		if err != nil || !c.inside(target) {
			return invalid("%s holds a symbolic link that leads outside the folders this worker may use", field)
		}
	}
	return nil
}

// resolve resolves the symbolic links of p's longest existing prefix and appends the rest.
func resolve(p string) (string, error) {
	rest := ""
	for cur := p; ; {
		if _, err := os.Lstat(cur); err == nil {
			r, err := filepath.EvalSymlinks(cur)
			if err != nil {
				return "", err
			}
			return filepath.Join(r, rest), nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return "", os.ErrNotExist
		}
		rest = filepath.Join(filepath.Base(cur), rest)
		cur = parent
	}
}

// inside reports whether real (resolved) is an allowed folder or below one.
func (c *confinement) inside(real string) bool {
	for _, r := range c.roots {
		if real == r || strings.HasPrefix(real, r+string(filepath.Separator)) || r == string(filepath.Separator) {
			return true
		}
	}
	return false
}

// urls checks the URLs of a request's files: each must be of the checkpoint store.
func (c *confinement) urls(field string, files []*backendv1.FileURL) error {
	for _, f := range files {
		if err := c.url(field, f.GetUrl()); err != nil {
			return err
		}
	}
	return nil
}

// url checks one URL (an empty one is left to the engine).
func (c *confinement) url(field, raw string) error {
	if raw == "" {
		return nil
	}
	if len(c.origins) == 0 {
		return invalid("%s: this worker takes no checkpoint URLs: start it with --checkpoint-origin, the checkpoint store's scheme://host[:port]", field)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return invalid("%s holds a URL that is not http(s)://host/…", field)
	}
	if !slices.Contains(c.origins, originOf(u)) {
		return invalid("%s holds a URL of %s, which is not this worker's checkpoint store", field, originOf(u))
	}
	return nil
}

// trainerHandler is a Trainer whose requests' folders and URLs are checked first.
type trainerHandler struct {
	backends.Trainer
	c *confinement
}

func (h trainerHandler) SaveAdapter(ctx context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	if err := h.c.dir("dir", req.GetDir()); err != nil {
		return nil, err
	}
	if err := h.c.urls("upload", req.GetUpload()); err != nil {
		return nil, err
	}
	return h.Trainer.SaveAdapter(ctx, req)
}

func (h trainerHandler) LoadAdapter(ctx context.Context, req *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error) {
	if err := h.c.dir("dir", req.GetDir()); err != nil {
		return nil, err
	}
	if err := h.c.urls("download", req.GetDownload()); err != nil {
		return nil, err
	}
	return h.Trainer.LoadAdapter(ctx, req)
}

// sample checks a sample request.
func (c *confinement) sample(req *backendv1.SampleRequest) error {
	if err := c.dir("adapter_dir", req.GetAdapterDir()); err != nil {
		return err
	}
	return c.urls("adapter_files", req.GetAdapterFiles())
}
