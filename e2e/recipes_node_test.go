package e2e

// The Node recipes of issue 16 — the official SDK (npm "openai") and
// LangChain.js (@langchain/openai) — run as written
// (e2e/recipes/node/recipe_*.mjs, through driver.mjs) by recipeSuite, and
// what they warn against is measured: the SDK's idempotencyKey option, and
// LangChain's own retries. The same driver runs the Anthropic TypeScript
// SDK's recipe (recipe_anthropic.mjs) for recipes_anthropic_test.go.
//
// The npm project's versions are pinned (package.json and
// package-lock.json); `npm ci` installs them once per lock file into the
// user's cache directory. Without node and npm these tests skip, unless
// LLMGATE_REQUIRE_NODE=1, when they fail.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

var (
	recipeNodeOnce sync.Once
	recipeNodeDir  string // node_modules installed from the lock file
	recipeNodeErr  error
	recipeNodeSkip string // why the Node tests skip, when they may
)

// nodeRecipes returns a fresh directory holding the Node recipes and their
// installed dependencies, ready for `node driver.mjs`.
func nodeRecipes(t *testing.T) string {
	t.Helper()
	recipeNodeOnce.Do(installNodeRecipes)
	if recipeNodeSkip != "" {
		if os.Getenv("LLMGATE_REQUIRE_NODE") == "1" {
			t.Fatalf("LLMGATE_REQUIRE_NODE=1: %s", recipeNodeSkip)
		}
		t.Skipf("%s (set LLMGATE_REQUIRE_NODE=1 to fail instead)", recipeNodeSkip)
	}
	if recipeNodeErr != nil {
		t.Fatal(recipeNodeErr)
	}
	src := filepath.Join("recipes", "node")
	dir := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if name := e.Name(); strings.HasSuffix(name, ".mjs") || name == "package.json" {
			b, err := os.ReadFile(filepath.Join(src, name))
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(dir, name), string(b))
		}
	}
	if err := os.Symlink(filepath.Join(recipeNodeDir, "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// installNodeRecipes installs e2e/recipes/node (installLockedNPM), on a
// Node new enough for its packages.
func installNodeRecipes() {
	if _, err := exec.LookPath("node"); err == nil {
		out, err := exec.Command("node", "--version").Output()
		if err != nil {
			recipeNodeSkip = fmt.Sprintf("node --version: %v", err)
			return
		}
		major, _ := strconv.Atoi(strings.TrimPrefix(strings.SplitN(strings.TrimSpace(string(out)), ".", 2)[0], "v"))
		if major < 20 {
			recipeNodeSkip = fmt.Sprintf("node %s is older than 20, which @langchain/openai needs", strings.TrimSpace(string(out)))
			return
		}
	}
	recipeNodeDir, recipeNodeSkip, recipeNodeErr = installLockedNPM(filepath.Join("recipes", "node"), "recipes-node")
}

// recipeNodeDriver is one `node driver.mjs` process, serving a test's calls
// concurrently: one JSON request line in, one result line out, matched by
// seq. One process per test keeps Node's start-up (seconds on a loaded
// machine) out of the timings the suite depends on.
type recipeNodeDriver struct {
	stdin   io.WriteCloser
	stderr  *syncBuffer
	mu      sync.Mutex
	seq     int
	waiting map[int]chan recipeResult
	gone    chan struct{} // closed when the process's stdout ends
}

func startRecipeNodeDriver(t *testing.T, dir string, g *recipeGateway) *recipeNodeDriver {
	t.Helper()
	return startNodeDriver(t, dir, "LLMGATE_BASE_URL="+g.base, "LLMGATE_API_KEY="+recipeClientKey)
}

// startNodeDriver starts `node driver.mjs` in dir with env added to the
// environment (the base URLs and the client key the driver reads).
func startNodeDriver(t *testing.T, dir string, env ...string) *recipeNodeDriver {
	t.Helper()
	cmd := exec.Command("node", filepath.Join(dir, "driver.mjs"))
	cmd.Env = append(os.Environ(), env...)
	d := &recipeNodeDriver{stderr: &syncBuffer{}, waiting: map[int]chan recipeResult{}, gone: make(chan struct{})}
	cmd.Stderr = d.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.stdin = stdin
	go func() {
		defer close(d.gone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var r struct {
				Seq int `json:"seq"`
				recipeResult
			}
			if json.Unmarshal(sc.Bytes(), &r) != nil {
				continue
			}
			d.mu.Lock()
			ch := d.waiting[r.Seq]
			delete(d.waiting, r.Seq)
			d.mu.Unlock()
			if ch != nil {
				ch <- r.recipeResult
			}
		}
	}()
	t.Cleanup(func() {
		stdin.Close() // the driver exits when its calls have ended
		select {
		case <-d.gone:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
		_ = cmd.Wait()
	})
	return d
}

// call runs one recipe call in the driver and waits for its result.
func (d *recipeNodeDriver) call(variant, orderID, text, deadline string) (recipeResult, error) {
	ch := make(chan recipeResult, 1)
	d.mu.Lock()
	d.seq++
	seq := d.seq
	d.waiting[seq] = ch
	line, _ := json.Marshal(map[string]any{"seq": seq, "variant": variant, "orderId": orderID, "text": text, "deadline": deadline})
	_, err := d.stdin.Write(append(line, '\n'))
	d.mu.Unlock()
	if err != nil {
		return recipeResult{}, fmt.Errorf("node driver: %v\n%s", err, d.stderr.String())
	}
	select {
	case r := <-ch:
		return r, nil
	case <-d.gone:
		return recipeResult{}, fmt.Errorf("node driver exited\n%s", d.stderr.String())
	case <-time.After(time.Minute):
		return recipeResult{}, fmt.Errorf("node driver: no answer within a minute\n%s", d.stderr.String())
	}
}

// recipeNodeRunner runs a driver for recipeSuite's gateway, and its variant in it.
func recipeNodeRunner(t *testing.T, dir, variant string) func(g *recipeGateway) recipeRunner {
	return func(g *recipeGateway) recipeRunner {
		d := startRecipeNodeDriver(t, dir, g)
		return func(orderID, text, deadline string) (recipeResult, error) {
			return d.call(variant, orderID, text, deadline)
		}
	}
}

// TestRecipeNodeOpenAI runs the Node SDK recipe (recipe_openai.mjs).
func TestRecipeNodeOpenAI(t *testing.T) {
	recipeSuite(t, recipeNodeRunner(t, nodeRecipes(t), "openai"))
}

// TestRecipeLangChainJS runs the LangChain.js recipe (recipe_langchain.mjs):
// LangChain's retries off, the key in the call's options, and its own
// retry where llmgate says x-should-retry: true.
func TestRecipeLangChainJS(t *testing.T) {
	recipeSuite(t, recipeNodeRunner(t, nodeRecipes(t), "langchain"))
}

// TestRecipeNodeIdempotencyKeyOption: the Node SDK's `idempotencyKey`
// request option sends no Idempotency-Key (the OpenAI client names no
// idempotency header), so two calls with the same one are two upstream
// calls and two different answers. The recipe uses `headers` instead.
func TestRecipeNodeIdempotencyKeyOption(t *testing.T) {
	dir := nodeRecipes(t)
	g := startRecipeGateway(t)
	run := recipeNodeRunner(t, dir, "openai-idempotencykey")(g)
	var results []recipeResult
	for range 2 {
		r, err := run("option", "an order keyed by the SDK option", "")
		if err != nil {
			t.Fatal(err)
		}
		if !r.OK {
			t.Fatalf("call failed: %+v", r)
		}
		results = append(results, r)
	}
	if results[0].ID == results[1].ID || results[1].Replayed != "" {
		t.Fatalf("the second call was a replay: %+v", results[1])
	}
	wantTwoUnkeyedCalls(t, g, "the SDK")
}

// TestRecipeLangChainJSRetriesMultiply measures what the recipe's
// maxRetries: 0 avoids. LangChain's own retries (AsyncCaller, 6 by
// default) ignore x-should-retry: a failure llmgate already retried
// max_attempts times is sent again, and each re-send is another round of
// upstream attempts — with maxRetries: N one failing call makes
// (N+1) × max_attempts upstream calls. N is 1 here to keep the test short
// (LangChain waits 1–2 s before its first retry, doubling after); the
// default 6 makes 7 × 3 = 21 upstream calls and waits about 1–2 minutes.
// They also never retry a 409, which the recipe's summarize does.
func TestRecipeLangChainJSRetriesMultiply(t *testing.T) {
	dir := nodeRecipes(t)
	g := startRecipeGateway(t)
	g.fake.SetDefault(fakeprovider.Step{Status: http.StatusServiceUnavailable})

	d := startRecipeNodeDriver(t, dir, g)
	r, err := d.call("langchain-retries-1", "retries-on", "an order the upstream cannot take", "")
	if err != nil {
		t.Fatal(err)
	}
	if r.OK {
		t.Fatalf("got %+v, want an error", r)
	}
	on := g.upstreamCalls(recipeKey("retries-on"))
	r, err = d.call("langchain", "retries-off", "an order the upstream cannot take", "")
	if err != nil {
		t.Fatal(err)
	}
	if r.OK {
		t.Fatalf("got %+v, want an error", r)
	}
	off := g.upstreamCalls(recipeKey("retries-off"))
	t.Logf("one failing call: %d upstream calls with LangChain's maxRetries: 1, %d with the recipe (maxRetries: 0)", on, off)
	if on != 2*recipeMaxAttempts || off != recipeMaxAttempts {
		t.Fatalf("upstream calls: %d with maxRetries 1 (want %d), %d with the recipe (want %d)",
			on, 2*recipeMaxAttempts, off, recipeMaxAttempts)
	}
}

// wantTwoUnkeyedCalls checks that two chat calls reached the upstream and
// no Idempotency-Key was forwarded: who (the client) sent none.
func wantTwoUnkeyedCalls(t *testing.T, g *recipeGateway, who string) {
	t.Helper()
	if n := g.fake.Calls("/v1/chat/completions"); n != 2 {
		t.Fatalf("upstream calls = %d, want 2", n)
	}
	for _, r := range g.fake.Requests() {
		if k := r.Header.Get("Idempotency-Key"); k != "" {
			t.Fatalf("the gateway forwarded a key (%q): %s sent one", k, who)
		}
	}
}
