package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// BenchmarkRequestPath is the request path in process: the real handler
// (echo, auth, limits, plan, proxy, idempotency on Badger) called with an
// httptest.ResponseRecorder as the client, against a real loopback fake
// upstream. A generated stream is 10 events (role, 6 content chunks,
// finish, usage, [DONE]). The figures to watch in review are allocs/op and
// B/op; ns/op includes the fake upstream, which runs in this process.
// The loopback legs put a real client connection in front of the handler
// (their allocations include the test's HTTP client).
func BenchmarkRequestPath(b *testing.B) {
	up := httptest.NewServer(fakeprovider.New(fakeprovider.Options{KeepRequests: -1, Chunks: 6}))
	defer up.Close()
	h := benchGateway(b, testConfig(up.URL))
	call := func(b *testing.B, body, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
		return w
	}
	n := 0
	newKey := func() string { n++; return "bench-" + strconv.Itoa(n) }
	legs := []struct {
		name, body string
		keyed      bool
	}{
		{"json/unkeyed", chatBody, false},
		{"json/keyed", chatBody, true},
		{"stream/unkeyed", streamBody, false},
		{"stream/keyed", streamBody, true},
	}
	for _, c := range legs {
		b.Run(c.name, func(b *testing.B) {
			if c.body == streamBody {
				if w := call(b, c.body, ""); strings.Count(w.Body.String(), "\n\n") != 10 {
					b.Fatalf("want a 10-event stream, got:\n%s", w.Body)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				key := ""
				if c.keyed {
					key = newKey()
				}
				call(b, c.body, key)
			}
		})
	}
	// The same legs again over a loopback client connection, where a
	// flush is a write to a socket (in process it is free).
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, leg := range legs {
		b.Run("loopback/"+leg.name, func(b *testing.B) {
			b.ReportAllocs()
			w0 := writeSyscalls()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(leg.body))
				req.Header.Set("Content-Type", "application/json")
				if leg.keyed {
					req.Header.Set("Idempotency-Key", newKey())
				}
				resp, err := srv.Client().Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d, %v", resp.StatusCode, err)
				}
			}
			if w0 >= 0 {
				b.ReportMetric(float64(writeSyscalls()-w0)/float64(b.N), "writes/op")
			}
		})
	}
	b.Run("json/replay", func(b *testing.B) {
		key := newKey()
		first := call(b, chatBody, key).Body.String()
		b.ReportAllocs()
		for b.Loop() {
			if w := call(b, chatBody, key); w.Body.String() != first {
				b.Fatalf("replay differs:\n%s\n%s", w.Body, first)
			}
		}
	})
}

// writeSyscalls is the process's count of write system calls so far
// (Linux's /proc/self/io syscw), or -1 where it cannot be read. Every
// process-wide write counts: the test's client, the fake upstream and the
// gateway's; a leg's change in writes/op is the gateway's.
func writeSyscalls() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}
