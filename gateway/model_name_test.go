package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/config"
)

// TestModelNameLength: a model name longer than the gateway takes is a
// 400 in the route's error shape, on every route that reads one (a JSON
// body, a passthrough JSON body, a multipart form's model field, the id
// of GET /v1/models/{id}, Anthropic's /v1/messages), with no upstream
// call, no learned breaker, no metric label and no log line holding it:
// each of those keeps a model name for the life of the process (a
// hostile tenant's 8 MB names pinned 135 MB of heap in eight requests).
// A name of the longest length taken still goes through.
func TestModelNameLength(t *testing.T) {
	long := "gpt-" + strings.Repeat("x", maxModelTest-3) // one byte too many
	longest := "gpt-" + strings.Repeat("y", maxModelTest-4)
	rec := newRecorder(t, nil)
	h := passHarness(t, rec, nil)
	chat := func(model string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"Hi"}]}`
	}
	wantTooLong := func(what string, r result) {
		t.Helper()
		e := wantOpenAIError(t, r, http.StatusBadRequest)
		if e["param"] != "model" || e["code"] != "string_above_max_length" {
			t.Errorf("%s: error %v, want param model and code string_above_max_length", what, e)
		}
		if len(r.body) > 1024 {
			t.Errorf("%s: a %d-byte error body: it must not echo the name", what, len(r.body))
		}
	}
	key := map[string]string{"Idempotency-Key": "long-model-1"}
	wantTooLong("chat", h.chat(chat(long), nil))
	wantTooLong("keyed chat", h.chat(chat(long), key))
	wantTooLong("passthrough JSON", h.do(http.MethodPost, "/v1/moderations", `{"model":"`+long+`","input":"hi"}`, nil))
	mpType, mp := multipartBody(t, "aud10", [][2]string{{"model", long}}, []byte("RIFF....WAVE"))
	wantTooLong("multipart", h.sendRaw(http.MethodPost, "/v1/audio/transcriptions", mpType, mp, nil))
	wantTooLong("GET /v1/models/{id}", h.do(http.MethodGet, "/v1/models/"+long, "", nil))
	// A multipart field over 1 KiB was left out, so the name was ""
	// and the body went to the route's default upstream; a second model
	// part was routed by while the provider read both.
	mpType, mp = multipartBody(t, "aud11", [][2]string{{"model", strings.Repeat("w", 1500)}}, []byte("RIFF....WAVE"))
	wantStatus(t, "multipart, 1,500 bytes", h.sendRaw(http.MethodPost, "/v1/audio/transcriptions", mpType, mp, nil), http.StatusBadRequest)
	mpType, mp = multipartBody(t, "aud12", [][2]string{{"model", "whisper-1"}, {"model", "whisper-2"}}, []byte("RIFF....WAVE"))
	wantStatus(t, "multipart, two model fields", h.sendRaw(http.MethodPost, "/v1/audio/transcriptions", mpType, mp, nil), http.StatusBadRequest)
	if n := len(rec.seen()); n != 0 {
		t.Fatalf("%d upstream calls for names refused, want none", n)
	}
	if r := h.chat(chat(longest), nil); r.status != http.StatusOK {
		t.Fatalf("a %d-byte name: %d %s", len(longest), r.status, r.body)
	}
	if n := len(rec.seen()); n != 1 {
		t.Fatalf("%d upstream calls for the longest name taken, want 1", n)
	}

	mark := strings.Repeat("x", maxModelTest-3)
	if r := h.admin(http.MethodGet, "/admin/breakers"); strings.Contains(string(r.body), mark) {
		t.Error("/admin/breakers holds a name that was refused")
	}
	if r := h.do(http.MethodGet, "/metrics", "", map[string]string{"Authorization": "Bearer " + adminToken}); strings.Contains(string(r.body), mark) {
		t.Error("/metrics holds a name that was refused")
	}
	// (GET /v1/models/{id}'s path holds it, as the request line does.)
	if strings.Contains(h.logs.String(), `"model":"gpt-x`) {
		t.Error("the log holds a name that was refused")
	}

	m := newMessagesHarness(t, nil)
	r := m.messages("/v1/messages", `{"model":"claude-`+strings.Repeat("z", maxModelTest)+`","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}`, nil)
	msg := wantAnthropicError(t, r, http.StatusBadRequest, "invalid_request_error")
	if !strings.Contains(msg, "model") || len(r.body) > 1024 {
		t.Errorf("/v1/messages: %s", r.body)
	}
	if n := m.ant.Calls(); n != 0 {
		t.Errorf("%d Anthropic calls for a name too long, want none", n)
	}
}

// TestModelNameNotUTF8: a model name that is not UTF-8 — a multipart
// field or a path keeps the bytes sent, where JSON decoding makes them
// U+FFFD — is a 400 with no upstream call. It became a metric label, and
// the Prometheus client panics on a label that is not UTF-8: every such
// request's log panicked (its answer cut), and once the name's breaker
// opened, the panic inside the breaker's state change killed the process
// for every tenant ("sync: unlock of unlocked mutex").
func TestModelNameNotUTF8(t *testing.T) {
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		w.WriteHeader(http.StatusInternalServerError)
	})
	h := passHarness(t, rec, func(c *config.Config) {
		c.Retry.MaxAttempts = 1
		c.Breaker.ConsecutiveFailures = 2
	})
	for range 4 {
		mpType, mp := multipartBody(t, "aud13", [][2]string{{"model", "whisper-\xff"}}, []byte("RIFF....WAVE"))
		e := wantOpenAIError(t, h.sendRaw(http.MethodPost, "/v1/audio/transcriptions", mpType, mp, nil), http.StatusBadRequest)
		if e["param"] != "model" {
			t.Errorf("multipart: %v", e)
		}
		wantOpenAIError(t, h.do(http.MethodGet, "/v1/models/whisper-%FF", "", nil), http.StatusBadRequest)
	}
	if n := len(rec.seen()); n != 0 {
		t.Fatalf("%d upstream calls for names not UTF-8, want none", n)
	}
	if r := h.do(http.MethodGet, "/metrics", "", map[string]string{"Authorization": "Bearer " + adminToken}); r.status != http.StatusOK {
		t.Fatalf("/metrics after them: %d", r.status)
	}
}

// wantStatus checks r's status.
func wantStatus(t *testing.T, what string, r result, status int) {
	t.Helper()
	if r.status != status {
		t.Errorf("%s: %d %.300s, want %d", what, r.status, r.body, status)
	}
}

// maxModelTest is the longest model name the gateway takes, as the tests
// know it (not the product's constant, so a change to it shows here).
const maxModelTest = 256
