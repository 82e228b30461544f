package bounded

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// ReadFile reads a regular file of at most limit bytes. A larger file is refused from its
// size before it is read, and a file that grows while it is read is cut at limit+1 bytes
// and refused, so nothing from the file decides how much is allocated.
func ReadFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", filepath.Base(path))
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%s is %d bytes, larger than the limit of %d", filepath.Base(path), st.Size(), limit)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than the limit of %d bytes", filepath.Base(path), limit)
	}
	return b, nil
}
