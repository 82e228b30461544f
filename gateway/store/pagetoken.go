package store

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Page token format, version 1, before base64url (unpadded) encoding:
//
//	version    1 byte (1)
//	workspace  8 bytes: the first 8 bytes of SHA-256(workspace)
//	list       uvarint length + bytes (which list: "sessions", "checkpoints/<run>", …)
//	time       varint: the cursor's create_time in unix nanoseconds
//	run        uvarint length + bytes (Cursor.TrainingRunID)
//	id         uvarint length + bytes (Cursor.ID)
//	mac        16 bytes: HMAC-SHA256(key, workspace's length + workspace + everything above),
//	           truncated
//
// Nothing may follow the MAC.
const (
	pageTokenVersion = 1
	wsHashLen        = 8
	macLen           = 16
	// MaxPageTokenLen is the longest page token (in base64url characters) a PageTokens
	// decodes; longer ones are refused before any decoding.
	MaxPageTokenLen = 4096
	// maxTokenField caps each string field of a token.
	maxTokenField = 1024
)

// ErrBadPageToken is wrapped by every error of PageTokens.Decode.
var ErrBadPageToken = errors.New("invalid page token")

// PageTokens turns list cursors into opaque page tokens and back. A token is bound to the
// workspace and the list it was issued for, and signed with the PageTokens' key, so a client
// can neither forge a position nor reuse a token across workspaces or lists. It is safe for
// concurrent use.
type PageTokens struct {
	key []byte
}

// NewPageTokens returns a PageTokens that signs with key; an empty key means a random one,
// so that tokens are valid only for the life of this PageTokens (the server process).
func NewPageTokens(key []byte) *PageTokens {
	if len(key) == 0 {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			panic("store: no randomness for the page token key: " + err.Error())
		}
	}
	return &PageTokens{key: append([]byte(nil), key...)}
}

// Encode returns the page token of position c in list of workspace. A nil c gives "".
func (p *PageTokens) Encode(workspace, list string, c *Cursor) string {
	if c == nil {
		return ""
	}
	wsHash := sha256.Sum256([]byte(workspace))
	b := make([]byte, 0, 64+len(list)+len(c.TrainingRunID)+len(c.ID))
	b = append(b, pageTokenVersion)
	b = append(b, wsHash[:wsHashLen]...)
	b = appendString(b, list)
	b = binary.AppendVarint(b, c.CreateTime.UnixNano())
	b = appendString(b, c.TrainingRunID)
	b = appendString(b, c.ID)
	b = append(b, p.mac(workspace, b)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Decode returns the position that token encodes, after checking that it is well formed,
// was issued by this PageTokens (its signature), for this workspace and for this list. Every
// error wraps ErrBadPageToken and says what is wrong, in words fit for the client. Times come
// back in UTC.
func (p *PageTokens) Decode(workspace, list, token string) (*Cursor, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadPageToken, fmt.Sprintf(format, args...))
	}
	if token == "" {
		return nil, bad("it is empty")
	}
	if len(token) > MaxPageTokenLen {
		return nil, bad("it is %d characters long, over the maximum of %d", len(token), MaxPageTokenLen)
	}
	// Go's base64 decoders skip \r and \n even in strict mode; a token is one line.
	b, err := base64.RawURLEncoding.Strict().DecodeString(token)
	if err != nil || strings.ContainsAny(token, "\r\n") {
		return nil, bad("it is not unpadded base64url (pass next_page_token exactly as it was returned)")
	}
	if len(b) < 1+wsHashLen+macLen {
		return nil, bad("it is truncated")
	}
	if b[0] != pageTokenVersion {
		return nil, bad("version %d is not supported (this server issues version %d)", b[0], pageTokenVersion)
	}
	body, sum := b[:len(b)-macLen], b[len(b)-macLen:]
	wsHash := sha256.Sum256([]byte(workspace))
	if !hmac.Equal(body[1:1+wsHashLen], wsHash[:wsHashLen]) {
		return nil, bad("it was issued to another workspace")
	}
	r := body[1+wsHashLen:]
	tokList, r, ok := readString(r)
	if !ok {
		return nil, bad("it is malformed")
	}
	nanos, n := binary.Varint(r)
	if n <= 0 {
		return nil, bad("it is malformed")
	}
	r = r[n:]
	runID, r, ok := readString(r)
	if !ok {
		return nil, bad("it is malformed")
	}
	id, r, ok := readString(r)
	if !ok || len(r) != 0 {
		return nil, bad("it is malformed")
	}
	if !hmac.Equal(sum, p.mac(workspace, body)) {
		return nil, bad("its signature does not match: it was altered, or issued by another server or before this one restarted; list again without page_token")
	}
	if tokList != list {
		return nil, bad("it was issued for listing %s, not %s", tokList, list)
	}
	return &Cursor{CreateTime: time.Unix(0, nanos).UTC(), TrainingRunID: runID, ID: id}, nil
}

// mac is the truncated HMAC of the workspace and the token's body.
func (p *PageTokens) mac(workspace string, body []byte) []byte {
	h := hmac.New(sha256.New, p.key)
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(workspace)))])
	h.Write([]byte(workspace))
	h.Write(body)
	return h.Sum(nil)[:macLen]
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// readString reads a uvarint-length-prefixed string of at most maxTokenField bytes.
func readString(b []byte) (string, []byte, bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > maxTokenField || n > uint64(len(b)-k) {
		return "", nil, false
	}
	return string(b[k : k+int(n)]), b[k+int(n):], true
}
