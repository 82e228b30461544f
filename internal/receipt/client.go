package receipt

import (
	"net/http"
	"strings"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// maxHeader bounds each header value a ClientInfo keeps.
const maxHeader = 256

// ClientFromHeaders returns the client that request headers name: the tinker SDK (a
// Stainless client) sends "User-Agent: AsyncTinker/Python 0.38.0" (or "Tinker/…"),
// X-Stainless-Package-Version, X-Stainless-Runtime and X-Stainless-Runtime-Version. Any
// other client is named by its User-Agent's first product ("name/version"). nil when the
// headers name none.
func ClientFromHeaders(h http.Header) *loopsv1.ClientInfo {
	ua := clip(h.Get("User-Agent"))
	c := &loopsv1.ClientInfo{UserAgent: ua, Version: clip(h.Get("X-Stainless-Package-Version"))}
	product, rest, _ := strings.Cut(ua, " ")
	name, version, _ := strings.Cut(product, "/")
	switch lower := strings.ToLower(name); {
	case strings.HasSuffix(lower, "tinker"):
		c.Name = "tinker"
		if c.Version == "" { // "AsyncTinker/Python 0.38.0": the version is the last word
			if f := strings.Fields(rest); len(f) > 0 {
				c.Version = f[len(f)-1]
			}
		}
	default:
		c.Name = name
		if c.Version == "" {
			c.Version = version
		}
	}
	if rt := h.Get("X-Stainless-Runtime"); rt != "" {
		c.Runtime = clip(strings.TrimSpace(rt + " " + h.Get("X-Stainless-Runtime-Version")))
	}
	if c.GetName() == "" && c.GetVersion() == "" && c.GetUserAgent() == "" {
		return nil
	}
	return c
}

func clip(s string) string {
	if len(s) > maxHeader {
		s = s[:maxHeader]
	}
	return strings.ToValidUTF8(s, "")
}
