package e2e

// Claude Code itself (npm @anthropic-ai/claude-code, pinned in
// e2e/recipes/claudecode/package-lock.json), run headless — `claude -p` —
// with ANTHROPIC_BASE_URL at a gateway process in front of the fake
// Anthropic provider. The package ships a native binary in a per-platform
// optional dependency; `npm ci --ignore-scripts` installs it without
// running the package's postinstall (which only copies it into place), and
// the tests run it from there. Without node and npm, or without a binary
// for this platform, the tests skip, unless LLMGATE_REQUIRE_NODE=1, when
// they fail.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

const (
	claudeCodeClient    = "claude-code"
	claudeCodeClientKey = "sk-gw-claude-code-e2e-4711"
	claudeCodeUpstream  = "sk-ant-e2e-upstream-key"
	// claudeCodeModel is a model no provider has: the fake answers any.
	claudeCodeModel = "claude-fake-e2e"
	// claudeCodeRun bounds one `claude -p`, start-up included.
	claudeCodeRun = 2 * time.Minute
	fakeAnswer    = "Hello from the fake Anthropic provider."
)

var (
	claudeCodeOnce sync.Once
	claudeCodePath string // the native binary
	claudeCodeSkip string // why the tests skip, when they may
	claudeCodeErr  error
)

// claudeCodeBin is the pinned Claude Code's native binary, installed on
// first use.
func claudeCodeBin(t *testing.T) string {
	t.Helper()
	claudeCodeOnce.Do(installClaudeCode)
	if claudeCodeSkip != "" {
		if os.Getenv("LLMGATE_REQUIRE_NODE") == "1" {
			t.Fatalf("LLMGATE_REQUIRE_NODE=1: %s", claudeCodeSkip)
		}
		t.Skipf("%s (set LLMGATE_REQUIRE_NODE=1 to fail instead)", claudeCodeSkip)
	}
	if claudeCodeErr != nil {
		t.Fatal(claudeCodeErr)
	}
	return claudeCodePath
}

// installClaudeCode installs e2e/recipes/claudecode (installLockedNPM)
// and finds the binary for this platform.
func installClaudeCode() {
	dir, skip, err := installLockedNPM(filepath.Join("recipes", "claudecode"), "recipes-claudecode")
	if skip != "" || err != nil {
		claudeCodeSkip, claudeCodeErr = skip, err
		return
	}
	claudeCodePath, claudeCodeSkip = claudeCodeNative(filepath.Join(dir, "node_modules", "@anthropic-ai"))
}

// installLockedNPM installs the npm project in src — its package.json and
// package-lock.json, with `npm ci` — into a directory under the user's
// cache named prefix and the hash of those two files, unless an earlier
// run did, and returns that directory. It installs into a temporary
// directory renamed into place, so concurrent runs never see half an
// install. skip says why the tests skip (when they may): node or npm
// missing, or npm ci failing (no registry).
func installLockedNPM(src, prefix string) (dir, skip string, err error) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", tool + " is not installed", nil
		}
	}
	h := sha256.New()
	files := map[string][]byte{}
	for _, name := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			return "", "", err
		}
		files[name] = b
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir = filepath.Join(cache, "llmgate-e2e", prefix+"-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err == nil {
		return dir, "", nil
	}
	skip, err = npmCI(src, dir, files)
	return dir, skip, err
}

// npmCI installs files (a package.json and its lock, from src) into dir.
// It returns why the tests skip when npm cannot install (no registry), or
// an error.
func npmCI(src, dir string, files map[string][]byte) (skip string, err error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "install-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
			return "", err
		}
	}
	ctx, cancel := contextWithTimeout(5 * time.Minute)
	defer cancel()
	// --ignore-scripts: no package's install script runs (Claude Code's
	// postinstall only copies the platform's binary over a stub; the tests
	// run it where npm put it).
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error")
	cmd.Dir = tmp
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Sprintf("npm ci in e2e/%s failed (no registry?): %v\n%s", filepath.ToSlash(src), err, b), nil
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); statErr != nil {
			return "", fmt.Errorf("install e2e/%s: %w", filepath.ToSlash(src), err)
		}
	}
	return "", nil
}

// claudeCodeNative is the path of the native binary npm installed under
// scope (node_modules/@anthropic-ai) for this platform, or why there is
// none.
func claudeCodeNative(scope string) (path, skip string) {
	arch := map[string]string{"amd64": "x64", "arm64": "arm64"}[runtime.GOARCH]
	if arch == "" || (runtime.GOOS != "linux" && runtime.GOOS != "darwin") {
		return "", "Claude Code ships no binary for " + runtime.GOOS + "/" + runtime.GOARCH + " that this test knows"
	}
	for _, pkg := range []string{"claude-code-" + runtime.GOOS + "-" + arch, "claude-code-" + runtime.GOOS + "-" + arch + "-musl"} {
		p := filepath.Join(scope, pkg, "claude")
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, ""
		}
	}
	return "", "npm installed no Claude Code binary for " + runtime.GOOS + "/" + runtime.GOARCH + " under " + scope
}

// egressTrap stands in for every host but loopback: Claude Code is given
// it as its HTTP(S) proxy, so whatever it would send elsewhere
// (telemetry, updates, error reports) is refused here and recorded.
type egressTrap struct {
	mu    sync.Mutex
	hosts []string
}

func (e *egressTrap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.hosts = append(e.hosts, r.Host)
	e.mu.Unlock()
	http.Error(w, "no network in this test", http.StatusForbidden)
}

func (e *egressTrap) seen() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.hosts...)
}

// claudeCodeGateway is a gateway process with one client, claudeCodeClient,
// in front of the fake Anthropic provider.
type claudeCodeGateway struct {
	url  string // the gateway's root, ANTHROPIC_BASE_URL
	ant  *fakeprovider.Anthropic
	proc *proc
}

// startClaudeCodeGateway starts it, with retry.max_attempts attempts;
// clientExtra is added to the client's config entry (its
// derive_idempotency_key, say).
func startClaudeCodeGateway(t *testing.T, attempts int, clientExtra string) *claudeCodeGateway {
	t.Helper()
	ant := fakeprovider.NewAnthropic()
	up := httptest.NewServer(ant)
	t.Cleanup(up.Close)
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
data_dir: %s
log:
  format: json
  level: info
upstreams:
  - name: anthropic
    api: anthropic
    base_url: %s
    api_key: %s
    models: ["*"]
    timeout: 30s
retry:
  max_attempts: %d
  base_delay: 5ms
  max_delay: 20ms
clients:
  - name: %s
    key: %s
%s
server:
  shutdown_grace: 5s
`, t.TempDir(), up.URL, claudeCodeUpstream, attempts, claudeCodeClient, claudeCodeClientKey, clientExtra)
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	writeFile(t, path, cfg)
	p := start(t, gatewayBin(t, ""), []string{"-config", path}, nil)
	return &claudeCodeGateway{url: p.URL, ant: ant, proc: p}
}

// claudeCodeRunResult is what one `claude -p` printed.
type claudeCodeRunResult struct {
	stdout, stderr string
	err            error
	took           time.Duration
	egress         []string // the hosts it tried to reach through egressTrap
}

// runClaudeCode runs the pinned `claude -p prompt` with ANTHROPIC_BASE_URL
// at base and the client's key in the environment variable auth
// (ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN), in a HOME and working
// directory of its own, with everything but loopback sent to an
// egressTrap as its proxy.
func runClaudeCode(t *testing.T, base, auth, prompt string) claudeCodeRunResult {
	t.Helper()
	bin := claudeCodeBin(t)
	egress := &egressTrap{}
	trapSrv := httptest.NewServer(egress)
	defer trapSrv.Close()
	trap := trapSrv.URL
	home := t.TempDir()
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), claudeCodeRun)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-p", prompt, "--model", claudeCodeModel)
	cmd.Dir = work
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(claudeCodeBaseEnv(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"),
		"CLAUDE_CONFIG_DIR="+filepath.Join(home, ".claude"), "ANTHROPIC_BASE_URL="+base, auth+"="+claudeCodeClientKey,
		"HTTPS_PROXY="+trap, "HTTP_PROXY="+trap, "https_proxy="+trap, "http_proxy="+trap,
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost",
		"DISABLE_TELEMETRY=1", "DISABLE_AUTOUPDATER=1", "DISABLE_ERROR_REPORTING=1", "DISABLE_BUG_COMMAND=1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "CLAUDE_CODE_ENABLE_TELEMETRY=0", "DO_NOT_TRACK=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("claude -p did not finish within %v: %w", claudeCodeRun, err)
	}
	return claudeCodeRunResult{stdout: stdout.String(), stderr: stderr.String(), err: err, took: time.Since(start), egress: egress.seen()}
}

// claudeCodeBaseEnv is the test process's environment without anything
// that would point Claude Code elsewhere (the user's own keys, base URL,
// proxies, config).
func claudeCodeBaseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "ANTHROPIC_"), strings.HasPrefix(k, "CLAUDE_"),
			strings.EqualFold(k, "HTTPS_PROXY"), strings.EqualFold(k, "HTTP_PROXY"), strings.EqualFold(k, "NO_PROXY"),
			strings.EqualFold(k, "ALL_PROXY"), k == "HOME", k == "XDG_CONFIG_HOME":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// stepRequests are the requests of the fake that carry prompt: the
// agent's step, not its side calls.
func stepRequests(ant *fakeprovider.Anthropic, prompt string) []fakeprovider.AnthropicRequest {
	var out []fakeprovider.AnthropicRequest
	for _, r := range ant.Requests() {
		if r.Path == "/v1/messages" && bytes.Contains(r.Body, []byte(prompt)) {
			out = append(out, r)
		}
	}
	return out
}

// TestClaudeCodeHeadless: `claude -p` with ANTHROPIC_BASE_URL at the
// gateway prints the fake's answer, once with the gateway key in
// ANTHROPIC_API_KEY (sent as x-api-key) and once in ANTHROPIC_AUTH_TOKEN
// (Authorization: Bearer). The provider sees /v1/messages?beta=true,
// streaming, anthropic-version, Claude Code's session header, its own
// key — never the client's gateway key.
func TestClaudeCodeHeadless(t *testing.T) {
	claudeCodeBin(t) // skip before starting anything
	var egress []string
	for _, auth := range []string{"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"} {
		t.Run(auth, func(t *testing.T) {
			g := startClaudeCodeGateway(t, 3, "")
			prompt := "Say hello to llmgate (" + auth + ")."
			hop := &lossyHop{next: g.url, marker: []byte(prompt)}
			hopSrv := httptest.NewServer(hop)
			t.Cleanup(hopSrv.Close)
			res := runClaudeCode(t, hopSrv.URL, auth, prompt)
			egress = append(egress, res.egress...)
			sent := hop.stepHeader()
			names := make([]string, 0, len(sent))
			for k := range sent {
				names = append(names, k)
			}
			slices.Sort(names)
			t.Logf("Claude Code sent the headers %v", names)
			if got := sent.Get(map[string]string{"ANTHROPIC_API_KEY": "X-Api-Key", "ANTHROPIC_AUTH_TOKEN": "Authorization"}[auth]); !strings.Contains(got, claudeCodeClientKey) {
				t.Errorf("%s: Claude Code sent the key as %q", auth, got)
			}
			t.Logf("claude -p took %v", res.took.Round(time.Millisecond))
			if res.err != nil {
				t.Fatalf("claude -p: %v\nstdout: %s\nstderr: %s\ngateway: %s", res.err, res.stdout, res.stderr, g.proc.stderr.String())
			}
			if !strings.Contains(res.stdout, fakeAnswer) {
				t.Errorf("claude -p printed %q, want the fake's answer %q", res.stdout, fakeAnswer)
			}
			steps := stepRequests(g.ant, prompt)
			if len(steps) == 0 {
				t.Fatalf("the fake saw no request with the prompt; it saw %d requests", len(g.ant.Requests()))
			}
			st := steps[0]
			checkClaudeCodeRequest(t, st)
			for i, r := range g.ant.Requests() {
				t.Logf("upstream request %d: %s?%s %d bytes, session %q, beta %q", i, r.Path, r.RawQuery, len(r.Body),
					r.Header.Get("X-Claude-Code-Session-Id"), r.Header.Get("Anthropic-Beta"))
				if leaksClientKey(r) {
					t.Errorf("upstream request %d carries the client's gateway key", i)
				}
			}
		})
	}
	t.Logf("egress refused (non-loopback hosts Claude Code tried through its proxy): %v", egress)
}

// checkClaudeCodeRequest checks the agent's step as the provider saw it.
func checkClaudeCodeRequest(t *testing.T, st fakeprovider.AnthropicRequest) {
	t.Helper()
	if st.RawQuery != "beta=true" {
		t.Errorf("query %q, want beta=true", st.RawQuery)
	}
	var body struct {
		Stream bool   `json:"stream"`
		Model  string `json:"model"`
	}
	if err := json.Unmarshal(st.Body, &body); err != nil || !body.Stream || body.Model != claudeCodeModel {
		t.Errorf("body stream=%v model=%q (%v), want a stream of %s", body.Stream, body.Model, err, claudeCodeModel)
	}
	if st.Header.Get("Anthropic-Version") == "" {
		t.Error("no anthropic-version")
	}
	if st.Header.Get("X-Claude-Code-Session-Id") == "" {
		t.Error("no x-claude-code-session-id")
	}
	if got := st.Header.Get("X-Api-Key"); got != claudeCodeUpstream {
		t.Errorf("x-api-key %q, want the upstream's key", got)
	}
	t.Logf("step: %d bytes, anthropic-version %q, anthropic-beta %q, retry count %q, idempotency-key %q",
		len(st.Body), st.Header.Get("Anthropic-Version"), st.Header.Get("Anthropic-Beta"),
		st.Header.Get("X-Stainless-Retry-Count"), st.Header.Get("Idempotency-Key"))
}

// leaksClientKey reports whether r carries the client's gateway key in
// any header or its body.
func leaksClientKey(r fakeprovider.AnthropicRequest) bool {
	for _, vs := range r.Header {
		for _, v := range vs {
			if strings.Contains(v, claudeCodeClientKey) {
				return true
			}
		}
	}
	return bytes.Contains(r.Body, []byte(claudeCodeClientKey))
}

// lossyHop sits between Claude Code and the gateway and loses the answer
// to the first request carrying marker: it sends the request on, reads
// the gateway's whole answer (so a keyed call has committed), and then
// drops the client's connection without a byte — an answer lost on the
// way back. Everything else it passes through. It records the
// x-stainless-retry-count of every request with marker, and the bytes
// the gateway answered it (lost or passed on).
type lossyHop struct {
	next    string // the gateway's root
	marker  []byte
	lose    bool // lose the first answer; false: pass everything
	mu      sync.Mutex
	tries   []string
	answers [][]byte    // the gateway's answer to each request with marker
	header  http.Header // the first step request's headers
}

func (l *lossyHop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	l.mu.Lock()
	step := bytes.Contains(body, l.marker)
	first := step && len(l.tries) == 0
	if first {
		l.header = r.Header.Clone()
	}
	if step {
		l.tries = append(l.tries, r.Header.Get("X-Stainless-Retry-Count"))
	}
	first = first && l.lose
	l.mu.Unlock()
	req, _ := http.NewRequestWithContext(r.Context(), r.Method, l.next+r.URL.RequestURI(), bytes.NewReader(body))
	req.Header = r.Header.Clone()
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer res.Body.Close()
	var got bytes.Buffer
	if step {
		defer func() {
			l.mu.Lock()
			l.answers = append(l.answers, got.Bytes())
			l.mu.Unlock()
		}()
	}
	if first {
		_, _ = io.Copy(&got, res.Body)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset, as a dropped connection looks
			}
			conn.Close()
		}
		return
	}
	for k, vs := range res.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(res.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := res.Body.Read(buf)
		if n > 0 {
			got.Write(buf[:n])
			_, _ = w.Write(buf[:n])
			_ = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

// stepHeader is the header of the step's first request, as Claude Code
// sent it.
func (l *lossyHop) stepHeader() http.Header {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.header.Clone()
}

// stepAnswers are the gateway's answers to the requests with marker, in
// the order they ended.
func (l *lossyHop) stepAnswers() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][]byte(nil), l.answers...)
}

func (l *lossyHop) retryCounts() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.tries...)
}

// TestClaudeCodeRetryReplayed: with derive_idempotency_key on for the
// client, the answer to Claude Code's step (a stream) is lost on the way
// back (lossyHop); Claude Code retries the step itself, and the gateway
// answers the retry from its store: the provider is called once for the
// step, the retry's stream is the lost one byte for byte, the log line
// says replayed and derived.
func TestClaudeCodeRetryReplayed(t *testing.T) {
	claudeCodeBin(t) // skip before starting anything
	g := startClaudeCodeGateway(t, 3, deriveSession)
	prompt := "Summarize order 4711 for llmgate."
	hop := &lossyHop{next: g.url, marker: []byte(prompt), lose: true}
	hopSrv := httptest.NewServer(hop)
	t.Cleanup(hopSrv.Close)

	res := runClaudeCode(t, hopSrv.URL, "ANTHROPIC_AUTH_TOKEN", prompt)
	t.Logf("claude -p took %v; x-stainless-retry-count of the step's tries: %v", res.took.Round(time.Millisecond), hop.retryCounts())
	if res.err != nil {
		t.Fatalf("claude -p: %v\nstdout: %s\nstderr: %s\ngateway: %s", res.err, res.stdout, res.stderr, g.proc.stderr.String())
	}
	if !strings.Contains(res.stdout, fakeAnswer) {
		t.Errorf("claude -p printed %q, want the fake's answer %q", res.stdout, fakeAnswer)
	}
	if tries := hop.retryCounts(); len(tries) < 2 {
		t.Fatalf("Claude Code sent the step %d times (retry counts %v), want a retry", len(tries), tries)
	}
	if n := len(stepRequests(g.ant, prompt)); n != 1 {
		t.Errorf("the provider was called %d times for the step, want 1", n)
	}
	answers := hop.stepAnswers()
	if len(answers) < 2 || !bytes.Contains(answers[0], []byte("event: message_stop")) || !bytes.Equal(answers[0], answers[len(answers)-1]) {
		t.Errorf("the retry's stream is not the lost one byte for byte (%d answers):\n%s", len(answers), bytes.Join(answers, []byte("\n---\n")))
	}
	var replayed int
	for _, line := range strings.Split(g.proc.stderr.String(), "\n") {
		if strings.Contains(line, `"path":"/v1/messages"`) && strings.Contains(line, `"idempotency_key_source":"derived"`) &&
			strings.Contains(line, `"replayed":true`) {
			replayed++
		}
	}
	if replayed == 0 {
		t.Errorf("no log line of a derived, replayed /v1/messages:\n%s", g.proc.stderr.String())
	}
	t.Logf("log lines of derived, replayed /v1/messages: %d", replayed)
}

// deriveSession turns derive_idempotency_key on for the client.
const deriveSession = "    derive_idempotency_key:\n      from_header: x-claude-code-session-id\n"

// TestClaudeCode529: a 529 from the provider is retried by the gateway,
// not by Claude Code: the gateway's error answers carry x-should-retry:
// false, and Claude Code honours it. With the gateway's retries on
// (max_attempts 3) Claude Code sends the step once and prints the answer
// of the gateway's second attempt; with them off (max_attempts 1) it gets
// the 529, does not retry, and exits 1. Either way the derived key holds
// nothing for a failed step: a failure is not committed.
func TestClaudeCode529(t *testing.T) {
	claudeCodeBin(t) // skip before starting anything
	for _, tc := range []struct {
		attempts, upstreamCalls int
		ok                      bool
	}{{3, 2, true}, {1, 1, false}} {
		t.Run(fmt.Sprintf("max_attempts=%d", tc.attempts), func(t *testing.T) {
			g := startClaudeCodeGateway(t, tc.attempts, deriveSession)
			g.ant.Enqueue(fakeprovider.AnthropicStep{Status: 529})
			prompt := fmt.Sprintf("Summarize order 4712 for llmgate (%d).", tc.attempts)
			hop := &lossyHop{next: g.url, marker: []byte(prompt)}
			hopSrv := httptest.NewServer(hop)
			t.Cleanup(hopSrv.Close)

			res := runClaudeCode(t, hopSrv.URL, "ANTHROPIC_API_KEY", prompt)
			t.Logf("claude -p took %v, err %v; x-stainless-retry-count of the step's tries: %v; stdout %q",
				res.took.Round(time.Millisecond), res.err, hop.retryCounts(), strings.TrimSpace(res.stdout))
			if ok := res.err == nil && strings.Contains(res.stdout, fakeAnswer); ok != tc.ok {
				t.Errorf("answered %v, want %v:\nstdout: %s\nstderr: %s", ok, tc.ok, res.stdout, res.stderr)
			}
			if tries := hop.retryCounts(); len(tries) != 1 {
				t.Errorf("Claude Code sent the step %d times (retry counts %v), want once", len(tries), tries)
			}
			if n := len(stepRequests(g.ant, prompt)); n != tc.upstreamCalls {
				t.Errorf("the provider was called %d times for the step, want %d", n, tc.upstreamCalls)
			}
		})
	}
}
