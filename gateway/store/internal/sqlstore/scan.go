package sqlstore

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/store"
)

// Rows is a result set, as both drivers return one. The caller closes it.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// ScanData decodes rows that select one data column into new messages, appended to out.
func ScanData[M proto.Message](rows Rows, newMsg func() M, out []M) ([]M, error) {
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		m := newMsg()
		if err := proto.Unmarshal(data, m); err != nil {
			return nil, fmt.Errorf("decode: %w", err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// ScanOwned decodes rows that select workspace and data columns into new messages and calls
// add with each.
func ScanOwned[M proto.Message](rows Rows, newMsg func() M, add func(workspace string, m M)) error {
	for rows.Next() {
		var workspace string
		var data []byte
		if err := rows.Scan(&workspace, &data); err != nil {
			return err
		}
		m := newMsg()
		if err := proto.Unmarshal(data, m); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		add(workspace, m)
	}
	return rows.Err()
}

// ScanMessages is ScanOwned for a list of one workspace's records (never nil).
func ScanMessages[M proto.Message](rows Rows, newMsg func() M) ([]M, error) {
	out := []M{}
	err := ScanOwned(rows, newMsg, func(_ string, m M) { out = append(out, m) })
	return out, err
}

// ScanStrings reads rows of one text column (never nil).
func ScanStrings(rows Rows) ([]string, error) {
	out := []string{}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// ScanUsage reads the rows of ListUsage.
func ScanUsage(rows Rows) ([]store.UsageRecord, error) {
	var out []store.UsageRecord
	for rows.Next() {
		var u store.UsageRecord
		var start int64
		if err := rows.Scan(&start, &u.BaseModel, &u.SessionID, &u.Kind, &u.Amount, &u.Deployment, &u.PricedAmount, &u.Cost, &u.KeyID, &u.RunID); err != nil {
			return nil, err
		}
		u.BucketStart = time.Unix(0, start).UTC()
		out = append(out, u)
	}
	return out, rows.Err()
}

// ScanInt reads the one integer of a one-row, one-column answer.
func ScanInt(rows Rows) (int64, error) {
	var v int64
	if rows.Next() {
		if err := rows.Scan(&v); err != nil {
			return 0, err
		}
	}
	return v, rows.Err()
}
