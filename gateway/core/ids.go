package core

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newID returns prefix + "-" + 16 random base32 characters (80 bits). IDs contain no ':' or
// '/', so they are safe in every URL form the surfaces use.
func newID(prefix string) string {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return prefix + "-" + strings.ToLower(idEncoding.EncodeToString(b[:]))
}
