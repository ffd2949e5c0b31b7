package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/e2e/load/cgroup"
)

// childLine prefixes the line a child prints once it listens; the address
// follows it.
const childLine = "load child listening on "

func isChildMode(arg string) bool {
	return arg == "-serve-fake" || arg == "-serve-floor" || arg == "--serve-fake" || arg == "--serve-floor"
}

// runChild serves the fake upstream or the floor proxy until ctx ends or
// stdin closes (the parent went away).
func runChild(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("load child", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fakeAddr := fs.String("serve-fake", "", "serve the fake upstream on `addr`")
	floorAddr := fs.String("serve-floor", "", "serve the floor proxy on `addr`")
	target := fs.String("target", "", "the floor proxy's upstream `URL`")
	latency := fs.Duration("latency", 0, "fake: delay before each answer")
	chunkDelay := fs.Duration("chunk-delay", 0, "fake: delay between stream events")
	content := fs.Int("content-bytes", 0, "fake: completion content size")
	chunks := fs.Int("chunks", 0, "fake: content chunks per stream (0: ~64-byte chunks)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	raiseFileLimit()

	var h http.Handler
	addr := *fakeAddr
	switch {
	case *fakeAddr != "" && *floorAddr == "":
		fake := fakeprovider.New(fakeprovider.Options{
			Latency: *latency, ChunkDelay: *chunkDelay, ContentBytes: *content, Chunks: *chunks,
			KeepRequests: -1,
		})
		defer fake.Close()
		h = fake
	case *floorAddr != "" && *fakeAddr == "":
		addr = *floorAddr
		u, err := url.Parse(*target)
		if err != nil || u.Scheme != "http" || !isLoopback(u.Host) {
			return fmt.Errorf("-target %q: want an http URL on a loopback address", *target)
		}
		h = floorProxy(u)
	default:
		return errors.New("want exactly one of -serve-fake and -serve-floor")
	}
	if !isLoopback(addr) {
		return fmt.Errorf("%s: not a loopback address", addr)
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "%shttp://%s\n", childLine, ln.Addr())

	gone := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(gone)
	}()
	select {
	case err := <-serveErr:
		return err
	case <-ctx.Done():
	case <-gone:
	}
	return srv.Close()
}

// floorProxy is the floor: a bare httputil.ReverseProxy with a transport
// shaped like the gateway's upstream transport (gateway/upstream.go: a
// pool of 256 idle connections), so the comparison is about what the
// gateway does per request, not about pool sizes. FlushInterval -1 flushes
// after every write, so streams are not held back.
//
// Why EnableFullDuplex: without it, when the fake answers at once, the
// HTTP/1 server closes the inbound request body as the proxy writes the
// response headers, while the proxy's transport may still be reading that
// body (its check for bytes beyond Content-Length); the transport then
// fails the request write and closes the upstream connection, cutting the
// stream (~3% of streams here, "read error during body copy: use of closed
// network connection"). A floor that drops streams is no floor; full
// duplex is how a streaming HTTP/1 proxy should run, and costs nothing.
// llmgate is not exposed to this: it reads the whole body first.
func floorProxy(target *url.URL) http.Handler {
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		FlushInterval: -1,
		Transport:     tr,
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		rp.ServeHTTP(w, r)
	})
}

// isLoopback reports whether hostport (or a bare host) is 127.0.0.0/8 or
// ::1. Names are not resolved: only literal addresses pass.
func isLoopback(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// tail keeps the last bytes written to it, for diagnostics.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	const keep = 16 << 10
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*keep {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-keep:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// child is a running child process: a fake, a floor or the gateway.
type child struct {
	name    string
	cmd     *exec.Cmd
	URL     string // http://127.0.0.1:port
	stdin   io.Closer
	stderr  *tail
	exited  chan struct{}
	waitErr error
	started time.Time
	// The gateway's /metrics URL and the admin token it takes; empty for
	// the fakes and floors.
	metricsURL, adminToken string
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// storeChoice is the gateway's store: badger (in the data dir) or redis.
type storeChoice struct {
	Kind        string `json:"kind"`
	RedisURL    string `json:"redis_url,omitempty"`
	RedisPrefix string `json:"redis_prefix,omitempty"` // fresh per run
}

// inCgroup is the hidden first argument that makes the tool move itself
// into a cgroup and exec a program there: `load -in-cgroup DIR BIN ARGS...`.
// The program starts inside the group, before it allocates anything.
const inCgroup = "-in-cgroup"

// execInCgroup enters the cgroup at args[0] and replaces this process
// with args[1:]. It returns only on failure.
func execInCgroup(args, env []string) error {
	if len(args) < 2 {
		return errors.New(inCgroup + " DIR BIN [ARGS...]")
	}
	if err := cgroup.Enter(args[0]); err != nil {
		return fmt.Errorf("enter cgroup %s: %w", args[0], err)
	}
	return syscall.Exec(args[1], args[1:], env)
}

// childSpec is a child process to start.
type childSpec struct {
	name  string // for logs and errors
	bin   string
	args  []string
	env   []string
	ready string // the prefix of the stdout line that names its address
}

// startChild starts the child and waits (at most 60s) for the line
// starting with sp.ready that names its address.
func startChild(ctx context.Context, sp childSpec) (*child, error) {
	name, prefix := sp.name, sp.ready
	cmd := exec.Command(sp.bin, sp.args...)
	cmd.Env = sp.env
	// If the load tool dies, its children die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c := &child{name: name, cmd: cmd, stderr: &tail{}, exited: make(chan struct{})}
	cmd.Stderr = c.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	c.stdin = stdin
	c.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		found := false
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), prefix); ok && !found {
				found = true
				lines <- u
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	timer := time.NewTimer(60 * time.Second)
	defer timer.Stop()
	select {
	case u := <-lines:
		pu, err := url.Parse(u)
		if err != nil || !isLoopback(pu.Host) {
			c.stop()
			return nil, fmt.Errorf("%s: listening on %q, not a loopback URL", name, u)
		}
		c.URL = strings.TrimSuffix(u, "/")
		return c, nil
	case <-c.exited:
		return nil, fmt.Errorf("%s exited before listening: %v\n%s", name, c.waitErr, c.stderr)
	case <-timer.C:
	case <-ctx.Done():
	}
	c.stop()
	return nil, fmt.Errorf("%s did not start listening\n%s", name, c.stderr)
}

// stop ends the child: stdin closed and SIGTERM, then SIGKILL after 15s.
func (c *child) stop() {
	select {
	case <-c.exited:
		return
	default:
	}
	_ = c.stdin.Close()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(15 * time.Second)
	defer t.Stop()
	select {
	case <-c.exited:
	case <-t.C:
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// alive reports an error if the child has exited.
func (c *child) alive() error {
	select {
	case <-c.exited:
		return fmt.Errorf("%s exited: %v\n%s", c.name, c.waitErr, c.stderr)
	default:
		return nil
	}
}

// childEnv is the environment minus what could point a child elsewhere:
// proxies, and the gateway's and OpenAI's own variables.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		u := strings.ToUpper(k)
		if strings.HasSuffix(u, "_PROXY") || strings.HasPrefix(u, "GATEWAY_") ||
			strings.HasPrefix(u, "OPENAI_") || strings.HasPrefix(u, "LLMGATE_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// buildGateway builds cmd/gateway into dir, from the module that holds the
// working directory.
func buildGateway(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the llmgate module; run from the repository or pass -gateway")
	}
	bin := filepath.Join(dir, "gateway")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/gateway")
	cmd.Dir = filepath.Dir(mod)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/gateway: %w\n%s", err, b)
	}
	return bin, nil
}

// gatewaySetup is what the gateway's config says: where it keeps its data,
// its admin token, its store, and the base URL of each fake (big is empty
// without -big).
type gatewaySetup struct {
	dataDir    string
	adminToken string
	store      storeChoice
	fake       string
	slow       string
	big        string
}

// gatewayConfig routes each model to its own fake: gpt-4o-mini to the
// ordinary one, slow-gpt to the slow one, big-gpt to the one answering
// -big-bytes; and claude-load, on /v1/messages, to the ordinary one
// through an api: anthropic upstream (whose base_url has no /v1, as
// Anthropic documents its own).
func gatewayConfig(gs gatewaySetup) string {
	dataDir, adminToken, st := gs.dataDir, gs.adminToken, gs.store
	fake, slow, big := gs.fake, gs.slow, gs.big
	var b strings.Builder
	fmt.Fprintf(&b, `listen: 127.0.0.1:0
data_dir: %s
admin_token: %q
log: {level: warn}
`, dataDir, adminToken)
	if st.Kind == "redis" {
		fmt.Fprintf(&b, "store: {kind: redis, redis: {url: %q, prefix: %q}}\n", st.RedisURL, st.RedisPrefix)
	}
	b.WriteString("upstreams:\n")
	// The big stream may take longer than the brief's 30s per attempt on a
	// slow machine; it is bounded by the client's own deadline instead.
	for _, u := range []struct{ name, url, model, timeout string }{
		{"fake", fake, modelFast, "30s"}, {"slow", slow, modelSlow, "30s"}, {"big", big, modelBig, "5m"},
	} {
		if u.url == "" {
			continue
		}
		fmt.Fprintf(&b, `  - name: %s
    base_url: %s/v1
    api_key: sk-load
    models: [%q]
    timeout: %s
`, u.name, u.url, u.model, u.timeout)
	}
	fmt.Fprintf(&b, `  - name: anthropic
    base_url: %s
    api: anthropic
    api_key: sk-load
    models: [%q]
    timeout: 30s
`, fake, modelMessages)
	// Two clients: the legs' own, and one with budgets that never run out
	// (a day and a minute of total tokens), for the budgeted legs: what
	// reserving and settling costs, beside the same legs without.
	fmt.Fprintf(&b, `clients:
  - {name: load, key: %q}
  - name: load-budgeted
    key: %q
    budgets:
      - {window: day, tokens: 1000000000000000}
      - {window: minute, tokens: 1000000000000000}
`, loadClientKey, budgetedClientKey)
	b.WriteString(`retry: {max_attempts: 1}
idempotency: {wait_timeout: 60s}
limits: {}
server: {shutdown_grace: 5s}
`)
	return b.String()
}
