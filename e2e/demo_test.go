package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDemoTour takes the tour `gateway -demo` prints, against the real
// binary: a retry, an open breaker, dead letters and their replay, and a
// keyed replay. Only the timings are shortened (a config file and
// -demo-outage), so that it takes seconds; every wait polls a condition
// against a deadline.
func TestDemoTour(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	writeFile(t, cfg, "breaker:\n  open_timeout: 2s\nretry:\n  base_delay: 20ms\n")
	tr := startDemoTour(t, []string{"-demo", "-config", cfg, "-demo-outage", "4s"},
		[]string{"GATEWAY_ADDR=127.0.0.1:0", "GATEWAY_DATA_DIR=" + t.TempDir(), "GATEWAY_ADMIN_TOKEN=", "OPENAI_API_KEY=", "OPENAI_BASE_URL="})

	t.Run("sign-in link", func(t *testing.T) {
		noRedirect := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		res, err := noRedirect.Get(tr.signIn)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		var session *http.Cookie
		for _, c := range res.Cookies() {
			if c.Name == "llmgate_admin" && c.Path == "/admin" {
				session = c
			}
		}
		if res.StatusCode != http.StatusSeeOther || session == nil {
			t.Fatalf("first use: %d, cookies %v; want 303 and a session", res.StatusCode, res.Cookies())
		}
		req, _ := http.NewRequest(http.MethodGet, tr.base+"/admin/", nil)
		req.AddCookie(session)
		page, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(page.Body)
		page.Body.Close()
		if page.StatusCode != 200 || !bytes.Contains(b, []byte("breaker-demo-down")) {
			t.Fatalf("the page with the session: %d\n%s", page.StatusCode, b)
		}
		res, err = noRedirect.Get(tr.signIn)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("second use: %d, want 401", res.StatusCode)
		}
	})

	// A retry: demo-flaky answers 503, 503, then 200; the client sees the
	// 200 and the request's log line says attempts 3.
	flaky := `{"model":"demo-flaky","messages":[{"role":"user","content":"Hello"}]}`
	status, _, first := post(t, tr.chat(), flaky, map[string]string{"Idempotency-Key": "tour-flaky"})
	if status != 200 {
		t.Fatalf("demo-flaky: %d %s", status, first)
	}
	tr.waitLog(`"model":"demo-flaky"`, `"status":200`, `"attempts":3`, `"replayed":false`)

	// A keyed replay: the same key gets the committed answer, byte for
	// byte, without another call.
	status, h, again := post(t, tr.chat(), flaky, map[string]string{"Idempotency-Key": "tour-flaky"})
	if status != 200 || h.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again, first) {
		t.Fatalf("keyed replay: %d Idempotent-Replayed=%q, identical=%v", status, h.Get("Idempotent-Replayed"), bytes.Equal(again, first))
	}
	tr.waitLog(`"model":"demo-flaky"`, `"attempts":0`, `"replayed":true`)

	// An open breaker: keyed requests to demo-down until its breaker is
	// open; each failure is a dead letter.
	down := `{"model":"demo-down","messages":[{"role":"user","content":"Hello"}]}`
	var keys []string
	for i := 1; tr.breaker("demo-down") != "open"; i++ {
		if i > 20 {
			t.Fatalf("the breaker of demo-down did not open after %d requests:\n%s", i-1, tr.p.stderr.String())
		}
		key := fmt.Sprintf("tour-down-%d", i)
		if status, _, b := post(t, tr.chat(), down, map[string]string{"Idempotency-Key": key}); status != 503 {
			t.Fatalf("demo-down %s: %d %s", key, status, b)
		}
		keys = append(keys, key)
	}
	if got := tr.breaker("demo"); got != "closed" {
		t.Errorf("breaker of the other upstream, demo: %s, want closed", got)
	}

	// A dead letter, replayed through the admin API once demo-down is up:
	// its breaker lets the replay through, which commits the answer under
	// the client's key.
	key := keys[len(keys)-1]
	id := tr.deadLetter(key)
	var replay struct {
		Status int    `json:"status"`
		Error  string `json:"error"`
	}
	tr.poll(20*time.Second, "the replay of "+key+" to succeed", func() bool {
		tr.admin(http.MethodPost, "/admin/deadletters/"+id+"/replay", &replay)
		return replay.Status == 200
	})
	if got := tr.admin(http.MethodGet, "/admin/deadletters/"+id, nil); got != http.StatusNotFound {
		t.Errorf("the dead letter after its replay: GET %d, want 404", got)
	}
	if got := tr.breaker("demo-down"); got != "closed" {
		t.Errorf("breaker of demo-down after the replay: %s, want closed", got)
	}
	// The client's own retry with its key gets what the replay committed,
	// and again, byte for byte.
	status, h, replayed := post(t, tr.chat(), down, map[string]string{"Idempotency-Key": key})
	if status != 200 || h.Get("Idempotent-Replayed") != "true" || !bytes.Contains(replayed, []byte(`"model":"demo-down"`)) {
		t.Fatalf("%s after the replay: %d Idempotent-Replayed=%q %s", key, status, h.Get("Idempotent-Replayed"), replayed)
	}
	if _, _, b := post(t, tr.chat(), down, map[string]string{"Idempotency-Key": key}); !bytes.Equal(b, replayed) {
		t.Errorf("a second keyed replay differs:\n%s\n%s", replayed, b)
	}

	if logs := tr.p.stderr.String(); strings.Contains(logs, tr.token) {
		t.Error("the admin token is in the logs")
	}
}

// tour is a gateway started with -demo, and what its banner said.
type tour struct {
	t      *testing.T
	p      *proc
	base   string // http://127.0.0.1:port
	token  string
	signIn string
}

// startDemoTour is start for -demo: it also reads the banner's admin token
// and sign-in link from stdout.
func startDemoTour(t *testing.T, args, env []string) *tour {
	t.Helper()
	cmd := exec.Command(gatewayBin(t, ""), args...)
	cmd.Env = append(cmd.Environ(), env...)
	p := &proc{t: t, cmd: cmd, stderr: &syncBuffer{}, exited: make(chan error, 1)}
	cmd.Stderr = p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.kill)
	banner := &syncBuffer{}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(banner, sc.Text())
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() { p.exited <- cmd.Wait() }()

	tr := &tour{t: t, p: p}
	listening := regexp.MustCompile(`(?m)^llmgate listening on (\S+)$`)
	token := regexp.MustCompile(`(?m)^  export TOKEN=(\S+)$`)
	signIn := regexp.MustCompile(`(?m)^  sign in: +(\S+)$`)
	tr.poll(20*time.Second, "the banner", func() bool {
		select {
		case err := <-p.exited:
			t.Fatalf("gateway exited: %v\n%s", err, p.stderr.String())
		default:
		}
		out := banner.String()
		l, k, s := listening.FindStringSubmatch(out), token.FindStringSubmatch(out), signIn.FindStringSubmatch(out)
		if l == nil || k == nil || s == nil {
			return false
		}
		tr.base, tr.token, tr.signIn = l[1], k[1], s[1]
		return true
	})
	p.URL = tr.base
	return tr
}

func (tr *tour) chat() string { return tr.base + "/v1/chat/completions" }

// poll calls cond every 50ms until it holds, or fails the test after d.
func (tr *tour) poll(d time.Duration, what string, cond func() bool) {
	tr.t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			tr.t.Fatalf("waited %s for %s\n%s", d, what, tr.p.stderr.String())
		}
		<-tick.C
	}
}

// admin calls the admin API with the printed token, decodes a 200's body
// into v (if not nil), and returns the status.
func (tr *tour) admin(method, path string, v any) int {
	tr.t.Helper()
	req, _ := http.NewRequest(method, tr.base+path, nil)
	req.Header.Set("Authorization", "Bearer "+tr.token)
	res, err := httpClient.Do(req)
	if err != nil {
		tr.t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode == 200 && v != nil {
		if err := json.NewDecoder(res.Body).Decode(v); err != nil {
			tr.t.Fatalf("%s %s: %v", method, path, err)
		}
	}
	return res.StatusCode
}

// breaker returns the state GET /admin/breakers gives upstream.
// breaker is the worst state among upstream's breakers (its own and its
// models'): open before half-open before closed.
func (tr *tour) breaker(upstream string) string {
	tr.t.Helper()
	var v struct {
		Breakers []struct{ Name, State string }
	}
	if got := tr.admin(http.MethodGet, "/admin/breakers", &v); got != 200 {
		tr.t.Fatalf("GET /admin/breakers: %d", got)
	}
	rank := map[string]int{"closed": 0, "half-open": 1, "open": 2}
	worst, found := "", false
	for _, b := range v.Breakers {
		if b.Name == upstream && (!found || rank[b.State] > rank[worst]) {
			worst, found = b.State, true
		}
	}
	if !found {
		tr.t.Fatalf("no breaker %s in %+v", upstream, v)
	}
	return worst
}

// deadLetter waits for the dead letter of key and returns its id.
func (tr *tour) deadLetter(key string) string {
	tr.t.Helper()
	var id string
	tr.poll(10*time.Second, "the dead letter of "+key, func() bool {
		var v struct {
			DeadLetters []struct {
				ID  string `json:"id"`
				Key string `json:"idempotency_key"`
			} `json:"dead_letters"`
		}
		tr.admin(http.MethodGet, "/admin/deadletters?limit=1000", &v)
		for _, d := range v.DeadLetters {
			if d.Key == key {
				id = d.ID
			}
		}
		return id != ""
	})
	return id
}

// waitLog waits for a log line holding every one of parts.
func (tr *tour) waitLog(parts ...string) {
	tr.t.Helper()
	tr.poll(10*time.Second, fmt.Sprintf("a log line with %q", parts), func() bool {
	lines:
		for line := range strings.Lines(tr.p.stderr.String()) {
			for _, p := range parts {
				if !strings.Contains(line, p) {
					continue lines
				}
			}
			return true
		}
		return false
	})
}
