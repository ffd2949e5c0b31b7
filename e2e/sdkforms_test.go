package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/gateway/apierror"
)

// How each official SDK takes the ways a stream can end. This is why a
// keyed stream's ending is held back until its commit: a stream that stops
// cleanly after its finish_reason chunk, without [DONE], looks complete to
// every SDK, while llmgate's error event (data: {"error":{...}}) makes
// every SDK raise, and so does a connection cut inside the chunked body.
//
// Each form is served at /<form>/v1/chat/completions by a plain handler
// writing the bytes, so the test pins the SDKs' behaviour, not the
// gateway's.
var streamForms = []struct {
	form     string
	complete bool // what every SDK must make of it
}{
	{"done", true},                   // finish_reason, usage, [DONE]: the normal end
	{"finish-no-done", true},         // finish_reason, then a clean end without [DONE]
	{"error-event", false},           // content, then llmgate's error event, then a clean end
	{"cut-after-finish", false},      // finish_reason, then the connection closes mid-body
	{"error-after-finish", false},    // finish_reason, then the error event (a tail replaced)
	{"content-then-clean-end", true}, // no finish_reason at all, clean end: SDKs see no difference
}

// nodeOpenAIVersion is the official Node SDK the test installs: the last
// major that runs on Node 20 (openai 7 needs Node 22).
const nodeOpenAIVersion = "6.49.0"

func streamFormsServer(t *testing.T) string {
	t.Helper()
	chunk := func(delta, finish string) string {
		fr := "null"
		if finish != "" {
			fr = fmt.Sprintf("%q", finish)
		}
		return fmt.Sprintf(`data: {"id":"chatcmpl-forms","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n", delta, fr)
	}
	usage := `data: {"id":"chatcmpl-forms","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}` + "\n\n"
	errEvent := string(apierror.StreamEvent("The answer could not be stored, so this stream did not complete. Retry with the same Idempotency-Key.",
		"idempotency_store_unavailable"))
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		form, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		f := w.(http.Flusher)
		write := func(s string) {
			_, _ = w.Write([]byte(s))
			f.Flush()
		}
		write(chunk(`{"role":"assistant","content":""}`, ""))
		write(chunk(`{"content":"Hello, "}`, ""))
		write(chunk(`{"content":"world."}`, ""))
		switch form {
		case "done":
			write(chunk(`{}`, "stop"))
			write(usage)
			write("data: [DONE]\n\n")
		case "finish-no-done":
			write(chunk(`{}`, "stop"))
			write(usage)
		case "error-event":
			write(errEvent)
		case "cut-after-finish":
			write(chunk(`{}`, "stop"))
			// Headers and a chunked body are out: aborting leaves the body
			// without its last chunk, as a killed gateway does.
			panic(http.ErrAbortHandler)
		case "error-after-finish":
			write(chunk(`{}`, "stop"))
			write(errEvent)
		case "content-then-clean-end":
		default:
			panic(http.ErrAbortHandler)
		}
	}))
	t.Cleanup(s.Close)
	return s.URL
}

func TestStreamFormsGoSDKs(t *testing.T) {
	base := streamFormsServer(t)
	for _, c := range sdkClients {
		for _, f := range streamForms {
			t.Run(c.name+"/"+f.form, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				r := c.stream(ctx, base+"/"+f.form, "forms-"+f.form, nil)
				if r.Complete != f.complete {
					t.Fatalf("%s took %s as complete=%v (err %v), want %v", c.name, f.form, r.Complete, r.Err, f.complete)
				}
				if r.Text != "Hello, world." {
					t.Fatalf("text %q", r.Text)
				}
				t.Logf("%s %s: complete=%v err=%v", c.name, f.form, r.Complete, r.Err)
			})
		}
	}
}

// TestStreamFormsNodeSDK runs the same forms through the official Node SDK
// (npm package openai, pinned), installed into a temp dir from the npm
// registry. Without node or npm, or when the install fails, it skips —
// unless LLMGATE_REQUIRE_NODE=1, when it fails.
func TestStreamFormsNodeSDK(t *testing.T) {
	require := os.Getenv("LLMGATE_REQUIRE_NODE") == "1"
	skip := func(format string, args ...any) {
		t.Helper()
		if require {
			t.Fatalf(format+" (LLMGATE_REQUIRE_NODE=1)", args...)
		}
		t.Skipf(format+"; set LLMGATE_REQUIRE_NODE=1 to make this a failure", args...)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		skip("node not installed: %v", err)
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		skip("npm not installed: %v", err)
	}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "package.json"), `{"private": true, "type": "module"}`+"\n")
	writeFile(t, filepath.Join(dir, "forms.mjs"), nodeFormsScript)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	install := exec.CommandContext(ctx, npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "openai@"+nodeOpenAIVersion)
	install.Dir = dir
	if out, err := install.CombinedOutput(); err != nil {
		skip("npm install openai@%s: %v\n%s", nodeOpenAIVersion, err, out)
	}

	base := streamFormsServer(t)
	forms := make([]string, len(streamForms))
	for i, f := range streamForms {
		forms[i] = f.form
	}
	arg, _ := json.Marshal(forms)
	run := exec.CommandContext(ctx, node, "forms.mjs", base, string(arg))
	run.Dir = dir
	out, err := run.Output()
	if err != nil {
		t.Fatalf("node forms.mjs: %v\n%s", err, out)
	}
	var got map[string]struct {
		Complete bool   `json:"complete"`
		Text     string `json:"text"`
		Error    string `json:"error"`
		Version  string `json:"version"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node output: %v\n%s", err, out)
	}
	for _, f := range streamForms {
		r := got[f.form]
		t.Logf("node openai@%s %s: complete=%v error=%q", nodeOpenAIVersion, f.form, r.Complete, r.Error)
		if r.Complete != f.complete || r.Text != "Hello, world." {
			t.Errorf("the Node SDK took %s as complete=%v text=%q (error %q), want complete=%v", f.form, r.Complete, r.Text, r.Error, f.complete)
		}
	}
}

// nodeFormsScript streams each form named in argv[3] (JSON) from the
// server at argv[2] and prints {form: {complete, text, error}}.
const nodeFormsScript = `import OpenAI from 'openai';

const [base, formsJSON] = process.argv.slice(2);
const out = {};
for (const form of JSON.parse(formsJSON)) {
  const client = new OpenAI({ baseURL: base + '/' + form + '/v1', apiKey: 'e2e-client-key', maxRetries: 0 });
  let text = '';
  try {
    const stream = await client.chat.completions.create(
      { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'forms' }], stream: true },
      { headers: { 'Idempotency-Key': 'forms-' + form } },
    );
    for await (const chunk of stream) {
      for (const c of chunk.choices ?? []) text += c.delta?.content ?? '';
    }
    out[form] = { complete: true, text };
  } catch (e) {
    out[form] = { complete: false, text, error: String(e?.message ?? e) };
  }
}
console.log(JSON.stringify(out));
`
