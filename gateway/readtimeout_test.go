package gateway

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

const slowClientKey = "client-key-slow-test"

// slowConn is a connection that sent a request's headers and is trickling
// its body, one byte at a time, far slower than the body could arrive.
type slowConn struct {
	name   string
	conn   net.Conn
	opened time.Time
	closed chan time.Time // when the gateway closed it; never, if it did not
}

// openSlow opens n connections to path on the gateway and starts each
// request: headers, then the start of a body that announces far more.
func openSlow(t *testing.T, h *harness, n int, name, path string, hdr map[string]string) []*slowConn {
	t.Helper()
	addr := strings.TrimPrefix(h.srv.URL, "http://")
	var out []*slowConn
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		var b strings.Builder
		fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 100000\r\n", path, addr)
		for k, v := range hdr {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
		b.WriteString("\r\nx")
		sc := &slowConn{name: name, conn: c, opened: time.Now(), closed: make(chan time.Time, 1)}
		if _, err := io.WriteString(c, b.String()); err != nil {
			t.Fatal(err)
		}
		go func() {
			// Whatever the gateway answers, the connection ends when it
			// closes it (EOF or reset) — or when the test's bound passes.
			_ = c.SetReadDeadline(time.Now().Add(slowBound))
			_, err := io.Copy(io.Discard, c)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return
			}
			sc.closed <- time.Now()
		}()
		out = append(out, sc)
	}
	return out
}

// slowBound is how long the test waits for the gateway to close a slow
// connection before calling it held open.
const slowBound = 8 * time.Second

// trickle writes a byte to every connection every interval until stop:
// a body that keeps arriving, just never finishes.
func trickle(conns []*slowConn, interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for _, c := range conns {
			_ = c.conn.SetWriteDeadline(time.Now().Add(interval))
			_, _ = c.conn.Write([]byte("x"))
		}
	}
}

// TestSlowBodiesAreCut holds 100 slow-body connections on /admin/login,
// 100 on /v1 with a client key and 100 on /v1 without one, while normal
// requests go on being served; the gateway closes each slow one once its
// body deadline passes: the short one for everything not yet
// authenticated as a client, the long one for a client's /v1 request.
func TestSlowBodiesAreCut(t *testing.T) {
	const short, long = 300 * time.Millisecond, 2 * time.Second
	h := newHarness(t, func(c *config.Config) {
		c.Clients = []config.Client{{Name: "team-a", Key: slowClientKey}}
		c.Server.UnauthenticatedReadBodyTimeout = config.Duration(short)
		c.Server.ReadBodyTimeout = config.Duration(long)
	})
	form := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	login := openSlow(t, h, 100, "/admin/login", "/admin/login", form)
	client := openSlow(t, h, 100, "/v1 with a client key", "/v1/chat/completions",
		map[string]string{"Authorization": "Bearer " + slowClientKey, "Content-Type": "application/json"})
	anon := openSlow(t, h, 100, "/v1 without a key", "/v1/chat/completions", map[string]string{"Content-Type": "application/json"})
	all := append(append(append([]*slowConn{}, login...), client...), anon...)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { trickle(all, 50*time.Millisecond, stop) })
	t.Cleanup(func() { close(stop); wg.Wait() })

	// Normal requests are served meanwhile.
	if r := h.do(http.MethodGet, "/healthz", "", nil); r.status != http.StatusOK {
		t.Fatalf("healthz: %d", r.status)
	}
	if r := h.chat(chatBody, map[string]string{"Authorization": "Bearer " + slowClientKey}); r.status != http.StatusOK {
		t.Fatalf("chat: %d %s", r.status, r.body)
	}
	if r := h.page(http.MethodPost, "/admin/login", url.Values{"token": {adminToken}}, nil, nil); r.status != http.StatusSeeOther {
		t.Fatalf("login: %d %s", r.status, r.body)
	}

	for _, group := range []struct {
		conns    []*slowConn
		min, max time.Duration
	}{
		{login, short, long},
		{anon, short, long},
		{client, long, slowBound},
	} {
		open := 0
		var first, last time.Duration
		for _, c := range group.conns {
			select {
			case at := <-c.closed:
				d := at.Sub(c.opened)
				if first == 0 || d < first {
					first = d
				}
				last = max(last, d)
			case <-time.After(time.Until(c.opened.Add(slowBound + time.Second))):
				open++
			}
		}
		name := group.conns[0].name
		if open > 0 {
			t.Errorf("%s: %d of %d slow connections still open after %s", name, open, len(group.conns), slowBound)
			continue
		}
		t.Logf("%s: slow connections closed after %s to %s", name, first.Round(time.Millisecond), last.Round(time.Millisecond))
		if first < group.min {
			t.Errorf("%s: a slow connection was closed after %s, before its deadline %s", name, first, group.min)
		}
		if last > group.max {
			t.Errorf("%s: a slow connection was held %s, longer than %s", name, last, group.max)
		}
	}
}

// TestBodyDeadlineEndsWithTheBody: the body deadline bounds reading the
// body only. A stream that runs on well past it after the body has
// arrived is not cut (net/http would cancel the request's context if the
// deadline were left on the connection).
func TestBodyDeadlineEndsWithTheBody(t *testing.T) {
	const timeout = 200 * time.Millisecond
	h := newHarnessStore(t, func(c *config.Config) {
		c.Server.UnauthenticatedReadBodyTimeout = config.Duration(timeout)
		c.Server.ReadBodyTimeout = config.Duration(timeout)
	}, nil, fakeprovider.Options{ChunkDelay: 150 * time.Millisecond, Chunks: 6})
	// A request without a body sets no deadline at all: net/http is
	// already waiting on the connection for the client to go away.
	start := time.Now()
	r := h.admin(http.MethodGet, "/admin/debug/pprof/profile?seconds=1")
	if r.status != http.StatusOK {
		t.Fatalf("profile: %d %s", r.status, r.body)
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("a one-second profile ended after %s: its request was cancelled", d)
	}

	for _, body := range []string{streamBody, chatBody} {
		start := time.Now()
		r := h.chat(body, nil)
		if r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if body == streamBody {
			if !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") {
				t.Fatalf("stream cut short after %s:\n%s", time.Since(start), r.body)
			}
			if d := time.Since(start); d < 3*timeout {
				t.Fatalf("stream took %s, not long enough to outlast the %s deadline", d, timeout)
			}
		}
	}
}
