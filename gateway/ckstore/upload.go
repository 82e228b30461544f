package ckstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
)

// Uploads is implemented by the stores whose objects a process without the store's
// credentials can read and write through presigned URLs (the S3 store): a worker on another
// host writes a checkpoint's files straight into the store, and the process that owns the
// key commits them; it reads a checkpoint the same way. The local store does not implement
// it: a worker on the same host reads and writes folders.
type Uploads interface {
	// BeginUpload starts a new generation of key and returns a presigned PUT URL, valid
	// for ttl, for each of names (relative file names, at most MaxFiles). A single PUT
	// takes at most MaxUploadFileBytes.
	BeginUpload(ctx context.Context, key string, names []string, ttl time.Duration) (*Upload, error)
	// CommitUpload commits an upload as the checkpoint key, replacing the committed one
	// like Put: it checks that each of files, which must be among the upload's names, was
	// uploaded with its size, writes the manifest with the files' SHA-256s as the uploader
	// reported them (Fetch and Open verify them on every read), then removes the replaced
	// generation. Names uploaded but not in files are removed. On failure the upload is
	// removed.
	CommitUpload(ctx context.Context, up *Upload, files []File) (*Manifest, error)
	// AbortUpload removes what an upload wrote (also called after a failed commit; Sweep
	// removes what it misses).
	AbortUpload(up *Upload)
	// DownloadURLs returns a presigned GET URL, valid for ttl, for each file of the
	// committed checkpoint key whose manifest is m (from Stat), without reading the store.
	DownloadURLs(ctx context.Context, key string, m *Manifest, ttl time.Duration) (map[string]string, error)
}

// MaxUploadFileBytes is the largest file an Upload takes: S3's limit for one PUT.
const MaxUploadFileBytes int64 = 5 << 30

// Upload is a generation of a checkpoint being written through presigned URLs.
type Upload struct {
	// Key is the checkpoint's key.
	Key string
	// Generation is the new generation's name.
	Generation string
	// URLs are the presigned PUT URLs, by file name.
	URLs map[string]string
}

// s3Store is the S3 store: an objStore on s3Objects that also implements Uploads.
type s3Store struct{ *objStore }

func (s s3Store) objects() *s3Objects { return s.o.(*s3Objects) }

// BeginUpload implements Uploads.
func (s s3Store) BeginUpload(ctx context.Context, key string, names []string, ttl time.Duration) (*Upload, error) {
	if err := ValidKey(key); err != nil {
		return nil, err
	}
	if len(names) == 0 || len(names) > MaxFiles {
		return nil, fmt.Errorf("%w: an upload of %q needs 1 to %d files, got %d", ErrInvalid, key, MaxFiles, len(names))
	}
	up := &Upload{Key: key, Generation: newGeneration(s.opts.Now()), URLs: make(map[string]string, len(names))}
	for _, n := range names {
		if err := validName(n); err != nil {
			return nil, err
		}
		if _, dup := up.URLs[n]; dup {
			return nil, fmt.Errorf("%w: an upload of %q names %q twice", ErrInvalid, key, n)
		}
		u, err := s.objects().c.PresignedPutObject(ctx, s.objects().bucket, s.objects().object(partObject(key, up.Generation, n)), ttl)
		if err != nil {
			return nil, fmt.Errorf("ckstore: presigning an upload of %s of %q: %w", n, key, err)
		}
		up.URLs[n] = u.String()
	}
	return up, nil
}

// CommitUpload implements Uploads.
func (s s3Store) CommitUpload(ctx context.Context, up *Upload, files []File) (*Manifest, error) {
	fail := func(err error) (*Manifest, error) {
		s.AbortUpload(up)
		return nil, err
	}
	if len(files) == 0 {
		return fail(fmt.Errorf("%w: committing %q: no files", ErrInvalid, up.Key))
	}
	m := &Manifest{Version: 1, Generation: up.Generation, Files: slices.Clone(files)}
	slices.SortFunc(m.Files, func(a, b File) int { return strings.Compare(a.Name, b.Name) })
	var total int64
	for i, f := range m.Files {
		if _, ok := up.URLs[f.Name]; !ok {
			return fail(fmt.Errorf("%w: committing %q: %s was not part of the upload", ErrInvalid, up.Key, f.Name))
		}
		if i > 0 && m.Files[i-1].Name == f.Name {
			return fail(fmt.Errorf("%w: committing %q: %s listed twice", ErrInvalid, up.Key, f.Name))
		}
		if f.Size < 0 || !validHash(f.SHA256) {
			return fail(fmt.Errorf("%w: committing %q: %s has a bad size or SHA-256", ErrInvalid, up.Key, f.Name))
		}
		if total += f.Size; total > s.opts.MaxCheckpointBytes {
			return fail(fmt.Errorf("%w: committing %q: over %d bytes", ErrInvalid, up.Key, s.opts.MaxCheckpointBytes))
		}
		info, err := s.objects().c.StatObject(ctx, s.objects().bucket, s.objects().object(partObject(up.Key, up.Generation, f.Name)), minio.StatObjectOptions{})
		if err != nil {
			return fail(fmt.Errorf("ckstore: committing %q: %s: %w", up.Key, f.Name, s3Err(f.Name, err)))
		}
		if info.Size != f.Size {
			return fail(fmt.Errorf("%w: committing %q: %s is %d bytes in the store, %d reported", ErrCorrupt, up.Key, f.Name, info.Size, f.Size))
		}
	}
	for n := range up.URLs {
		if _, ok := m.File(n); !ok {
			_ = s.o.remove(ctx, partObject(up.Key, up.Generation, n))
		}
	}
	got, err := s.commit(ctx, up.Key, m)
	if err != nil {
		return fail(err)
	}
	return got, nil
}

// AbortUpload implements Uploads.
func (s s3Store) AbortUpload(up *Upload) { s.removeGeneration(up.Key, up.Generation) }

// DownloadURLs implements Uploads.
func (s s3Store) DownloadURLs(ctx context.Context, key string, m *Manifest, ttl time.Duration) (map[string]string, error) {
	if err := ValidKey(key); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(m.Files))
	for _, f := range m.Files {
		u, err := s.o.url(ctx, partObject(key, m.Generation, f.Name), ttl)
		if err != nil {
			return nil, fmt.Errorf("ckstore: URL for %s of %q: %w", f.Name, key, err)
		}
		out[f.Name] = u
	}
	return out, nil
}
