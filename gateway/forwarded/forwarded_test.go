package forwarded

import (
	"crypto/tls"
	"net/http"
	"net/netip"
	"testing"
)

func proxies(t *testing.T, cidrs ...string) Proxies {
	t.Helper()
	var ps []netip.Prefix
	for _, c := range cidrs {
		ps = append(ps, netip.MustParsePrefix(c))
	}
	return New(ps)
}

func TestClientIP(t *testing.T) {
	nginx := proxies(t, "10.0.0.10/32", "fd00::/64")
	for _, tc := range []struct {
		name   string
		p      Proxies
		remote string
		xff    []string
		want   string
	}{
		{"no proxies: the peer", Proxies{}, "203.0.113.5:4711", nil, "203.0.113.5"},
		{"no proxies: the header is ignored", Proxies{}, "203.0.113.5:4711", []string{"198.51.100.1"}, "203.0.113.5"},
		{"untrusted peer: the header is ignored", nginx, "203.0.113.5:4711", []string{"198.51.100.1"}, "203.0.113.5"},
		{"trusted peer, no header", nginx, "10.0.0.10:4711", nil, "10.0.0.10"},
		{"trusted peer: the address it saw", nginx, "10.0.0.10:4711", []string{"198.51.100.1"}, "198.51.100.1"},
		{"the client's own entries are skipped", nginx, "10.0.0.10:4711", []string{"1.1.1.1, 2.2.2.2, 198.51.100.1"}, "198.51.100.1"},
		{"a chain of trusted proxies", nginx, "10.0.0.10:4711", []string{"198.51.100.1, 10.0.0.10"}, "198.51.100.1"},
		{"several headers read as one list", nginx, "10.0.0.10:4711", []string{"1.1.1.1", "198.51.100.1"}, "198.51.100.1"},
		{"all trusted: the leftmost", nginx, "10.0.0.10:4711", []string{"10.0.0.10"}, "10.0.0.10"},
		{"garbage behind a trusted hop: the hop", nginx, "10.0.0.10:4711", []string{"1.1.1.1, not-an-ip"}, "10.0.0.10"},
		{"IPv6 peer and entry", nginx, "[fd00::1]:4711", []string{"[2001:db8::7]"}, "2001:db8::7"},
		{"IPv4-mapped peer", nginx, "[::ffff:10.0.0.10]:4711", []string{"198.51.100.1"}, "198.51.100.1"},
		{"no address at all", nginx, "pipe", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest(http.MethodGet, "http://gw/", nil)
			r.RemoteAddr = tc.remote
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := tc.p.ClientIP(r); got != tc.want {
				t.Errorf("ClientIP = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestHTTPS(t *testing.T) {
	nginx := proxies(t, "10.0.0.10/32")
	for _, tc := range []struct {
		name   string
		remote string
		tls    bool
		proto  []string
		want   bool
	}{
		{"plain", "203.0.113.5:1", false, nil, false},
		{"TLS here", "203.0.113.5:1", true, nil, true},
		{"untrusted peer says https", "203.0.113.5:1", false, []string{"https"}, false},
		{"trusted proxy says https", "10.0.0.10:1", false, []string{"https"}, true},
		{"trusted proxy says http", "10.0.0.10:1", false, []string{"http"}, false},
		{"the nearest proxy's word counts", "10.0.0.10:1", false, []string{"https, http"}, false},
		{"case", "10.0.0.10:1", false, []string{"HTTPS"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest(http.MethodGet, "http://gw/", nil)
			r.RemoteAddr = tc.remote
			if tc.tls {
				r.TLS = &tls.ConnectionState{}
			}
			for _, v := range tc.proto {
				r.Header.Add("X-Forwarded-Proto", v)
			}
			if got := nginx.HTTPS(r); got != tc.want {
				t.Errorf("HTTPS = %v, want %v", got, tc.want)
			}
		})
	}
}
