package jobs

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Upload caps: an archive's size as sent, its files' total size once unpacked, how many
// entries it holds and how long a path may be.
const (
	DefaultMaxArchiveBytes  = 16 << 20
	DefaultMaxUnpackedBytes = 64 << 20
	DefaultMaxFiles         = 1000
	maxPathLen              = 512
	maxPathDepth            = 16
)

// errArchive is a client mistake in an upload (InvalidArgument).
type errArchive struct{ msg string }

func (e *errArchive) Error() string { return e.msg }

func badArchive(format string, args ...any) error {
	return &errArchive{fmt.Sprintf(format, args...)}
}

// CleanPath checks a path inside an upload: relative, slash-separated, no "." or ".."
// parts, no empty parts, at most 512 bytes and 16 levels, printable. It returns the path
// (a trailing slash, as tar writes folders, removed).
func CleanPath(p string) (string, error) {
	p = strings.TrimSuffix(p, "/")
	p = strings.TrimPrefix(p, "./")
	switch {
	case p == "":
		return "", badArchive("an empty path")
	case len(p) > maxPathLen:
		return "", badArchive("path %.40q… is over %d bytes", p, maxPathLen)
	case strings.HasPrefix(p, "/"):
		return "", badArchive("path %q is absolute: use paths relative to the job's folder", p)
	}
	parts := strings.Split(p, "/")
	if len(parts) > maxPathDepth {
		return "", badArchive("path %q is over %d levels deep", p, maxPathDepth)
	}
	for _, part := range parts {
		if part == "" || part == "." || part == ".." {
			return "", badArchive("path %q has an empty, '.' or '..' part: paths must stay inside the job's folder", p)
		}
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f || r == '\\' {
			return "", badArchive("path %q has a control character or backslash", p)
		}
	}
	if path.Clean(p) != p {
		return "", badArchive("path %q is not clean", p)
	}
	return p, nil
}

// Unpack writes an uploaded tar archive (gzip-compressed or not) into dir, which must exist
// and be empty: regular files and folders only (links, devices and the like are refused),
// at most maxFiles entries and maxBytes unpacked. It checks everything it writes; a bad
// archive is an error that says what was wrong, and may leave part of it written.
func Unpack(archive []byte, dir string, maxFiles int, maxBytes int64) error {
	var r io.Reader = bytes.NewReader(archive)
	if len(archive) >= 2 && archive[0] == 0x1f && archive[1] == 0x8b {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return badArchive("archive: gzip header: %v", err)
		}
		zr.Multistream(false)
		r = zr
	}
	tr := tar.NewReader(bufio.NewReader(r))
	var files int
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return badArchive("archive: not a readable tar archive (send a tar or tar.gz of the script's folder): %v", err)
		}
		files++
		if files > maxFiles {
			return badArchive("archive holds more than %d entries: upload fewer files", maxFiles)
		}
		name, err := CleanPath(h.Name)
		if err != nil {
			return badArchive("archive: %v", err)
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return fmt.Errorf("archive: %w", err)
			}
		case tar.TypeReg:
			if h.Size < 0 || total+h.Size > maxBytes {
				return badArchive("archive: its files are over %d bytes unpacked: upload less (data sets belong in the job's arguments or a separate store)", maxBytes)
			}
			total += h.Size
			if err := writeFile(dst, tr, h.Size, h.Mode&0o100 != 0); err != nil {
				return err
			}
		default:
			return badArchive("archive: %q is not a regular file or folder (type %q): links and special files are refused", name, h.Typeflag)
		}
	}
}

func writeFile(dst string, r io.Reader, size int64, exec bool) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		// A file where a folder is needed.
		return badArchive("archive: %s: %v", filepath.Base(filepath.Dir(dst)), err)
	}
	mode := os.FileMode(0o644)
	if exec {
		mode = 0o755
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return badArchive("archive: %s appears twice", filepath.Base(dst))
		}
		return badArchive("archive: %s: %v", filepath.Base(dst), err)
	}
	n, err := io.Copy(f, io.LimitReader(r, size))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return badArchive("archive: %s: %v", filepath.Base(dst), err)
	}
	if n != size {
		return badArchive("archive: %s is cut short", filepath.Base(dst))
	}
	return nil
}
