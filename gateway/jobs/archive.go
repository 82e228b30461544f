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
// at most maxFiles entries and maxBytes unpacked, folders 0755 and files 0644 (0755 when
// executable) whatever the archive says. A path may appear once as a file, or as a folder
// (also implied by the paths below it), never both. A mistake in the archive is an
// *errArchive that says what was wrong by the entry's name (never the folder's); another
// error is the server's. Either may leave part of the archive written.
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
	folder := map[string]bool{} // every path seen: a folder (true) or a file
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
		switch h.Typeflag {
		case tar.TypeDir, tar.TypeReg:
		default:
			return badArchive("archive: %q is not a regular file or folder (type %q): links and special files are refused", name, h.Typeflag)
		}
		if err := claim(folder, name, h.Typeflag == tar.TypeDir); err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		if h.Typeflag == tar.TypeDir {
			if err := mkdirs(dir, name); err != nil {
				return err
			}
			continue
		}
		if h.Size < 0 || total+h.Size > maxBytes {
			return badArchive("archive: its files are over %d bytes unpacked: upload less (data sets belong in the job's arguments or a separate store)", maxBytes)
		}
		total += h.Size
		if parent := path.Dir(name); parent != "." {
			if err := mkdirs(dir, parent); err != nil {
				return err
			}
		}
		if err := writeFile(dst, name, tr, h.Size, h.Mode&0o100 != 0); err != nil {
			return err
		}
	}
}

// claim records name as a folder or a file, and its parents as folders, refusing a path
// that would be both (or a file twice).
func claim(folder map[string]bool, name string, isDir bool) error {
	for p := path.Dir(name); p != "."; p = path.Dir(p) {
		if dir, seen := folder[p]; seen && !dir {
			return badArchive("archive: %q is a file, and %q needs it to be a folder: a path is one or the other", p, name)
		}
	}
	if dir, seen := folder[name]; seen {
		switch {
		case dir && isDir:
			return nil // a folder again, or one its files implied
		case !dir && !isDir:
			return badArchive("archive: %q appears twice", name)
		default:
			return badArchive("archive: %q is both a file and a folder: a path is one or the other", name)
		}
	}
	for p := path.Dir(name); p != "."; p = path.Dir(p) {
		folder[p] = true
	}
	folder[name] = isDir
	return nil
}

// mkdirs makes the folder rel under dir and its missing parents, 0755.
func mkdirs(dir, rel string) error {
	p := dir
	for _, part := range strings.Split(rel, "/") {
		p = filepath.Join(p, part)
		if err := os.Mkdir(p, 0o755); err != nil {
			if errors.Is(err, os.ErrExist) {
				continue
			}
			return fmt.Errorf("archive: making a folder: %w", err)
		}
		if err := os.Chmod(p, 0o755); err != nil {
			return fmt.Errorf("archive: making a folder: %w", err)
		}
	}
	return nil
}

// writeFile writes an entry's size bytes from r into dst (name is the entry's, for messages).
func writeFile(dst, name string, r io.Reader, size int64, exec bool) error {
	mode := os.FileMode(0o644)
	if exec {
		mode = 0o755
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("archive: creating a file: %w", err)
	}
	w := &recordingWriter{w: f}
	n, err := io.Copy(w, io.LimitReader(r, size))
	err = errors.Join(w.err, f.Chmod(mode), f.Close())
	if err != nil {
		return fmt.Errorf("archive: writing a file: %w", err)
	}
	if n != size {
		return badArchive("archive: %q is cut short", name)
	}
	return nil
}

// recordingWriter keeps its writer's error, so that a write error (the server's) is told
// from a read error (a cut archive, the client's).
type recordingWriter struct {
	w   io.Writer
	err error
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	if err != nil && w.err == nil {
		w.err = err
	}
	return n, err
}
