// Package e2e holds llmgate's end-to-end tests: the real gateway binary,
// started as a process, in front of the scripted fake upstream
// (e2e/fakeprovider), driven by go-openai as a user's code would and by
// raw HTTP where bytes matter.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	binDir   string
	bins     = map[string]string{}
	buildMu  sync.Mutex
	buildErr = map[string]error{}
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "llmgate-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// gatewayBin builds cmd/gateway once per test run (with build tags, e.g.
// "failpoints" for crash injection) and returns the binary's path.
func gatewayBin(t *testing.T, tags string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := bins[tags]; ok {
		return p
	}
	if err, ok := buildErr[tags]; ok {
		t.Fatal(err)
	}
	out := filepath.Join(binDir, "gateway"+strings.ReplaceAll(tags, ",", "-"))
	args := []string{"build", "-o", out}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, "github.com/llmgate/llmgate/cmd/gateway")
	cmd := exec.Command("go", args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		buildErr[tags] = fmt.Errorf("go build: %v\n%s", err, b)
		t.Fatal(buildErr[tags])
	}
	bins[tags] = out
	return out
}

// proc is a running gateway process.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	URL    string
	stderr *syncBuffer
	exited chan error
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// start runs the gateway binary with args and env, and waits for its
// "listening" line (the address is read from it, so tests use port 0).
func start(t *testing.T, bin string, args, env []string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	p := &proc{t: t, cmd: cmd, stderr: &syncBuffer{}, exited: make(chan error, 1)}
	cmd.Stderr = p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "llmgate listening on "); ok {
				lines <- u
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() { p.exited <- cmd.Wait() }()
	select {
	case p.URL = <-lines:
	case err := <-p.exited:
		t.Fatalf("gateway exited before listening: %v\n%s", err, p.stderr.String())
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("gateway did not start:\n%s", p.stderr.String())
	}
	t.Cleanup(func() { p.kill() })
	return p
}

// kill ends the process with SIGKILL and waits for it.
func (p *proc) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	p.wait(10 * time.Second)
}

// wait waits for the process to exit and returns its error.
func (p *proc) wait(d time.Duration) error {
	select {
	case err := <-p.exited:
		p.exited <- err
		return err
	case <-time.After(d):
		p.t.Fatalf("gateway did not exit within %v\n%s", d, p.stderr.String())
		return nil
	}
}

// writeConfig writes a gateway config for one upstream at upstreamURL.
func writeConfig(t *testing.T, dataDir, upstreamURL, extra string) string {
	t.Helper()
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
data_dir: %s
admin_token: e2e-admin-token
log:
  format: json
  level: debug
upstreams:
  - name: fake
    base_url: %s/v1
    api_key: sk-e2e-upstream-key
    models: ["*"]
    timeout: 10s
retry:
  max_attempts: 3
  base_delay: 5ms
  max_delay: 20ms
%s`, dataDir, upstreamURL, extra)
	if !strings.Contains(extra, "server:") {
		cfg += "server:\n  shutdown_grace: 10s\n"
	}
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// httpClient is the tests' HTTP client: its limit covers reading the answer,
// so that a gateway that hangs fails a test instead of hanging it. No
// request of these tests takes half as long (the longest waits are a
// replica's 30s wait_timeout and lease takeovers of a few seconds).
var httpClient = &http.Client{Timeout: 60 * time.Second}

func post(t *testing.T, url, body string, hdr map[string]string) (int, http.Header, []byte) {
	t.Helper()
	status, h, b, err := tryPost(url, body, hdr)
	if err != nil {
		t.Fatal(err)
	}
	return status, h, b
}

// tryPost is post for goroutines other than the test's, which must not
// call t.Fatal: it returns the error instead.
func tryPost(url, body string, hdr map[string]string) (int, http.Header, []byte, error) {
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("POST %s: %w", url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, b, nil
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
