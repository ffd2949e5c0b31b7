package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// Keys derived from a session header (clients[].derive_idempotency_key),
// for agents such as Claude Code that send no Idempotency-Key.

const (
	sessionHeader = "X-Claude-Code-Session-Id"
	otherKey      = "sk-gw-other-secret-123456"
)

// deriveFor turns key derivation from the session header on for the
// clients named (both clients exist either way).
func deriveFor(names ...string) func(c *config.Config) {
	return func(c *config.Config) {
		c.Clients = []config.Client{{Name: "team", Key: gwClientKey}, {Name: "other", Key: otherKey}}
		for i := range c.Clients {
			for _, n := range names {
				if c.Clients[i].Name == n {
					c.Clients[i].DeriveIdempotencyKey.FromHeader = "x-claude-code-session-id"
				}
			}
		}
	}
}

// agentStep is one try of an agent's step: its session header and the
// retry count its SDK adds (Claude Code's x-stainless-retry-count grows
// on its own retries).
func agentStep(session string, try int) map[string]string {
	return map[string]string{sessionHeader: session, "X-Stainless-Retry-Count": string(rune('0' + try)),
		"Anthropic-Beta": "claude-code-20250219,interleaved-thinking-2025-05-14"}
}

// TestDerivedKeyOffByDefault: without the client's opt-in, a session
// header keys nothing: the same step sent twice is two upstream calls.
func TestDerivedKeyOffByDefault(t *testing.T) {
	h := newMessagesHarness(t, deriveFor())
	for try := range 2 {
		r := h.messages("/v1/messages?beta=true", messagesStreamBody, agentStep("sess-1", try))
		if r.status != 200 || r.header.Get("Idempotent-Replayed") != "" || r.header.Get("X-Llmgate-Idempotency-Key") != "" {
			t.Fatalf("try %d: %d replayed=%q derived=%q", try, r.status, r.header.Get("Idempotent-Replayed"), r.header.Get("X-Llmgate-Idempotency-Key"))
		}
	}
	if n := h.ant.Calls(); n != 2 {
		t.Errorf("upstream calls = %d, want 2 (derivation is off by default)", n)
	}
}

// TestDerivedKeyRetryReplays: with derivation on, an agent's retried
// step (same session, same body, a higher retry count) gets the committed
// answer byte for byte with Idempotent-Replayed: true, JSON and stream,
// and the upstream is called once. Both answers say the key was derived,
// and so does the log line.
func TestDerivedKeyRetryReplays(t *testing.T) {
	for _, tc := range []struct{ name, body string }{{"json", messagesBody}, {"stream", messagesStreamBody}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newMessagesHarness(t, deriveFor("team"))
			first := h.messages("/v1/messages?beta=true", tc.body, agentStep("sess-"+tc.name, 0))
			if first.status != 200 || first.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("first: %d replayed=%q %s", first.status, first.header.Get("Idempotent-Replayed"), first.body)
			}
			second := h.messages("/v1/messages?beta=true", tc.body, agentStep("sess-"+tc.name, 1))
			if second.status != 200 || second.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry: %d replayed=%q %s", second.status, second.header.Get("Idempotent-Replayed"), second.body)
			}
			if !bytes.Equal(first.body, second.body) {
				t.Errorf("replay differs:\n first %s\nsecond %s", first.body, second.body)
			}
			for name, r := range map[string]result{"first": first, "retry": second} {
				if got := r.header.Get("X-Llmgate-Idempotency-Key"); got != "derived" {
					t.Errorf("%s: X-Llmgate-Idempotency-Key = %q, want derived", name, got)
				}
			}
			if n := h.ant.Calls(); n != 1 {
				t.Errorf("upstream calls = %d, want 1", n)
			}
			if fwd := h.ant.Requests()[0].Header.Get("Idempotency-Key"); !strings.HasPrefix(fwd, "llmgate-") {
				t.Errorf("upstream Idempotency-Key = %q, want the gateway's forwarded key", fwd)
			}
			if n := strings.Count(h.logs.String(), `"idempotency_key_source":"derived"`); n != 2 {
				t.Errorf("%d log lines say the key was derived, want 2:\n%s", n, h.logs.String())
			}
		})
	}
}

// TestDerivedKeyNewRequestInSession: another body in the same session —
// the agent's next step — is another key: a second call, never a 422;
// and so is the same body with another anthropic-beta list. A request
// without the session header is not keyed.
func TestDerivedKeyNewRequestInSession(t *testing.T) {
	h := newMessagesHarness(t, deriveFor("team"))
	next := strings.Replace(messagesBody, "Hello", "And now?", 1)
	otherBeta := agentStep("sess-1", 0)
	otherBeta["Anthropic-Beta"] = "claude-code-20250219"
	for i, send := range []struct {
		body string
		hdr  map[string]string
	}{
		{messagesBody, agentStep("sess-1", 0)},
		{next, agentStep("sess-1", 0)},
		{messagesBody, otherBeta},
		{messagesBody, map[string]string{}},
		{messagesBody, map[string]string{}},
	} {
		r := h.messages("/v1/messages", send.body, send.hdr)
		if r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("request %d: %d replayed=%q %s", i, r.status, r.header.Get("Idempotent-Replayed"), r.body)
		}
		_, hasSession := send.hdr[sessionHeader]
		if derived := r.header.Get("X-Llmgate-Idempotency-Key") == "derived"; derived != hasSession {
			t.Errorf("request %d: derived=%v, want %v", i, derived, hasSession)
		}
	}
	if n := h.ant.Calls(); n != 5 {
		t.Errorf("upstream calls = %d, want 5", n)
	}
}

// TestDerivedKeyPerClient: another client sending the same session
// header value and body does not get the first client's answer; each
// client's key is its own.
func TestDerivedKeyPerClient(t *testing.T) {
	h := newMessagesHarness(t, deriveFor("team", "other"))
	if r := h.messages("/v1/messages", messagesBody, agentStep("shared-sess", 0)); r.status != 200 {
		t.Fatalf("team: %d %s", r.status, r.body)
	}
	hdr := agentStep("shared-sess", 1)
	hdr["Authorization"] = "Bearer " + otherKey
	r := h.messages("/v1/messages", messagesBody, hdr)
	if r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("other: %d replayed=%q %s", r.status, r.header.Get("Idempotent-Replayed"), r.body)
	}
	if n := h.ant.Calls(); n != 2 {
		t.Errorf("upstream calls = %d, want 2 (clients share no keys)", n)
	}
	// And each client's own retry replays its own.
	if r := h.messages("/v1/messages", messagesBody, hdr); r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("other's retry: replayed=%q", r.header.Get("Idempotent-Replayed"))
	}
	if n := h.ant.Calls(); n != 2 {
		t.Errorf("upstream calls = %d, want 2", n)
	}
}

// TestDerivedKeyConcurrentDuplicates: the step's retry arriving while
// its first try is still running joins that call: one upstream call, the
// same answer.
func TestDerivedKeyConcurrentDuplicates(t *testing.T) {
	h := newMessagesHarness(t, deriveFor("team"))
	arrived, release := make(chan struct{}), make(chan struct{})
	h.ant.Enqueue(fakeprovider.AnthropicStep{Arrived: arrived, Release: release})
	send := func(try int) <-chan asyncResult {
		hdr := agentStep("sess-dup", try)
		hdr["Authorization"], hdr["Anthropic-Version"] = "Bearer "+gwClientKey, "2023-06-01"
		ch := make(chan asyncResult, 1)
		go func() {
			r, err := h.try(http.MethodPost, "/v1/messages", messagesStreamBody, hdr)
			ch <- asyncResult{r, err}
		}()
		return ch
	}
	first := send(0)
	<-arrived
	dups := []<-chan asyncResult{send(1), send(2)}
	close(release)
	want := h.await(first)
	if want.status != 200 {
		t.Fatalf("first: %d %s", want.status, want.body)
	}
	for i, d := range dups {
		r := h.await(d)
		if r.status != 200 || !bytes.Equal(r.body, want.body) {
			t.Errorf("duplicate %d: %d %s", i, r.status, r.body)
		}
	}
	if n := h.ant.Calls(); n != 1 {
		t.Errorf("upstream calls = %d, want 1", n)
	}
}

// TestDerivedKeyClientKeyWins: a request that sends its own
// Idempotency-Key is keyed by it, not by the session: another body under
// it is the usual 422.
func TestDerivedKeyClientKeyWins(t *testing.T) {
	h := newMessagesHarness(t, deriveFor("team"))
	hdr := agentStep("sess-1", 0)
	hdr["Idempotency-Key"] = "op-1"
	r := h.messages("/v1/messages", messagesBody, hdr)
	if r.status != 200 || r.header.Get("X-Llmgate-Idempotency-Key") != "" {
		t.Fatalf("first: %d derived=%q %s", r.status, r.header.Get("X-Llmgate-Idempotency-Key"), r.body)
	}
	r = h.messages("/v1/messages", strings.Replace(messagesBody, "Hello", "Bye", 1), hdr)
	wantAnthropicError(t, r, http.StatusUnprocessableEntity, "invalid_request_error")
}

// TestDerivedKeyChat: the derivation is the client's, not the route's:
// chat completions sent with the session header are keyed by it too.
func TestDerivedKeyChat(t *testing.T) {
	h := newMessagesHarness(t, deriveFor("team"))
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello"}]}`
	hdr := map[string]string{"Authorization": "Bearer " + gwClientKey, sessionHeader: "sess-chat"}
	first := h.do(http.MethodPost, "/v1/chat/completions", body, hdr)
	second := h.do(http.MethodPost, "/v1/chat/completions", body, hdr)
	if first.status != 200 || second.status != 200 || second.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d, second %d replayed=%q %s", first.status, second.status, second.header.Get("Idempotent-Replayed"), second.body)
	}
	if !bytes.Equal(first.body, second.body) || !json.Valid(second.body) {
		t.Errorf("replay differs:\n first %s\nsecond %s", first.body, second.body)
	}
	if n := h.fake.Calls(""); n != 1 {
		t.Errorf("upstream calls = %d, want 1", n)
	}
}
