package auth

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// TrustedProxies are the addresses of the reverse proxies in front of the server (a
// TLS-terminating load balancer, nginx, a standby gateway). Only a request whose own peer
// is one of them is believed about the client it forwards (the X-Forwarded-For header)
// and the scheme the client used (X-Forwarded-Proto); from any other peer those headers
// are ignored, since a client can send them itself. The zero value trusts no one.
type TrustedProxies []netip.Prefix

// ParseTrustedProxies parses CIDR prefixes ("10.0.0.0/8") or single addresses
// ("192.0.2.7", a /32 or /128).
func ParseTrustedProxies(entries []string) (TrustedProxies, error) {
	var out TrustedProxies
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if p, err := netip.ParsePrefix(e); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(e)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q is neither an address nor a CIDR prefix (like 10.0.0.0/8)", e)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// trusts reports whether a is a trusted proxy's address.
func (p TrustedProxies) trusts(a netip.Addr) bool {
	a = a.Unmap()
	for _, pre := range p {
		if pre.Contains(a) {
			return true
		}
	}
	return false
}

// peerAddr is a request's peer address (RemoteAddr), or the zero Addr.
func peerAddr(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap()
}

// ClientAddr returns the address of the client a request comes from: its peer, or, when
// the peer is a trusted proxy, the nearest address in X-Forwarded-For that is not a
// trusted proxy (each proxy appends the address it saw, so the addresses left of the
// first untrusted one may be the client's own inventions).
func (p TrustedProxies) ClientAddr(r *http.Request) netip.Addr {
	a := peerAddr(r)
	if !p.trusts(a) {
		return a
	}
	hops := r.Header.Values("X-Forwarded-For")
	for i := len(hops) - 1; i >= 0; i-- {
		parts := strings.Split(hops[i], ",")
		for j := len(parts) - 1; j >= 0; j-- {
			h, err := netip.ParseAddr(strings.TrimSpace(parts[j]))
			if err != nil {
				return a // a malformed hop: the last proxy is as far as the chain is known
			}
			a = h.Unmap()
			if !p.trusts(a) {
				return a
			}
		}
	}
	return a
}

// HTTPS reports whether the client reached the server over TLS: the request came over
// TLS itself, or its peer is a trusted proxy whose X-Forwarded-Proto (the last value, the
// one that proxy set) is https.
func (p TrustedProxies) HTTPS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if !p.trusts(peerAddr(r)) {
		return false
	}
	vs := r.Header.Values("X-Forwarded-Proto")
	if len(vs) == 0 {
		return false
	}
	parts := strings.Split(vs[len(vs)-1], ",")
	return strings.EqualFold(strings.TrimSpace(parts[len(parts)-1]), "https")
}
