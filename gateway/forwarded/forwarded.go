// Package forwarded decides what a request's X-Forwarded-For and
// X-Forwarded-Proto headers may be believed to say. A client sets them to
// whatever it likes, so they are read only when the connection comes from
// a proxy the operator listed (server.trusted_proxies); from anyone else
// the client is the connection's peer and its scheme is the connection's.
package forwarded

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Proxies are the trusted proxies. The zero value trusts none.
type Proxies struct {
	prefixes []netip.Prefix
}

// New returns the proxies within prefixes.
func New(prefixes []netip.Prefix) Proxies {
	return Proxies{prefixes: prefixes}
}

// trusted reports whether a is one of the proxies.
func (p Proxies) trusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, pr := range p.prefixes {
		if pr.Contains(a) {
			return true
		}
	}
	return false
}

// peer is the address of the connection r came on.
func peer(r *http.Request) (netip.Addr, bool) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// FromTrusted reports whether r's connection comes from a trusted proxy.
func (p Proxies) FromTrusted(r *http.Request) bool {
	a, ok := peer(r)
	return ok && p.trusted(a)
}

// ClientIP is the address of r's client: the connection's peer; or, when
// the peer is a trusted proxy, the rightmost X-Forwarded-For entry that is
// not itself a trusted proxy — each proxy appends the address it was
// called from, so entries to the left of the first untrusted one are the
// client's own say. When every entry is trusted, the leftmost; when an
// entry does not parse, the trusted hop that passed it on. It is "" only
// when RemoteAddr is not an address (an in-process request).
//
// It has echo.IPExtractor's signature.
func (p Proxies) ClientIP(r *http.Request) string {
	a, ok := peer(r)
	if !ok {
		return ""
	}
	if !p.trusted(a) {
		return a.String()
	}
	hops := forwardedFor(r.Header)
	for i := len(hops) - 1; i >= 0; i-- {
		h, err := netip.ParseAddr(strings.Trim(hops[i], "[]"))
		if err != nil {
			return a.String()
		}
		a = h.Unmap().WithZone("")
		if !p.trusted(a) {
			return a.String()
		}
	}
	return a.String()
}

// forwardedFor splits every X-Forwarded-For header into its entries, in
// order.
func forwardedFor(h http.Header) []string {
	var out []string
	for _, v := range h.Values("X-Forwarded-For") {
		for e := range strings.SplitSeq(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
	}
	return out
}

// HTTPS reports whether r's client reached the gateway over TLS: TLS ended
// in this process, or a trusted proxy says so with X-Forwarded-Proto:
// https (the last value, the nearest proxy's, when there are several).
func (p Proxies) HTTPS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if !p.FromTrusted(r) {
		return false
	}
	vals := r.Header.Values("X-Forwarded-Proto")
	if len(vals) == 0 {
		return false
	}
	last := vals[len(vals)-1]
	if i := strings.LastIndexByte(last, ','); i >= 0 {
		last = last[i+1:]
	}
	return strings.EqualFold(strings.TrimSpace(last), "https")
}
