package ckstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Store holds committed checkpoint folders under keys. Implementations: NewLocal (a local
// folder) and NewS3 (an S3-compatible bucket); Open picks one from a location string.
type Store interface {
	// Put uploads the regular files under dir (subfolders included; symbolic links and
	// other special files are refused) as the checkpoint key, then commits it by writing
	// its manifest. A committed checkpoint already at key is replaced: readers see the old
	// one until the new manifest is written and the new one after. Put returns the new
	// manifest.
	Put(ctx context.Context, key, dir string) (*Manifest, error)
	// Stat returns the manifest of the committed checkpoint key, or an error wrapping
	// ErrNotFound.
	Stat(ctx context.Context, key string) (*Manifest, error)
	// Fetch copies the committed checkpoint key into dir, which must not exist yet (its
	// parent is created), checking each file's size and SHA-256. dir appears only once
	// complete. It returns the manifest of what it copied.
	Fetch(ctx context.Context, key, dir string) (*Manifest, error)
	// Open streams one file of the committed checkpoint key. The reader's final Read
	// returns an error wrapping ErrCorrupt, instead of io.EOF, when the content does not
	// match the manifest.
	Open(ctx context.Context, key, file string) (io.ReadCloser, File, error)
	// List returns the keys of the committed checkpoints under prefix ("" for all; a
	// prefix matches whole key segments), sorted.
	List(ctx context.Context, prefix string) ([]string, error)
	// Delete removes the checkpoint key: its manifest first, so that it stops being
	// visible at once, then its parts. Deleting a key that has no checkpoint is not an
	// error.
	Delete(ctx context.Context, key string) error
	// URL returns a URL from which one file of the committed checkpoint key can be read
	// with a plain GET for at least ttl: a presigned URL for S3, a file:// URL for the
	// local folder (readable on this host only, with no expiry).
	URL(ctx context.Context, key, file string, ttl time.Duration) (string, error)
	// Sweep removes, under prefix, the parts that no manifest references (killed saves,
	// generations replaced or deleted by a process that died before removing them) and
	// whose newest object is older than olderThan, and returns how many objects it
	// removed. olderThan must exceed the longest save, or Sweep removes the parts of a
	// save still under way. Objects that are not the store's own are left alone.
	Sweep(ctx context.Context, prefix string, olderThan time.Duration) (int, error)
	// String says where the store is, for logs (never credentials).
	String() string
}

// Errors that the Store methods wrap.
var (
	// ErrNotFound means that no committed checkpoint (or no such file in it) exists.
	ErrNotFound = errors.New("ckstore: not found")
	// ErrCorrupt means that stored data does not match its manifest, or that a manifest
	// is malformed or over the limits.
	ErrCorrupt = errors.New("ckstore: corrupt checkpoint")
	// ErrInvalid means an unusable argument: a malformed key or file name, a source folder
	// with special files, a destination that exists, a checkpoint over the limits.
	ErrInvalid = errors.New("ckstore: invalid argument")
)

// Limits on what a store accepts and trusts.
const (
	// MaxManifestBytes caps a manifest's encoded size; a larger one is ErrCorrupt and is
	// never read past the cap.
	MaxManifestBytes = 1 << 20
	// MaxFiles caps the number of files of one checkpoint.
	MaxFiles = 4096
	// DefaultMaxCheckpointBytes is Options.MaxCheckpointBytes when unset: the total size
	// of the files of one checkpoint that Put writes and Fetch downloads.
	DefaultMaxCheckpointBytes int64 = 256 << 30
	// maxKeyBytes keeps object names within S3's 1024-byte limit with room for the
	// prefix, @parts/<generation>/ and a file name.
	maxKeyBytes = 512
	// maxNameBytes caps a file name (relative path) inside a checkpoint.
	maxNameBytes = 255
	// fetchAttempts bounds how often Fetch starts again when an overwrite removes the
	// generation it was reading.
	fetchAttempts = 4
)

// Names inside a key's folder. Key segments may not start with '@', so these never
// collide with a nested key.
const (
	manifestName = "@manifest.json"
	partsDir     = "@parts"
)

// Manifest describes a committed checkpoint.
type Manifest struct {
	// Version is the manifest format, 1.
	Version int `json:"version"`
	// Generation names the folder of parts the manifest commits: random, fresh per Put.
	Generation string `json:"generation"`
	// Created is when Put committed the checkpoint.
	Created time.Time `json:"created"`
	// Files are the checkpoint's files, sorted by name.
	Files []File `json:"files"`
}

// File is one file of a checkpoint.
type File struct {
	// Name is the path relative to the checkpoint folder, with forward slashes.
	Name string `json:"name"`
	// Size is the length in bytes.
	Size int64 `json:"size"`
	// SHA256 is the content's SHA-256, lower-case hex.
	SHA256 string `json:"sha256"`
}

// Size is the total size of the checkpoint's files.
func (m *Manifest) Size() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// File returns the manifest's entry for name.
func (m *Manifest) File(name string) (File, bool) {
	i, ok := slices.BinarySearchFunc(m.Files, name, func(f File, n string) int { return strings.Compare(f.Name, n) })
	if !ok {
		return File{}, false
	}
	return m.Files[i], true
}

// Options configure a store.
type Options struct {
	// MaxCheckpointBytes caps the total size of one checkpoint's files, for Put and
	// Fetch; 0 means DefaultMaxCheckpointBytes.
	MaxCheckpointBytes int64
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
	// Progress, when set, is called by Put after each file is uploaded.
	Progress func(key, file string)
	// LinkFiles lets the local store hard-link Put's files into the store instead of
	// copying them, when they are on the same file system (else it copies): a save then
	// costs no second write of its bytes. The caller must not modify the files after Put
	// (removing them is fine), or the stored checkpoint changes with them (every read
	// would then fail its hash check). The S3 store ignores it.
	LinkFiles bool
}

func (o Options) withDefaults() Options {
	if o.MaxCheckpointBytes <= 0 {
		o.MaxCheckpointBytes = DefaultMaxCheckpointBytes
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Open returns the store at location: "s3://bucket/prefix" for S3-compatible storage
// (endpoint and credentials from the AWS environment variables: see NewS3), or a local
// folder path (optionally "file://path"). An empty location is refused.
func Open(ctx context.Context, location string, opts Options) (Store, error) {
	switch {
	case location == "":
		return nil, fmt.Errorf("%w: empty checkpoint store location", ErrInvalid)
	case strings.HasPrefix(location, "s3://"):
		bucket, prefix, _ := strings.Cut(strings.TrimPrefix(location, "s3://"), "/")
		cfg, err := S3ConfigFromEnv()
		if err != nil {
			return nil, err
		}
		cfg.Bucket, cfg.Prefix = bucket, prefix
		return NewS3(ctx, cfg, opts)
	case strings.Contains(location, "://") && !strings.HasPrefix(location, "file://"):
		return nil, fmt.Errorf("%w: checkpoint store %q: use s3://bucket/prefix or a local folder", ErrInvalid, location)
	}
	return NewLocal(strings.TrimPrefix(location, "file://"), opts)
}

// ValidKey reports whether key is usable: 1 to 512 bytes of slash-separated segments,
// each non-empty, not "." or "..", not starting with '@', without backslashes or control
// characters, in valid UTF-8.
func ValidKey(key string) error {
	if key == "" || len(key) > maxKeyBytes {
		return fmt.Errorf("%w: key %q: must be 1 to %d bytes", ErrInvalid, key, maxKeyBytes)
	}
	for seg := range strings.SplitSeq(key, "/") {
		if err := validSegment(seg); err != nil {
			return fmt.Errorf("%w: key %q: %v", ErrInvalid, key, err)
		}
		if strings.HasPrefix(seg, "@") {
			return fmt.Errorf("%w: key %q: a segment may not start with '@'", ErrInvalid, key)
		}
	}
	return nil
}

// validPrefix accepts "" or a valid key.
func validPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return ValidKey(prefix)
}

func validName(name string) error {
	if name == "" || len(name) > maxNameBytes {
		return fmt.Errorf("%w: file name %q: must be 1 to %d bytes", ErrInvalid, name, maxNameBytes)
	}
	for seg := range strings.SplitSeq(name, "/") {
		if err := validSegment(seg); err != nil {
			return fmt.Errorf("%w: file name %q: %v", ErrInvalid, name, err)
		}
	}
	return nil
}

func validSegment(seg string) error {
	switch {
	case seg == "":
		return errors.New("empty segment")
	case seg == "." || seg == "..":
		return errors.New("'.' and '..' are not allowed")
	case !utf8.ValidString(seg):
		return errors.New("not valid UTF-8")
	case strings.ContainsFunc(seg, func(r rune) bool { return r == '\\' || unicode.IsControl(r) }):
		return errors.New("backslashes and control characters are not allowed")
	}
	return nil
}

// newGeneration returns a fresh generation name: the time (so that names sort by age)
// and 8 random bytes.
func newGeneration(now time.Time) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%016x-%s", now.UnixNano(), hex.EncodeToString(b))
}

func validGeneration(g string) bool {
	if len(g) != 33 || g[16] != '-' {
		return false
	}
	_, err1 := hex.DecodeString(g[:16])
	_, err2 := hex.DecodeString(g[17:])
	return err1 == nil && err2 == nil
}

// decodeManifest parses and checks a manifest read through the MaxManifestBytes cap.
func decodeManifest(key string, data []byte, maxBytes int64) (*Manifest, error) {
	var m Manifest
	bad := func(why string) (*Manifest, error) {
		return nil, fmt.Errorf("%w: manifest of %q: %s", ErrCorrupt, key, why)
	}
	if len(data) > MaxManifestBytes {
		return bad(fmt.Sprintf("over %d bytes", MaxManifestBytes))
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return bad(err.Error())
	}
	if m.Version != 1 {
		return bad(fmt.Sprintf("unknown version %d", m.Version))
	}
	if !validGeneration(m.Generation) {
		return bad("malformed generation")
	}
	if len(m.Files) == 0 || len(m.Files) > MaxFiles {
		return bad(fmt.Sprintf("%d files: must be 1 to %d", len(m.Files), MaxFiles))
	}
	var total int64
	for i, f := range m.Files {
		if validName(f.Name) != nil {
			return bad(fmt.Sprintf("bad file name %q", f.Name))
		}
		if i > 0 && m.Files[i-1].Name >= f.Name {
			return bad("files not sorted or repeated")
		}
		if f.Size < 0 || f.Size > maxBytes-total {
			return bad(fmt.Sprintf("files total over the %d-byte limit", maxBytes))
		}
		total += f.Size
		if !validHash(f.SHA256) {
			return bad(fmt.Sprintf("bad sha256 for %q", f.Name))
		}
	}
	return &m, nil
}

// validHash reports whether h is a SHA-256 in lower-case hex.
func validHash(h string) bool {
	b, err := hex.DecodeString(h)
	return err == nil && len(b) == sha256.Size && h == strings.ToLower(h)
}

// scanDir lists the regular files under dir with their sizes, refusing special files and
// anything over the limits.
func scanDir(dir string, maxBytes int64) ([]File, error) {
	var files []File
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		if !d.Type().IsRegular() {
			return fmt.Errorf("%w: %s is not a regular file", ErrInvalid, name)
		}
		if err := validName(name); err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if len(files) == MaxFiles {
			return fmt.Errorf("%w: more than %d files", ErrInvalid, MaxFiles)
		}
		if info.Size() > maxBytes-total {
			return fmt.Errorf("%w: files total over the %d-byte limit", ErrInvalid, maxBytes)
		}
		total += info.Size()
		files = append(files, File{Name: name, Size: info.Size()})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: %s has no files", ErrInvalid, dir)
	}
	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Name, b.Name) })
	return files, nil
}

// verifyReader passes through exactly f.Size bytes of r and fails, in place of io.EOF,
// when the content is shorter, longer or hashes differently.
type verifyReader struct {
	r    io.Reader
	c    io.Closer
	f    File
	key  string
	h    hash.Hash
	n    int64
	done bool
}

func newVerifyReader(key string, f File, rc io.ReadCloser) *verifyReader {
	return &verifyReader{r: rc, c: rc, f: f, key: key, h: sha256.New()}
}

func (v *verifyReader) Read(p []byte) (int, error) {
	if v.done {
		return 0, io.EOF
	}
	if rest := v.f.Size - v.n; int64(len(p)) > rest {
		p = p[:rest]
	}
	if len(p) == 0 {
		return 0, v.finish()
	}
	n, err := v.r.Read(p)
	v.n += int64(n)
	v.h.Write(p[:n])
	if errors.Is(err, io.EOF) {
		if v.n < v.f.Size {
			return n, fmt.Errorf("%w: %s of %q: %d bytes stored, manifest says %d", ErrCorrupt, v.f.Name, v.key, v.n, v.f.Size)
		}
		err = nil
	}
	return n, err
}

func (v *verifyReader) finish() error {
	v.done = true
	var one [1]byte
	if n, _ := io.ReadFull(v.r, one[:]); n > 0 {
		return fmt.Errorf("%w: %s of %q: longer than the manifest's %d bytes", ErrCorrupt, v.f.Name, v.key, v.f.Size)
	}
	if got := hex.EncodeToString(v.h.Sum(nil)); got != v.f.SHA256 {
		return fmt.Errorf("%w: %s of %q: sha256 %s, manifest says %s", ErrCorrupt, v.f.Name, v.key, got, v.f.SHA256)
	}
	return io.EOF
}

func (v *verifyReader) Close() error { return v.c.Close() }

// hashFile returns the SHA-256 of the file at p, checking that its size is still size.
func hashFile(p string, size int64) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", err
	}
	if n != size {
		return "", fmt.Errorf("%w: %s changed size while being saved", ErrInvalid, p)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// keyPath joins object-name segments.
func keyPath(parts ...string) string { return path.Join(parts...) }

func jsonMarshalIndent(m *Manifest) ([]byte, error) { return json.MarshalIndent(m, "", " ") }
