package auth

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// FuzzTrustedProxies: any peer address and forwarding headers give a client address that
// is the peer or one the headers name, never a panic; headers from an untrusted peer
// change nothing; HTTPS needs a trusted peer (or TLS).
func FuzzTrustedProxies(f *testing.F) {
	f.Add("10.1.2.3:80", "1.2.3.4, 10.0.0.9", "https")
	f.Add("203.0.113.5:1", "1.2.3.4", "https")
	f.Add("[::ffff:10.0.0.1]:80", "junk,,", "http, HTTPS")
	f.Add("", "", "")
	p := TrustedProxies{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	f.Fuzz(func(t *testing.T, remote, xff, xfp string) {
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		r.Header.Set("X-Forwarded-For", xff)
		r.Header.Set("X-Forwarded-Proto", xfp)
		got := p.ClientAddr(r)
		peer := peerAddr(r)
		if !p.trusts(peer) {
			if got != peer {
				t.Fatalf("untrusted peer %q: client %v, want the peer", remote, got)
			}
			if p.HTTPS(r) {
				t.Fatalf("untrusted peer %q: HTTPS believed", remote)
			}
			return
		}
		if got != peer && !mentions(xff, got) {
			t.Fatalf("client %v is neither the peer %v nor in X-Forwarded-For %q", got, peer, xff)
		}
	})
}

// mentions reports whether some comma-separated hop of xff parses to a.
func mentions(xff string, a netip.Addr) bool {
	for _, h := range strings.Split(xff, ",") {
		if b, err := netip.ParseAddr(strings.TrimSpace(h)); err == nil && b.Unmap() == a {
			return true
		}
	}
	return false
}
