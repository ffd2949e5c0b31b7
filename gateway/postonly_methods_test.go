package gateway

import (
	"net/http"
	"testing"
)

// TestMessagesRoutesRefuseOtherMethods: every method but POST on
// Anthropic's POST-only routes is a 405 naming POST in Allow, in
// Anthropic's shape, and reaches no upstream. Before, HEAD, OPTIONS and
// TRACE on /v1/messages, and every method on /v1/messages/count_tokens,
// were 404s (the Messages route's 405 listed GET, PUT, PATCH and DELETE
// only; the rest fell through to the catch-all under /v1/messages/).
// (OpenAI's /v1/chat/completions keeps its 404: OpenAI serves GET on it,
// stored completions, which the gateway does not.)
func TestMessagesRoutesRefuseOtherMethods(t *testing.T) {
	h := newMessagesHarness(t, nil)
	for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodPatch,
			http.MethodDelete, http.MethodOptions, http.MethodTrace} {
			t.Run(m+" "+path, func(t *testing.T) {
				calls := len(h.fake.Requests()) + h.ant.Calls()
				r := h.do(m, path, "", anthropicHdr)
				if r.status != http.StatusMethodNotAllowed {
					t.Fatalf("status %d %s, want 405", r.status, r.body)
				}
				if got := r.header.Get("Allow"); got != http.MethodPost {
					t.Fatalf("Allow %q, want POST", got)
				}
				if m != http.MethodHead {
					wantAnthropicError(t, r, http.StatusMethodNotAllowed, "invalid_request_error")
				}
				if n := len(h.fake.Requests()) + h.ant.Calls(); n != calls {
					t.Fatalf("%d upstream calls", n-calls)
				}
			})
		}
	}
}
