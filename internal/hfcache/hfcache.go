package hfcache

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// ModelRepoPrefix begins the folder name of every model repository in a hub cache.
const ModelRepoPrefix = "models--"

// DefaultRevision is the revision a model name without one means.
const DefaultRevision = "main"

// maxSnapshots bounds the snapshot folders Find looks through when a model's ref does not
// lead to the file it needs.
const maxSnapshots = 1024

// ErrNotCached says a model, revision or file is not in the local cache.
var ErrNotCached = errors.New("not in the local Hugging Face cache")

// ErrInvalid says a repository id, revision or file name is not one huggingface_hub
// accepts; nothing was looked up.
var ErrInvalid = errors.New("invalid Hugging Face name")

var (
	// repoPart is one part of a repository id: huggingface_hub's rule (letters, digits,
	// "_", "-", "."; at most 96).
	repoPart = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,96}$`)
	// refPart is one part of a ref name (a branch, a tag, pr/1).
	refPart = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,255}$`)
	// commitID is a full commit id, the only content a ref may have.
	commitID = regexp.MustCompile(`^[0-9a-f]{40}$`)
)

// Home returns the Hugging Face home folder, absolute: $HF_HOME, else
// $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface. It need not exist.
func Home() (string, error) {
	if v := os.Getenv("HF_HOME"); v != "" {
		return abs(v)
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("finding the Hugging Face cache: %w", err)
		}
		cache = filepath.Join(home, ".cache")
	}
	return abs(filepath.Join(cache, "huggingface"))
}

// HubDir returns the hub cache folder, absolute: $HF_HUB_CACHE, else
// $HUGGINGFACE_HUB_CACHE, else Home()/hub. It need not exist.
func HubDir() (string, error) {
	for _, k := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"} {
		if v := os.Getenv(k); v != "" {
			return abs(v)
		}
	}
	home, err := Home()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, "hub"), nil
}

// abs expands p as huggingface_hub does (os.path.expandvars(os.path.expanduser(p))) and
// makes it absolute. A variable that is not set stays as written.
func abs(p string) (string, error) {
	if p == "~" || strings.HasPrefix(p, "~/") {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("expanding %q: %w", p, err)
		}
		p = home + p[1:]
	}
	p = os.Expand(p, func(k string) string {
		if v, ok := os.LookupEnv(k); ok {
			return v
		}
		return "$" + k
	})
	return filepath.Abs(p)
}

// RepoDir returns the folder of the model repository repoID ("org/name" or "name") in the
// hub cache hub: hub/models--org--name. It need not exist.
func RepoDir(hub, repoID string) (string, error) {
	parts := strings.Split(repoID, "/")
	if len(parts) > 2 {
		return "", fmt.Errorf("%w: repository id %q has more than one '/'", ErrInvalid, repoID)
	}
	for _, p := range parts {
		switch {
		case !repoPart.MatchString(p):
			return "", fmt.Errorf("%w: repository id %q: each part is 1 to 96 letters, digits, '_', '-' or '.'", ErrInvalid, repoID)
		case strings.Contains(p, "--") || strings.Contains(p, ".."):
			return "", fmt.Errorf("%w: repository id %q contains '--' or '..'", ErrInvalid, repoID)
		case strings.HasPrefix(p, "-") || strings.HasPrefix(p, ".") || strings.HasSuffix(p, "-") || strings.HasSuffix(p, "."):
			return "", fmt.Errorf("%w: repository id %q: a part starts or ends with '-' or '.'", ErrInvalid, repoID)
		}
	}
	return filepath.Join(hub, ModelRepoPrefix+strings.Join(parts, "--")), nil
}

// Snapshot returns the snapshot folder of repoID at revision (DefaultRevision when empty)
// in the hub cache hub: a commit id names its snapshot; any other revision is a ref,
// refs/<revision>, whose content is the commit. An error wraps ErrNotCached when the
// repository, the ref or the snapshot is not there, ErrInvalid when a name is refused.
func Snapshot(hub, repoID, revision string) (string, error) {
	repo, err := RepoDir(hub, repoID)
	if err != nil {
		return "", err
	}
	commit, err := resolve(repo, repoID, revision)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(repo, "snapshots", commit)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("%w: %s has no snapshot %s in %s", ErrNotCached, repoID, commit, hub)
	}
	return dir, nil
}

// resolve turns revision into the commit id of repo.
func resolve(repo, repoID, revision string) (string, error) {
	if revision == "" {
		revision = DefaultRevision
	}
	if commitID.MatchString(revision) {
		return revision, nil
	}
	ref, err := refPath(repo, revision)
	if err != nil {
		return "", err
	}
	f, err := os.Open(ref)
	if err != nil {
		return "", fmt.Errorf("%w: %s has no ref %q (%v)", ErrNotCached, repoID, revision, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 128)) // a commit id and a newline
	if err != nil {
		return "", fmt.Errorf("reading ref %s: %w", ref, err)
	}
	commit := strings.TrimSpace(string(b))
	if !commitID.MatchString(commit) {
		return "", fmt.Errorf("%w: ref %s does not hold a commit id", ErrNotCached, ref)
	}
	return commit, nil
}

// refPath returns the file of the ref revision in repo (refs/<revision>).
func refPath(repo, revision string) (string, error) {
	parts := strings.Split(revision, "/")
	for _, p := range parts {
		if !refPart.MatchString(p) || p == "." || p == ".." {
			return "", fmt.Errorf("%w: revision %q: a commit id, or a ref of letters, digits, '_', '-', '.' and '/'", ErrInvalid, revision)
		}
	}
	return filepath.Join(append([]string{repo, "refs"}, parts...)...), nil
}

// Find returns the snapshot folder of the model repoID in the hub cache (HubDir) that holds
// file: the snapshot its main ref names when it holds file, else the most recently modified
// snapshot that does (a model fetched at a given commit has no main ref, and a ref may have
// moved to a snapshot not fully downloaded). An error wraps ErrNotCached when none does,
// ErrInvalid when repoID or file is refused.
func Find(repoID, file string) (string, error) {
	if !filepath.IsLocal(file) {
		return "", fmt.Errorf("%w: file %q is not a path inside a snapshot", ErrInvalid, file)
	}
	hub, err := HubDir()
	if err != nil {
		return "", err
	}
	repo, err := RepoDir(hub, repoID)
	if err != nil {
		return "", err
	}
	if dir, err := Snapshot(hub, repoID, DefaultRevision); err == nil && isFile(filepath.Join(dir, file)) {
		return dir, nil
	}
	snaps := filepath.Join(repo, "snapshots")
	d, err := os.Open(snaps)
	if err != nil {
		return "", fmt.Errorf("%w: %s (looked in %s)", ErrNotCached, repoID, hub)
	}
	ents, err := d.ReadDir(maxSnapshots)
	_ = d.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("reading %s: %w", snaps, err)
	}
	var best string
	var bestTime time.Time
	for _, e := range ents {
		dir := filepath.Join(snaps, e.Name())
		if strings.HasPrefix(e.Name(), ".") || !isFile(filepath.Join(dir, file)) {
			continue
		}
		fi, err := os.Stat(dir)
		if err != nil || !fi.IsDir() {
			continue
		}
		if t := fi.ModTime(); best == "" || t.After(bestTime) || (t.Equal(bestTime) && dir > best) {
			best, bestTime = dir, t
		}
	}
	if best == "" {
		return "", fmt.Errorf("%w: %s has no snapshot with %s (looked in %s)", ErrNotCached, repoID, file, hub)
	}
	return best, nil
}

// isFile reports whether p is a regular file (following links: a snapshot's files link
// into the repository's blobs).
func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// Add writes files into the hub cache hub as the snapshot commit of repoID and then points
// its main ref at it: the layout huggingface_hub and transformers read offline (the files
// are plain files rather than links into blobs/, which they accept). It returns the
// snapshot folder.
func Add(hub, repoID, commit string, files map[string][]byte) (string, error) {
	repo, err := RepoDir(hub, repoID)
	if err != nil {
		return "", err
	}
	if !commitID.MatchString(commit) {
		return "", fmt.Errorf("%w: %q is not a commit id (40 lowercase hex digits)", ErrInvalid, commit)
	}
	snap := filepath.Join(repo, "snapshots", commit)
	if err := os.MkdirAll(snap, 0o755); err != nil {
		return "", err
	}
	for name, b := range files {
		if !filepath.IsLocal(name) {
			return "", fmt.Errorf("%w: file %q is not a path inside a snapshot", ErrInvalid, name)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(snap, name)), 0o755); err != nil {
			return "", err
		}
		if err := writeFileAtomic(filepath.Join(snap, name), b); err != nil {
			return "", err
		}
	}
	refs := filepath.Join(repo, "refs")
	if err := os.MkdirAll(refs, 0o755); err != nil {
		return "", err
	}
	if err := writeFileAtomic(filepath.Join(refs, DefaultRevision), []byte(commit)); err != nil {
		return "", err
	}
	return snap, nil
}

// writeFileAtomic writes b to path so that a reader sees the old file or the new one, never
// a half-written one: every server start writes its built-in models into the shared hub
// cache while other processes (another server, a tinker client's get_tokenizer) may be
// reading them. A file that already holds b is left alone.
func writeFileAtomic(path string, b []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr, os.Chmod(tmp.Name(), 0o644)); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return nil
}

// TokenizerDir finds the folder of a tokenizer id: a folder that holds tokenizer.json, or a
// Hugging Face model in the local hub cache (Find), as the reference backend finds models.
func TokenizerDir(id string) (string, error) {
	if isFile(filepath.Join(id, "tokenizer.json")) {
		return id, nil
	}
	dir, err := Find(id, "tokenizer.json")
	if err != nil {
		return "", fmt.Errorf("no tokenizer.json found for %q (a folder, or a model in the local Hugging Face cache): %w", id, err)
	}
	return dir, nil
}
