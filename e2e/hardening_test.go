package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

// TestSlowloris holds hundreds of connections that send half a request
// header and stop, while normal requests go on being served; the server
// drops the half-open ones after read_header_timeout.
func TestSlowloris(t *testing.T) {
	_, upURL := newFake(t, fakeprovider.Options{})
	p := start(t, gatewayBin(t, ""), []string{"-config", writeConfig(t, t.TempDir(), upURL, "server:\n  read_header_timeout: 1s\n  shutdown_grace: 5s\n")}, nil)
	addr := strings.TrimPrefix(p.URL, "http://")
	const slow = 300
	conns := make([]net.Conn, 0, slow)
	for i := 0; i < slow; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nX-Slow: ", addr)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 20; i++ {
		status, _, body := post(t, p.URL+"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, nil)
		if status != 200 {
			t.Fatalf("normal request %d under slowloris: %d %s", i, status, body)
		}
	}
	// Every half-open connection is closed by the server.
	closed := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.ReadAll(c)
		if err == nil { // EOF: the server hung up
			closed++
		}
	}
	if closed != slow {
		t.Fatalf("%d of %d half-open connections were dropped", closed, slow)
	}
}

// TestNoUpstreamButBaseURL tries every way a request could point the
// gateway at another host; the attacker's server must see nothing.
func TestNoUpstreamButBaseURL(t *testing.T) {
	var hits atomic.Int64
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	t.Cleanup(attacker.Close)
	a := strings.TrimPrefix(attacker.URL, "http://")
	fake, upURL := newFake(t, fakeprovider.Options{})
	p := start(t, gatewayBin(t, ""), []string{"-config", writeConfig(t, t.TempDir(), upURL, "")}, nil)
	body := fmt.Sprintf(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"base_url":"%[1]s","api_base":"%[1]s","url":"%[1]s"}`, attacker.URL)
	hdrs := map[string]string{
		"X-Forwarded-Host": a, "Forwarded": "host=" + a, "X-Upstream-Url": attacker.URL, "X-Original-Url": attacker.URL,
		"OpenAI-Base-URL": attacker.URL, "X-Llmgate-Upstream": "attacker",
	}
	paths := []string{"/v1/chat/completions", "/v1/chat/completions?url=" + attacker.URL, "/v1//" + a + "/chat/completions",
		"/v1/../" + a + "/chat/completions", "/v1/chat/completions/..%2F..%2F" + a}
	for _, path := range paths {
		req, _ := http.NewRequest(http.MethodPost, p.URL+path, strings.NewReader(body))
		for k, v := range hdrs {
			req.Header.Set(k, v)
		}
		req.Host = a
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	if hits.Load() != 0 {
		t.Fatalf("the attacker's server received %d requests", hits.Load())
	}
	for _, r := range fake.Requests() {
		if r.Path != "/v1/chat/completions" {
			t.Fatalf("upstream path %q", r.Path)
		}
	}
}

func TestNoCORS(t *testing.T) {
	_, upURL := newFake(t, fakeprovider.Options{})
	p := start(t, gatewayBin(t, ""), []string{"-config", writeConfig(t, t.TempDir(), upURL, "")}, nil)
	for _, path := range []string{"/v1/chat/completions", "/admin/breakers", "/admin/", "/metrics"} {
		for _, method := range []string{http.MethodOptions, http.MethodGet} {
			req, _ := http.NewRequest(method, p.URL+path, nil)
			req.Header.Set("Origin", "http://evil.example")
			req.Header.Set("Access-Control-Request-Method", "POST")
			req.Header.Set("Authorization", "Bearer e2e-admin-token")
			res, err := httpClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			for k := range res.Header {
				if strings.HasPrefix(k, "Access-Control-") {
					t.Errorf("%s %s answered %s", method, path, k)
				}
			}
		}
	}
}

// TestSecretsNeverWritten runs a scripted mix — successes, failures that
// become dead letters, admin reads, metrics — and greps everything the
// gateway wrote (logs, response bodies and headers, files in its data dir)
// for every secret it holds.
func TestSecretsNeverWritten(t *testing.T) {
	secrets := map[string]string{
		"upstream key": "sk-e2e-upstream-key",
		"client key":   "client-secret-key-771",
		"admin token":  "e2e-admin-token",
		"webhook path": "T000/B000/hook-secret-993",
	}
	fake, upURL := newFake(t, fakeprovider.Options{})
	dir := t.TempDir()
	hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(hook.Close)
	extra := fmt.Sprintf("clients:\n  - name: team-a\n    key: %s\ndead_letters:\n  alert_threshold: 1\n  webhook_url: %s/%s\n", secrets["client key"], hook.URL, secrets["webhook path"])
	p := start(t, gatewayBin(t, ""), []string{"-config", writeConfig(t, dir, upURL, extra)}, nil)

	var seen strings.Builder
	record := func(status int, h http.Header, body []byte) {
		fmt.Fprintf(&seen, "%d %v %s\n", status, h, body)
	}
	auth := map[string]string{"Authorization": "Bearer " + secrets["client key"]}
	chat := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`
	record(post(t, p.URL+"/v1/chat/completions", chat, auth))
	record(post(t, p.URL+"/v1/chat/completions", chat, map[string]string{"Authorization": "Bearer " + secrets["client key"], "Idempotency-Key": "k1"}))
	record(post(t, p.URL+"/v1/chat/completions", chat, map[string]string{"Authorization": "Bearer wrong"}))
	fake.SetDefault(fakeprovider.Step{Status: 503})
	record(post(t, p.URL+"/v1/chat/completions", chat, map[string]string{"Authorization": "Bearer " + secrets["client key"], "Idempotency-Key": "k2"}))
	fake.SetDefault(fakeprovider.Step{Status: 401})
	record(post(t, p.URL+"/v1/chat/completions", chat, auth))
	fake.SetDefault(fakeprovider.Step{})
	admin := map[string]string{"Authorization": "Bearer " + secrets["admin token"]}
	for _, path := range []string{"/admin/breakers", "/admin/deadletters", "/admin/stats", "/admin/idempotency/k1?client=team-a&body=1", "/metrics"} {
		req, _ := http.NewRequest(http.MethodGet, p.URL+path, nil)
		for k, v := range admin {
			req.Header.Set(k, v)
		}
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, res.StatusCode, b)
		}
		record(res.StatusCode, res.Header, b)
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	p.wait(15 * time.Second)

	var files strings.Builder
	_ = filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			b, _ := os.ReadFile(path)
			files.Write(b)
		}
		return nil
	})
	for name, s := range secrets {
		for where, text := range map[string]string{"logs": p.stderr.String(), "responses": seen.String(), "data dir": files.String()} {
			if strings.Contains(text, s) {
				t.Errorf("the %s appears in the %s", name, where)
			}
		}
	}
	if !strings.Contains(seen.String(), "dead_letters") || !strings.Contains(p.stderr.String(), `"client":"team-a"`) {
		t.Fatal("the scripted run did not exercise what it should")
	}
}

// TestKillUnderLoad SIGKILLs the gateway again and again under concurrent
// keyed load (JSON and streams), restarts it on the same data dir, and has
// every client retry each key until it gets a complete answer. Then every
// key must replay exactly what its client got, and no key may reach the
// upstream again once it was committed.
func TestKillUnderLoad(t *testing.T) {
	const (
		clients = 24
		keys    = 480
		crashes = 5
	)
	fake, upURL := newFake(t, fakeprovider.Options{Latency: 150 * time.Millisecond, ChunkDelay: 10 * time.Millisecond})
	dir := t.TempDir()
	cfg := writeConfig(t, dir, upURL, "idempotency:\n  wait_timeout: 2s\n")
	bin := gatewayBin(t, "")

	var mu sync.Mutex
	p := start(t, bin, []string{"-config", cfg}, nil)
	current := func() string { mu.Lock(); defer mu.Unlock(); return p.URL }

	body := func(k int) string {
		if k%2 == 0 {
			return fmt.Sprintf(`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"key %d"}]}`, k)
		}
		return fmt.Sprintf(`{"model":"gpt-4o","messages":[{"role":"user","content":"key %d"}]}`, k)
	}
	answers := make([][]byte, keys)
	answeredAt := make([]time.Time, keys)
	next := make(chan int, keys)
	for k := 0; k < keys; k++ {
		next <- k
	}
	close(next)
	client := &http.Client{Timeout: 20 * time.Second}
	try := func(k int) ([]byte, bool) {
		req, _ := http.NewRequest(http.MethodPost, current()+"/v1/chat/completions", strings.NewReader(body(k)))
		req.Header.Set("Idempotency-Key", fmt.Sprintf("load/%d", k))
		res, err := client.Do(req)
		if err != nil {
			return nil, false
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		// Only a complete 200 is an answer: a body cut by the crash is not.
		return b, err == nil && res.StatusCode == 200
	}
	var wg sync.WaitGroup
	deadline := time.Now().Add(90 * time.Second)
	for c := 0; c < clients; c++ {
		wg.Go(func() {
			for k := range next {
				for {
					if time.Now().After(deadline) {
						t.Errorf("key %d never answered", k)
						return
					}
					if b, ok := try(k); ok {
						answers[k], answeredAt[k] = b, time.Now()
						break
					}
					time.Sleep(20 * time.Millisecond) // a client's retry backoff
				}
			}
		})
	}
	for i := 0; i < crashes; i++ {
		time.Sleep(500 * time.Millisecond) // let load build up between crashes
		mu.Lock()
		p.kill()
		p = start(t, bin, []string{"-config", cfg}, nil)
		mu.Unlock()
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// Every key replays exactly what its client got, with no upstream call.
	before := fake.Calls("")
	for k := 0; k < keys; k++ {
		b, ok := try(k)
		if !ok || string(b) != string(answers[k]) {
			t.Fatalf("key %d: final answer differs from what was committed", k)
		}
	}
	if fake.Calls("") != before {
		t.Fatalf("replays called the upstream %d times", fake.Calls("")-before)
	}
	perKey := map[string][]time.Time{}
	for _, r := range fake.Requests() {
		k := r.Header.Get("Idempotency-Key")
		perKey[k] = append(perKey[k], r.At)
	}
	duplicates, extra := 0, 0
	for k := 0; k < keys; k++ {
		// The gateway forwards a key derived from (client, endpoint, key).
		calls := perKey[idempotency.ForwardKey(nil, cache.Key{Endpoint: "/v1/chat/completions", ID: fmt.Sprintf("load/%d", k)})]
		if len(calls) == 0 {
			t.Fatalf("key %d answered without an upstream call", k)
		}
		extra += len(calls) - 1
		if len(calls) > 1+crashes {
			t.Errorf("key %d: %d upstream calls, more than one per crash window", k, len(calls))
		}
		for _, at := range calls {
			if at.After(answeredAt[k]) {
				duplicates++
			}
		}
	}
	t.Logf("keys %d, clients %d, crashes %d, upstream calls %d (re-runs after a crash %d), duplicates after commit %d",
		keys, clients, crashes, before, extra, duplicates)
	if duplicates != 0 {
		t.Fatalf("%d upstream calls for keys already committed", duplicates)
	}
}
