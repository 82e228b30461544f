package core

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/loops-dev/loops/gateway/store"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// pageTokenKeyFile holds the key that signs page tokens, under the data dir, so a token
// stays valid across restarts.
const pageTokenKeyFile = "page-token.key"

// openPageTokens returns the signer of page tokens: with key, or with the key kept in the
// data dir (created on first start).
func openPageTokens(dataDir string, key []byte) (*store.PageTokens, error) {
	if len(key) > 0 {
		return store.NewPageTokens(key), nil
	}
	path := filepath.Join(dataDir, pageTokenKeyFile)
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("core: drawing the page token key: %w", err)
		}
		if err := writeFileAtomic(path, key, 0o600); err != nil {
			return nil, fmt.Errorf("core: writing the page token key: %w", err)
		}
		return store.NewPageTokens(key), nil
	}
	if err != nil {
		return nil, fmt.Errorf("core: reading the page token key: %w", err)
	}
	if len(key) < 16 {
		return nil, fmt.Errorf("core: %s holds %d bytes, fewer than the 16 a page token key needs: delete it to draw a new one", path, len(key))
	}
	return store.NewPageTokens(key), nil
}

// writeFileAtomic writes a file whole or not at all (a temporary file, synced, renamed).
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// listPage is a list request's window, and what its response's next_page_token needs.
type listPage struct {
	store.Page
	// limit is the page size the client gets; Page.Limit asks the store for one more record
	// (when under the store's maximum), to tell whether another page follows.
	limit     int
	workspace string
	list      string
	tokens    *store.PageTokens
}

// pageOf checks a list request's limit, offset and page_token, for the workspace's list
// (its name is bound into the tokens, with any filter: "checkpoints/<run>").
func (c *Core) pageOf(workspace, list string, limit, offset int32, token string) (listPage, error) {
	if limit < 0 || offset < 0 {
		return listPage{}, invalidArgument("limit and offset must not be negative")
	}
	if limit > store.MaxPageLimit {
		return listPage{}, invalidArgument("limit %d is over the maximum of %d", limit, store.MaxPageLimit)
	}
	p := listPage{limit: int(limit), workspace: workspace, list: list, tokens: c.pageTokens}
	if p.limit == 0 {
		p.limit = store.DefaultPageLimit
	}
	p.Page = store.Page{Limit: min(p.limit+1, store.MaxPageLimit), Offset: int(offset)}
	if token != "" {
		after, err := c.pageTokens.Decode(workspace, list, token)
		if err != nil {
			return listPage{}, invalidArgument("page_token: %v", err)
		}
		p.After = after
	}
	return p, nil
}

// nextPage trims the store's answer to the page the client asked for and returns it with
// the token of the next page: empty when nothing follows. A full page of the store's maximum
// size always gets a token (the next page may then be empty).
func nextPage[M interface {
	GetCreateTime() *timestamppb.Timestamp
	GetId() string
}](p listPage, items []M) ([]M, string) {
	more := len(items) > p.limit || (p.Page.Limit == p.limit && len(items) == p.limit)
	if !more || len(items) == 0 {
		return items, ""
	}
	items = items[:min(len(items), p.limit)]
	return items, p.tokens.Encode(p.workspace, p.list, store.CursorOf(items[len(items)-1]))
}

// PageTokens returns the signer of the server's page tokens (for lists served outside the
// core, such as the audit log's).
func (c *Core) PageTokens() *store.PageTokens { return c.pageTokens }
