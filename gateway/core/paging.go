package core

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
)

// pageTokens signs the page tokens of loops.v1 lists with a key drawn at start-up: a token
// is valid for the life of the process.
var pageTokens = store.NewPageTokens(nil)

// listPage is a list request's window, and what its response's next_page_token needs.
type listPage struct {
	store.Page
	// limit is the page size the client gets; Page.Limit asks the store for one more record
	// (when under the store's maximum), to tell whether another page follows.
	limit     int
	workspace string
	list      string
}

// pageOf checks a list request's limit, offset and page_token, for the workspace's list
// (its name is bound into the tokens, with any filter: "checkpoints/<run>").
func pageOf(workspace, list string, limit, offset int32, token string) (listPage, error) {
	if limit < 0 || offset < 0 {
		return listPage{}, invalidArgument("limit and offset must not be negative")
	}
	if limit > store.MaxPageLimit {
		return listPage{}, invalidArgument("limit %d is over the maximum of %d", limit, store.MaxPageLimit)
	}
	p := listPage{limit: int(limit), workspace: workspace, list: list}
	if p.limit == 0 {
		p.limit = store.DefaultPageLimit
	}
	p.Page = store.Page{Limit: min(p.limit+1, store.MaxPageLimit), Offset: int(offset)}
	if token != "" {
		after, err := pageTokens.Decode(workspace, list, token)
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
	return items, pageTokens.Encode(p.workspace, p.list, store.CursorOf(items[len(items)-1]))
}
