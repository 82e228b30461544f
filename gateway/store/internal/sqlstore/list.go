package sqlstore

import (
	"slices"
	"strconv"

	"github.com/loops-dev/loops/gateway/store"
)

// ListQuery is a paged list's SQL: From selects one data column with a WHERE clause, Count
// counts the whole list with the same arguments. WithRun orders by training_run_id between
// create_time and id (checkpoints of every run).
type ListQuery struct {
	From, Count string
	WithRun     bool
}

// Window is the window of a list a page selects: at most Limit rows after skipping Offset.
func Window(page store.Page) (limit, offset int) {
	limit = page.Limit
	if limit <= 0 {
		limit = store.DefaultPageLimit
	}
	return min(limit, store.MaxPageLimit), max(page.Offset, 0)
}

// Page returns q.From with the page's keyset condition, the list's order, LIMIT, and OFFSET
// only when the page skips rows, and its arguments (args, then the page's), and the page's
// window.
func (q ListQuery) Page(page store.Page, args []any) (query string, qargs []any, limit, offset int) {
	limit, offset = Window(page)
	query, qargs = q.From, slices.Clone(args)
	next := func(v any) string {
		qargs = append(qargs, v)
		return "$" + strconv.Itoa(len(qargs))
	}
	if c := page.After; c != nil {
		if q.WithRun {
			query += ` AND (create_time, training_run_id, id) < (` +
				next(c.CreateTime.UnixNano()) + `, ` + next(c.TrainingRunID) + `, ` + next(c.ID) + `)`
		} else {
			query += ` AND (create_time, id) < (` + next(c.CreateTime.UnixNano()) + `, ` + next(c.ID) + `)`
		}
	}
	if q.WithRun {
		query += ` ORDER BY create_time DESC, training_run_id DESC, id DESC`
	} else {
		query += ` ORDER BY create_time DESC, id DESC`
	}
	query += ` LIMIT ` + next(int64(limit))
	if offset > 0 {
		query += ` OFFSET ` + next(int64(offset))
	}
	return query, qargs, limit, offset
}

// PageCap is the capacity to give a page of a list of total rows.
func PageCap(limit, offset int, total int64) int {
	return min(limit, max(int(total)-offset, 0))
}
