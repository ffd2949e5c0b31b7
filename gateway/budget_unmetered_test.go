package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/llmgate/llmgate/config"
)

// spendRecorder is a fake provider that answers every call with a small JSON
// object and records the method and path of each.
type spendRecorder struct {
	mu    sync.Mutex
	calls []string
}

func (f *spendRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.calls = append(f.calls, r.Method+" "+r.URL.Path)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if strings.HasPrefix(r.URL.Path, "/v1/messages/batches") {
		fmt.Fprint(w, `{"id":"msgbatch_1","type":"message_batch","processing_status":"in_progress","results_url":null}`)
		return
	}
	fmt.Fprint(w, `{"id":"batch_1","object":"batch","status":"validating"}`)
}

func (f *spendRecorder) made() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// unmeteredHarness is alice with a day budget (and her own provider
// keys) and bob without, on a spendRecorder; mutate adjusts the config after.
func unmeteredHarness(t *testing.T, mutate func(c *config.Config)) (*harness, *spendRecorder) {
	t.Helper()
	up := &spendRecorder{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	h := newHarness(t, func(c *config.Config) {
		budgeted(srv.URL, config.Budget{Window: config.WindowDay, Tokens: 1_000_000})(c)
		// Her own provider keys, so that she may list her batches.
		c.Clients[0].UpstreamAPIKeys = map[string]string{"primary": "sk-alice-own-0123456789", "claude": "sk-ant-alice-own-0123456789"}
		if mutate != nil {
			mutate(c)
		}
	})
	return h, up
}

var bob = map[string]string{"Authorization": "Bearer key-bob"}

const (
	imageBody = `{"model":"gpt-image-1","prompt":"a lighthouse"}`
	batchJSON = `{"input_file_id":"file-1","endpoint":"/v1/chat/completions","completion_window":"24h"}`
)

// A budgeted client's passthrough POSTs that spend without usage the
// gateway can charge — images, audio, batches — are refused with 403
// budget_unmetered_endpoint before any upstream call, keyed or not (the
// key is not left behind: its retry gets the same refusal). The message
// names the endpoint and the settings that allow it; x-should-retry is
// false and X-Llmgate-Outcome quota. Reads of the same family pass, and
// a client without a budget is not refused.
func TestBudgetUnmeteredPassthroughRefused(t *testing.T) {
	h, up := unmeteredHarness(t, nil)
	for _, c := range []struct{ path, body string }{
		{"/v1/images/generations", imageBody},
		{"/v1/audio/speech", `{"model":"gpt-4o-mini-tts","input":"Hello","voice":"alloy"}`},
		{"/v1/batches", batchJSON},
	} {
		for _, hdr := range []map[string]string{alice, with(alice, "Idempotency-Key", "job-1"+c.path), with(alice, "Idempotency-Key", "job-1"+c.path)} {
			r := h.do(http.MethodPost, c.path, c.body, hdr)
			e := wantOpenAIError(t, r, http.StatusForbidden)
			msg, _ := e["message"].(string)
			if e["code"] != "budget_unmetered_endpoint" || !strings.Contains(msg, "POST "+c.path) ||
				!strings.Contains(msg, "budgets.allow_unmetered: true") || !strings.Contains(msg, "clients[].allow_unmetered: true") {
				t.Fatalf("POST %s: error %v, want budget_unmetered_endpoint naming the endpoint and the settings", c.path, e)
			}
			if r.header.Get("X-Should-Retry") != "false" || r.header.Get("X-Llmgate-Outcome") != "quota" {
				t.Fatalf("POST %s: headers %v, want x-should-retry false, X-Llmgate-Outcome quota", c.path, r.header)
			}
		}
	}
	if got := up.made(); len(got) != 0 {
		t.Fatalf("upstream calls = %v, want none", got)
	}
	if r := h.do(http.MethodGet, "/v1/batches", "", alice); r.status != 200 {
		t.Fatalf("GET /v1/batches: %d %s", r.status, r.body)
	}
	if r := h.do(http.MethodPost, "/v1/images/generations", imageBody, bob); r.status != 200 {
		t.Fatalf("bob's POST /v1/images/generations: %d %s", r.status, r.body)
	}
	if got := up.made(); fmt.Sprint(got) != "[GET /v1/batches POST /v1/images/generations]" {
		t.Fatalf("upstream calls = %v, want alice's GET and bob's POST", got)
	}
	m := h.admin(http.MethodGet, "/metrics")
	if !strings.Contains(string(m.body), `llmgate_budget_refused_total{budget="unmetered",client="alice"} 9`) {
		t.Fatalf("metrics lack the nine refusals:\n%s", grepLines(string(m.body), "llmgate_budget_refused"))
	}
}

// On /v1/messages/batches the refusal is in Anthropic's shape (403
// permission_error, the SDKs' PermissionDeniedError); listing batches
// passes.
func TestBudgetUnmeteredMessageBatchesAnthropicShape(t *testing.T) {
	h, up := unmeteredHarness(t, nil)
	hdr := with(alice, "anthropic-version", "2023-06-01")
	r := h.do(http.MethodPost, "/v1/messages/batches", batchBody, hdr)
	var e struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	if r.status != 403 || json.Unmarshal(r.body, &e) != nil || e.Type != "error" || e.Error.Type != "permission_error" ||
		!strings.Contains(e.Error.Message, "POST /v1/messages/batches") || !strings.Contains(e.Error.Message, "allow_unmetered") {
		t.Fatalf("refusal = %d %s, want 403 in Anthropic's shape naming the endpoint", r.status, r.body)
	}
	if r.header.Get("X-Should-Retry") != "false" || r.header.Get("X-Llmgate-Outcome") != "quota" {
		t.Fatalf("headers = %v", r.header)
	}
	if got := up.made(); len(got) != 0 {
		t.Fatalf("upstream calls = %v, want none", got)
	}
	if r := h.do(http.MethodGet, "/v1/messages/batches", "", hdr); r.status != 200 {
		t.Fatalf("GET /v1/messages/batches: %d %s", r.status, r.body)
	}
	if got := up.made(); fmt.Sprint(got) != "[GET /v1/messages/batches]" {
		t.Fatalf("upstream calls = %v", got)
	}
}

// budgets.allow_unmetered lets every budgeted client's unmetered calls
// run; a client's own allow_unmetered wins over it either way.
func TestBudgetUnmeteredAllowed(t *testing.T) {
	yes, no := true, false
	for _, c := range []struct {
		name   string
		global bool
		own    *bool
		status int
	}{
		{"global", true, nil, 200},
		{"per client", false, &yes, 200},
		{"client refuses over global", true, &no, 403},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, up := unmeteredHarness(t, func(cfg *config.Config) {
				cfg.Budgets.AllowUnmetered = c.global
				cfg.Clients[0].AllowUnmetered = c.own
			})
			r := h.do(http.MethodPost, "/v1/images/generations", imageBody, alice)
			if r.status != c.status {
				t.Fatalf("POST /v1/images/generations: %d %s, want %d", r.status, r.body, c.status)
			}
			if want := map[int]int{200: 1, 403: 0}[c.status]; len(up.made()) != want {
				t.Fatalf("upstream calls = %v, want %d", up.made(), want)
			}
		})
	}
}

// A budgeted client's background response (POST /v1/responses with
// background: true) is refused as unmetered, keyed or not: its answer is
// queued, with no usage, and what it spends is known only later, so the
// budget would charge its estimate alone (the hostile-tenant run charged
// ten background calls 134 tokens each while the provider reported
// 500,000). A client allowed unmetered calls, a budget for other models,
// and a response that is not background, pass.
func TestBudgetBackgroundResponseRefused(t *testing.T) {
	const bg = `{"model":"gpt-4o-mini","input":"hi","background":true,"max_output_tokens":10}`
	h, up := unmeteredHarness(t, nil)
	for _, hdr := range []map[string]string{alice, with(alice, "Idempotency-Key", "bg-1"), with(alice, "Idempotency-Key", "bg-1")} {
		r := h.do(http.MethodPost, "/v1/responses", bg, hdr)
		e := wantOpenAIError(t, r, http.StatusForbidden)
		if msg, _ := e["message"].(string); e["code"] != "budget_unmetered_endpoint" || !strings.Contains(msg, "background: true") {
			t.Fatalf("background response: %v, want budget_unmetered_endpoint naming background", e)
		}
	}
	if got := up.made(); len(got) != 0 {
		t.Fatalf("upstream calls = %v, want none", got)
	}
	if n := strings.Count(h.logs.String(), `"class":"budget_unmetered_endpoint"`); n != 3 {
		t.Fatalf("%d request lines of class budget_unmetered_endpoint, want 3:\n%s", n, h.logs.String())
	}
	if r := h.do(http.MethodPost, "/v1/responses", strings.Replace(bg, "true", "false", 1), alice); r.status == http.StatusForbidden {
		t.Fatalf("a response not in the background: %d %s", r.status, r.body)
	}
	if r := h.do(http.MethodPost, "/v1/responses", bg, bob); r.status == http.StatusForbidden {
		t.Fatalf("bob, without a budget: %d %s", r.status, r.body)
	}
	for name, mutate := range map[string]func(c *config.Config){
		"allowed":              func(c *config.Config) { c.Budgets.AllowUnmetered = true },
		"other models' budget": func(c *config.Config) { c.Clients[0].Budgets[0].Model = "claude-*" },
	} {
		h, _ := unmeteredHarness(t, mutate)
		if r := h.do(http.MethodPost, "/v1/responses", bg, alice); r.status == http.StatusForbidden {
			t.Fatalf("%s: %d %s", name, r.status, r.body)
		}
	}
}

// A field a budget reservation (or on /v1/responses, an ownership
// check) reads, written as another type than the API's, is a 400 before
// any upstream call: the gateway would not count
// it, and a lenient upstream (pydantic's lax mode: "200" is 200, "true"
// is true) would run it, past the budget. Numbers and null pass as
// before; background is read, and checked, on /v1/responses only, and a
// passthrough body (an image's "background": "transparent") is not
// checked at all.
func TestReadFieldsOfAnotherTypeRefused(t *testing.T) {
	h, up := unmeteredHarness(t, nil)
	for _, c := range []struct{ path, body, param string }{
		{"/v1/chat/completions", `{"model":"gpt-4o-mini","n":"200","messages":[{"role":"user","content":"hi"}]}`, "n"},
		{"/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":"120000","messages":[]}`, "max_tokens"},
		{"/v1/chat/completions", `{"model":"gpt-4o-mini","MAX_COMPLETION_TOKENS":[5],"messages":[]}`, "max_completion_tokens"},
		{"/v1/completions", `{"model":"gpt-4o-mini","prompt":"x","best_of":true}`, "best_of"},
		{"/v1/responses", `{"model":"gpt-4o-mini","input":"hi","max_output_tokens":{"n":1}}`, "max_output_tokens"},
		{"/v1/responses", `{"model":"gpt-4o-mini","input":"hi","background":"true"}`, "background"},
		{"/v1/responses", `{"model":"gpt-4o-mini","input":"hi","background":1}`, "background"},
		// A count spelled otherwise than the API spells it: a Go upstream
		// reads "MAX_TOKENS" as max_tokens, an exact-case one (Python's)
		// not at all, so no reservation can be right for both.
		{"/v1/chat/completions", `{"model":"gpt-4o-mini","MAX_TOKENS":1,"messages":[]}`, "max_tokens"},
		{"/v1/chat/completions", `{"model":"gpt-4o-mini","N":200,"messages":[]}`, "n"},
		{"/v1/responses", `{"model":"gpt-4o-mini","input":"hi","max_output_tO\u212aens":5}`, "max_output_tokens"},
		// The ids an ownership check reads, likewise.
		{"/v1/responses", `{"model":"gpt-4o-mini","input":"hi","previous_response_id":["resp_A"]}`, "previous_response_id"},
		{"/v1/responses", `{"model":"gpt-4o-mini","input":"hi","conversation":["conv_A"]}`, "conversation"},
	} {
		for _, hdr := range []map[string]string{alice, bob} {
			r := h.do(http.MethodPost, c.path, c.body, hdr)
			if e := wantOpenAIError(t, r, http.StatusBadRequest); e["param"] != c.param {
				t.Fatalf("%s %s: %v, want a 400 naming %s", c.path, c.body, e, c.param)
			}
		}
	}
	r := h.do(http.MethodPost, "/v1/messages", `{"model":"claude-x","max_tokens":"64000","messages":[]}`, alice)
	if msg := wantAnthropicError(t, r, http.StatusBadRequest, "invalid_request_error"); !strings.Contains(msg, "max_tokens") {
		t.Fatalf("messages: %s, want max_tokens named", msg)
	}
	if got := up.made(); len(got) != 0 {
		t.Fatalf("upstream calls = %v, want none", got)
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"gpt-4o-mini","n":null,"max_tokens":10,"background":"yes","messages":[]}`},
		{"/v1/chat/completions", `{"model":"gpt-4o-mini","max_\u0074okens":10,"messages":[]}`},
		{"/v1/responses", `{"model":"gpt-4o-mini","input":"hi","background":false,"max_output_tokens":null}`},
		{"/v1/responses", `{"model":"gpt-4o-mini","input":"hi","background":null,"previous_response_id":null,"conversation":null}`},
		{"/v1/embeddings", `{"model":"gpt-4o-mini","input":"hi","n":"2"}`},
		{"/v1/messages/count_tokens", `{"model":"claude-x","max_tokens":"64000","messages":[]}`},
	} {
		if r := h.do(http.MethodPost, c.path, c.body, bob); r.status != 200 {
			t.Fatalf("%s %s: %d %s, want it through", c.path, c.body, r.status, r.body)
		}
	}
	if r := h.do(http.MethodPost, "/v1/images/generations", `{"model":"gpt-image-1","prompt":"a cat","background":"transparent","n":1}`, bob); r.status != 200 {
		t.Fatalf("image with a background: %d %s", r.status, r.body)
	}
}
