package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/config"
)

// TestDuplicateModelRefused: a body whose model the upstream would read
// differently from the gateway ("mod\u0065l" is model to any JSON decoder,
// and most keep the last) is a 400 naming the field, and never forwarded.
// An escaped key alone is read as the upstream reads it.
func TestDuplicateModelRefused(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Upstreams[0].Models = []string{"gpt-4o-mini"} })
	r := h.chat(`{"model":"gpt-4o-mini","mod\u0065l":"o1-pro","messages":[{"role":"user","content":"Hello"}]}`, nil)
	e := wantOpenAIError(t, r, http.StatusBadRequest)
	if e["param"] != "model" || e["code"] != "duplicate_field" || e["type"] != "invalid_request_error" {
		t.Errorf("error = %v", e)
	}
	if m, _ := e["message"].(string); !strings.Contains(m, "model appears more than once") {
		t.Errorf("message = %q", m)
	}
	if n := h.fake.Calls(""); n != 0 {
		t.Fatalf("the upstream saw %d calls", n)
	}

	r = h.chat(`{"mod\u0065l":"o1-pro","messages":[{"role":"user","content":"Hello"}]}`, nil)
	if e := wantOpenAIError(t, r, http.StatusNotFound); e["code"] != "model_not_found" {
		t.Errorf("escaped model o1-pro: %v", e)
	}
	r = h.chat(`{"mod\u0065l":"gpt-4o-mini","messages":[{"role":"user","content":"Hello"}]}`, nil)
	if r.status != http.StatusOK {
		t.Fatalf("escaped model gpt-4o-mini: %d %s", r.status, r.body)
	}
	if reqs := h.fake.Requests(); len(reqs) != 1 || !strings.Contains(string(reqs[0].Body), `"mod\u0065l":"gpt-4o-mini"`) {
		t.Errorf("upstream requests: %d, want the body as sent", len(reqs))
	}
}

// TestFoldedModelKeyRefusedTwice: "MODEL" is model to a Go upstream
// (encoding/json matches keys case-insensitively), so a body with both is
// one the gateway would route and meter as one model while the upstream
// served the other: a 400 naming the field, never forwarded. "MODEL" alone
// is routed as model.
func TestFoldedModelKeyRefusedTwice(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Upstreams[0].Models = []string{"gpt-4o-mini"} })
	for _, body := range []string{
		`{"model":"gpt-4o-mini","MODEL":"gpt-4o","messages":[{"role":"user","content":"Hello"}]}`,
		`{"Model":"gpt-4o-mini","mod\u0065L":"gpt-4o","messages":[{"role":"user","content":"Hello"}]}`,
	} {
		e := wantOpenAIError(t, h.chat(body, nil), http.StatusBadRequest)
		if e["param"] != "model" || e["code"] != "duplicate_field" || e["type"] != "invalid_request_error" {
			t.Errorf("%s: error = %v", body, e)
		}
	}
	if n := h.fake.Calls(""); n != 0 {
		t.Fatalf("the upstream saw %d calls", n)
	}

	r := h.chat(`{"MODEL":"o1-pro","messages":[{"role":"user","content":"Hello"}]}`, nil)
	if e := wantOpenAIError(t, r, http.StatusNotFound); e["code"] != "model_not_found" {
		t.Errorf("MODEL o1-pro: %v", e)
	}
	body := `{"MODEL":"gpt-4o-mini","messages":[{"role":"user","content":"Hello"}]}`
	if r := h.chat(body, nil); r.status != http.StatusOK {
		t.Fatalf("MODEL gpt-4o-mini: %d %s", r.status, r.body)
	}
	if reqs := h.fake.Requests(); len(reqs) != 1 || string(reqs[0].Body) != body {
		t.Errorf("upstream requests: %d, want the body as sent", len(reqs))
	}
}
