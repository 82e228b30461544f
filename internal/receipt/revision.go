package receipt

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// DirRevision returns a model folder's revision: "sha256:<hex>" of the lines
// "<sha256 hex of the file>  <path relative to dir>\n" (the sha256sum format) of every
// regular file under dir (links followed, names starting with "." skipped), sorted by path.
// It reads every byte of the folder once (call it when the model is loaded, and keep it),
// except for a file that links to a blob named by its SHA-256, as the Hugging Face cache
// keeps weights (snapshots/<rev>/<file> -> ../../blobs/<sha256>): that name is its hash.
func DirRevision(dir string) (string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		st, err := os.Stat(p) // follows a link (a Hugging Face snapshot links to its blobs)
		if err != nil {
			return err
		}
		if st.Mode().IsRegular() {
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("model revision of %s: %w", dir, err)
	}
	slices.Sort(files)
	h := sha256.New()
	for _, rel := range files {
		sum, err := fileSHA256(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return "", fmt.Errorf("model revision of %s: %w", dir, err)
		}
		fmt.Fprintf(h, "%s  %s\n", sum, rel)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

func fileSHA256(name string) (string, error) {
	if target, err := os.Readlink(name); err == nil {
		if base := filepath.Base(target); len(base) == sha256.Size*2 && isLowerHex(base) {
			return base, nil
		}
	}
	f, err := os.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func isLowerHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
