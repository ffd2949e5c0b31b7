// Package headers says which HTTP headers cross the gateway: the client
// headers forwarded to an upstream, and the upstream response headers that
// reach the client — relayed live, and kept in a committed record so that
// a replay carries the same ones. Both are allow-lists: a header nobody
// chose to pass does not pass. It knows nothing else.
package headers

import (
	"net/http"
	"net/textproto"
	"strings"
)

// Request headers a client may send to the upstream. Everything else is
// dropped — Authorization and X-Api-Key above all (they carry the client's
// gateway key; the upstream gets its own key from config), Idempotency-Key
// (llmgate forwards a derived one), and the provider-account headers
// unless the upstream allows them. X-Claude-Code-Session-Id passes as
// Claude Code sends it to Anthropic directly: it names the agent's
// session, no credential or tenant.
var forwardedRequest = []string{"Content-Type", "Accept", "User-Agent", "Openai-Beta", "X-Claude-Code-Session-Id"}

// AnthropicHeaders pass to an upstream of Anthropic's API only, as the
// client sent them, any value: they choose the answer's shape, and a
// version the gateway has never seen is the client's to send. An OpenAI
// upstream gets neither: they mean nothing to it, and would tell its
// provider what else the client runs.
var AnthropicHeaders = []string{"Anthropic-Version", "Anthropic-Beta"}

// forwardedRequestPrefixes: the official SDKs' telemetry headers.
var forwardedRequestPrefixes = []string{"X-Stainless-"}

// AccountHeaders name the provider account a request is billed to; they
// are forwarded only for an upstream with forward_account_headers set.
var AccountHeaders = []string{"Openai-Organization", "Openai-Project"}

// Allow says which header groups beyond the common ones reach an
// upstream. The zero value lets neither pass.
type Allow struct {
	// Account: AccountHeaders (the upstream's forward_account_headers).
	Account bool
	// Anthropic: AnthropicHeaders (an upstream of Anthropic's API).
	Anthropic bool
}

// CopyRequest copies the client headers that may reach an upstream from in
// to out, the groups allow names among them.
func CopyRequest(out, in http.Header, allow Allow) {
	copyNamed(out, in, forwardedRequest)
	if allow.Account {
		copyNamed(out, in, AccountHeaders)
	}
	if allow.Anthropic {
		copyNamed(out, in, AnthropicHeaders)
	}
	for k, v := range in {
		for _, p := range forwardedRequestPrefixes {
			if strings.HasPrefix(k, p) {
				out[k] = v
			}
		}
	}
}

func copyNamed(out, in http.Header, names []string) {
	for _, h := range names {
		if v := in.Values(h); len(v) > 0 {
			out[h] = v
		}
	}
}

// Response headers a client relies on: the body's type and disposition,
// the provider's request id and processing time, rate-limit state, and when
// to retry. Anything else — llmgate's own (Idempotent-*, X-Llmgate-*,
// X-Should-Retry), CORS, cookies, the provider's account
// (Openai-Organization, Openai-Project), hop-by-hop — never passes.
var relayedResponse = map[string]bool{
	"Content-Type": true, "Content-Disposition": true, "Content-Language": true,
	"X-Request-Id": true, "Request-Id": true, "Openai-Processing-Ms": true, "Openai-Version": true,
	"Retry-After": true, "Retry-After-Ms": true, "Cache-Control": true,
}

var relayedResponsePrefixes = []string{"X-Ratelimit-", "Anthropic-Ratelimit-"}

// Relayed reports whether an upstream response header (canonical name)
// reaches the client.
func Relayed(name string) bool {
	if relayedResponse[name] {
		return true
	}
	for _, p := range relayedResponsePrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// Response returns the headers of h that reach the client, skipping any
// named in its Connection header too.
func Response(h http.Header) http.Header {
	out := make(http.Header, len(h))
	var conn map[string]bool
	for _, v := range h["Connection"] {
		for _, f := range strings.Split(v, ",") {
			if conn == nil {
				conn = map[string]bool{}
			}
			conn[textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(f))] = true
		}
	}
	for k, v := range h {
		if Relayed(k) && !conn[k] {
			out[k] = v
		}
	}
	return out
}
