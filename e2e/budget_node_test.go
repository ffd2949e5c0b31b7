package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// The official Node SDK (npm "openai", pinned in e2e/recipes/node), left
// at its default retries (2), makes exactly one HTTP call against a spent
// budget: the gateway's 429 says x-should-retry: false. (openai-go and
// anthropic-sdk-go: gateway TestBudgetSDKsDoNotRetry.)
func TestBudgetNodeSDKDoesNotRetry(t *testing.T) {
	dir := nodeRecipes(t)
	fake := fakeprovider.New(fakeprovider.Options{})
	s := httptest.NewServer(fake)
	t.Cleanup(s.Close)
	t.Cleanup(fake.Close)
	extra := `clients:
  - name: spent
    key: sk-gw-spent
    budgets:
      - {window: day, tokens: 1000}
`
	p := start(t, gatewayBin(t, ""), []string{"-config", writeConfig(t, t.TempDir(), s.URL, extra)}, nil)
	// The first call spends the budget: the provider reports 1000 tokens.
	fake.Enqueue(fakeprovider.Step{Body: `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":900,"completion_tokens":100,"total_tokens":1000}}`})
	first := postJSON(t, p.URL+"/v1/chat/completions", "sk-gw-spent", `{"model":"gpt-4o-mini","max_tokens":10,"messages":[{"role":"user","content":"Hi"}]}`)
	if first != 200 {
		t.Fatalf("first call: %d", first)
	}
	script := `import OpenAI from "openai";
let calls = 0;
const counting = async (url, init) => { calls++; return fetch(url, init); };
const client = new OpenAI({ baseURL: process.env.LLMGATE_BASE_URL, apiKey: "sk-gw-spent", fetch: counting });
let status = 0, code = "";
try {
  await client.chat.completions.create({ model: "gpt-4o-mini", max_tokens: 10, messages: [{ role: "user", content: "Hi" }] });
} catch (e) { status = e.status; code = e.code; }
console.log(JSON.stringify({ calls, status, code, maxRetries: client.maxRetries }));
`
	writeFile(t, filepath.Join(dir, "budget.mjs"), script)
	cmd := exec.Command("node", filepath.Join(dir, "budget.mjs"))
	cmd.Env = append(cmd.Environ(), "LLMGATE_BASE_URL="+p.URL+"/v1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	var got struct {
		Calls, Status, MaxRetries int
		Code                      string
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node printed %q: %v", out, err)
	}
	if got.Calls != 1 || got.MaxRetries != 2 {
		t.Fatalf("the SDK made %d HTTP calls (maxRetries %d), want 1 at its default 2: %+v", got.Calls, got.MaxRetries, got)
	}
	if got.Status != 429 || got.Code != "budget_exceeded" {
		t.Fatalf("status %d %q, want 429 budget_exceeded", got.Status, got.Code)
	}
	if n := len(fake.Requests()); n != 1 {
		t.Fatalf("the upstream saw %d requests, want 1 (the first call's)", n)
	}
}

// postJSON posts body with the client key and returns the status.
func postJSON(t *testing.T, url, key, body string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	io.Copy(io.Discard, res.Body)
	return res.StatusCode
}
