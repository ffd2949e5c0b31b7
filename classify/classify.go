// Package classify turns what one upstream attempt produced — a transport
// error, a status with its headers and error body, a 200's completion, or
// the events of a stream — into a Class with a short structural reason.
//
// The retry loop asks a Class whether it is worth another attempt, the
// circuit breaker whether it counts against the upstream; POLICY.md is the
// table both follow, and the table test in classify_test.go reads it.
//
// Decisions come from structure only: the status code, error.type,
// error.code and error.details.error_code, finish_reason (stop_reason,
// status), errors.Is / errors.As on net errors. Message
// text is never searched: providers reword messages, and a classifier that
// greps for "quota" misfires on a prompt that is about quotas.
//
// The same walks read what an answer says it cost (Usage, Tokens): the
// gateway counts tokens from them without a second pass over the body.
//
// The package is pure: no HTTP client, no clock (the caller passes now), no
// other llmgate package. Its JSON scanner is its own subpackage, jsonscan,
// which the gateway also uses to read request bodies.
package classify

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"
)

// Class is what an attempt came to, as far as retrying and the breaker care.
type Class string

// The classes. POLICY.md says what each one means for a retry and for the
// breaker.
const (
	Success       Class = "success"
	Transient     Class = "transient"      // connection refused/reset, DNS failure, TLS handshake timeout, upstream timeout, 502/503/504/529, 200 with an unparseable/truncated JSON body
	RateLimited   Class = "rate_limited"   // 429 that is not a quota/billing error
	ServerError   Class = "server_error"   // 500 and other 5xx: transient, but one retry only
	Quota         Class = "quota"          // 402, insufficient_quota, billing_hard_limit_reached, a spend limit, ... whatever the status
	ClientError   Class = "client_error"   // 400, 404, 409, 413, 422 and other 4xx
	Unauthorized  Class = "unauthorized"   // 401: the provider rejects the gateway's own key (revoked, wrong)
	Auth          Class = "auth"           // 403: not allowed (often one model or one request)
	ContentFilter Class = "content_filter" // finish_reason content_filter in any choice, or a 4xx whose error.code is content_filter / content_policy_violation
	Empty         Class = "empty_output"   // 200 whose every choice has no content, no tool_calls, no function_call, no refusal (or no choices at all)
	Canceled      Class = "canceled"       // client went away / request context cancelled
)

// Retryable reports whether another attempt may succeed: Transient,
// RateLimited and ServerError.
func (c Class) Retryable() bool {
	switch c {
	case Transient, RateLimited, ServerError:
		return true
	}
	return false
}

// MaxAttempts is a cap on attempts, the first included, that this class
// adds to the retry policy's own: ServerError allows 2 (a 500 is retried
// once — it is as often a bug triggered by the request as an outage).
// 0 means no extra cap.
func (c Class) MaxAttempts() int {
	if c == ServerError {
		return 2
	}
	return 0
}

// BreakerFailure reports whether the class counts against the upstream's
// circuit breaker: Transient, RateLimited and ServerError, and
// Unauthorized — a provider that rejects the gateway's key is unusable for
// everyone until an operator fixes it, and the fallback should take over.
// Everything else — a permanent error included — shows the upstream
// answering.
func (c Class) BreakerFailure() bool { return c.Retryable() || c == Unauthorized }

// Excluded reports whether the breaker should ignore the request entirely:
// Canceled, because a client that went away says nothing of the upstream.
func (c Class) Excluded() bool { return c == Canceled }

// Outcome is a Class with what led to it.
type Outcome struct {
	Class Class
	// Reason is short and structural: "status 503", "connection refused",
	// "timeout", "error.code insufficient_quota",
	// "finish_reason content_filter". It never quotes upstream message text.
	Reason string
	// Status is the upstream status, 0 for transport errors. For an error
	// object sent inside a stream it is that object's numeric code, if it
	// has one, else 0.
	Status int
	// Timeout: the transport error was a timeout (the gateway answers 504
	// rather than 502).
	Timeout bool
	// RetryAfter is how long the upstream asked us to wait before another
	// attempt; meaningful only when HasRetryAfter.
	RetryAfter    time.Duration
	HasRetryAfter bool
	// Usage is the token count a 2xx answer reported, read in the same
	// walk that classified it: set by FromCompletion and by a
	// StreamObserver's Outcome, zero (not Reported) from everything else.
	Usage Tokens
	// Note qualifies a Success that is not plain: "max_output_tokens" for a
	// Responses answer cut at the client's limit. Empty otherwise.
	Note string
}

// Header is the X-Llmgate-Outcome value for o: its class when it is not
// plain success, its Note for a qualified success, else "".
func (o Outcome) Header() string {
	if o.Class != Success && o.Class != "" {
		return string(o.Class)
	}
	return o.Note
}

// FromError classifies a transport error: what http.Client.Do (or reading
// the body) returned. nil is Success.
//
//   - context.Canceled: Canceled.
//   - context.DeadlineExceeded, os.ErrDeadlineExceeded, any net.Error whose
//     Timeout() is true (an *url.Error from a Client.Timeout, a TLS handshake
//     timeout, a DNS timeout): Transient with Timeout set.
//   - ECONNREFUSED, ECONNRESET, EPIPE, io.ErrUnexpectedEOF, io.EOF,
//     *net.DNSError, *net.OpError, and anything else: Transient.
func FromError(err error) Outcome {
	if err == nil {
		return Outcome{Class: Success, Reason: "no error"}
	}
	// Canceled before timeouts: a request whose client went away must not
	// count against the upstream, whatever else the error chain holds.
	if errors.Is(err, context.Canceled) {
		return Outcome{Class: Canceled, Reason: "canceled"}
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return Outcome{Class: Transient, Reason: "timeout", Timeout: true}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return Outcome{Class: Transient, Reason: "timeout", Timeout: true}
	}
	var reason string
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		reason = "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		reason = "connection reset"
	case errors.Is(err, syscall.EPIPE):
		reason = "broken pipe"
	case errors.Is(err, io.ErrUnexpectedEOF):
		reason = "unexpected EOF"
	case errors.Is(err, io.EOF):
		// net/http's "EOF": the upstream closed the connection before
		// answering (typically a keep-alive connection it had dropped).
		reason = "EOF"
	case errors.As(err, &dnsErr):
		reason = "dns failure"
	case errors.As(err, &opErr):
		reason = "network error"
	default:
		reason = "transport error"
	}
	return Outcome{Class: Transient, Reason: reason}
}

// FromResponse classifies an upstream response from its status, headers and
// (possibly truncated) error body; now is the time the headers arrived,
// for a Retry-After given as an HTTP-date.
//
// 2xx is Success: the body is not looked at (FromCompletion and
// StreamObserver do that). Otherwise, in this order:
//
//   - error.details.error_code, error.code or error.type
//     insufficient_quota, billing_hard_limit_reached, billing_not_active,
//     billing_limit_reached, quota_exceeded, billing_error (Anthropic's
//     402), enforced_spend_limit_reached, contract_spend_limit_reached,
//     linked_organization_spend_limit_reached (Anthropic's 429 for a spend
//     limit) or client_storage_quota_exceeded (a chained llmgate's), or an
//     X-Llmgate-Outcome: quota header (a chained llmgate's verdict on its
//     own upstream's answer): Quota, whatever the status.
//   - a 4xx whose error.code (or type) is content_filter or
//     content_policy_violation: ContentFilter.
//   - 401: Unauthorized. 402: Quota. 403: Auth. 429: RateLimited. Other
//     4xx: ClientError.
//   - 502, 503, 504, 529: Transient. 500 and other 5xx: ServerError.
//   - 1xx and 3xx (an upstream that should not send them): ServerError.
//   - status 0 (an error object without a status, as sent inside a
//     stream): decided from error.type / error.code, and from a numeric
//     error.code when it is a status.
//
// The body may be {"error":{"type":...,"code":...}} (code a string, a number
// or null), {"type":...,"code":...}, or a one-element array of either. A
// body cut off mid-way still yields the fields that came before the cut.
//
// RetryAfter is filled from Retry-After or retry-after-ms for any non-2xx
// status; x-ratelimit-reset-* only for a 429. Why: OpenAI sends the
// x-ratelimit-reset-* headers on every response, and they say when the
// rate-limit window refills, not that the request must wait — honouring
// "6m0s" on a 503 would give up on a retry that would have worked.
// Anthropic's anthropic-ratelimit-*-reset headers are never read: they are
// RFC 3339 times at which a limit is wholly replenished, not the wait
// before a request would pass (its retry-after is).
func FromResponse(status int, h http.Header, body []byte, now time.Time) Outcome {
	if status >= 200 && status < 300 {
		return Outcome{Class: Success, Reason: statusReason(status), Status: status}
	}
	o := fromErrorBody(status, parseErrorBody(body))
	if o.Class != Quota && h.Get(chainedOutcome) == string(Quota) {
		// A chained llmgate classified its own upstream's answer as a
		// quota error: whatever the body now says, retrying here would
		// not pay for it either.
		o = Outcome{Class: Quota, Reason: chainedOutcome + " quota", Status: status}
	}
	if o.Class == ContentFilter {
		return o // a RetryAfter on a filtered request is meaningless
	}
	o.RetryAfter, o.HasRetryAfter = parseRetryAfter(h, now, status == http.StatusTooManyRequests)
	return o
}

// fromErrorBody decides from status first and the error object's fields
// second; status 0 means the fields are all there is.
func fromErrorBody(status int, e errorFields) Outcome {
	if r, ok := lookupCode(quotaCodes, e); ok {
		return Outcome{Class: Quota, Reason: r, Status: status}
	}
	if status == 0 {
		return fromFields(e)
	}
	if status >= 400 && status < 500 {
		if r, ok := lookupCode(contentFilterCodes, e); ok {
			return Outcome{Class: ContentFilter, Reason: r, Status: status}
		}
	}
	return Outcome{Class: statusClass(status), Reason: statusReason(status), Status: status}
}

// fromFields classifies an error object that came without an HTTP status:
// by a numeric code that is a status if there is one, else by type/code.
func fromFields(e errorFields) Outcome {
	if e.status != 0 {
		return fromErrorBody(e.status, e)
	}
	if r, ok := lookupCode(contentFilterCodes, e); ok {
		return Outcome{Class: ContentFilter, Reason: r}
	}
	if rule, ok := typeRules[e.code]; ok {
		return Outcome{Class: rule.class, Reason: rule.code}
	}
	if rule, ok := typeRules[e.typ]; ok {
		return Outcome{Class: rule.class, Reason: rule.typ}
	}
	// An error nobody recognises, in place of a completion: the upstream's
	// fault until shown otherwise, but not worth more than one retry.
	return Outcome{Class: ServerError, Reason: "error object"}
}

func statusClass(status int) Class {
	switch {
	case status == http.StatusUnauthorized:
		return Unauthorized
	case status == http.StatusForbidden:
		return Auth
	case status == http.StatusPaymentRequired:
		// Payment Required: the account cannot pay (Anthropic's
		// billing_error; OpenRouter's out of credits).
		return Quota
	case status == http.StatusTooManyRequests:
		return RateLimited
	case status >= 400 && status < 500:
		return ClientError
	case status == http.StatusBadGateway, status == http.StatusServiceUnavailable,
		status == http.StatusGatewayTimeout, status == 529: // 529: Anthropic's "overloaded"
		return Transient
	case status >= 200 && status < 300:
		return Success
	default:
		// 500, other 5xx, and statuses an upstream should never send.
		return ServerError
	}
}

// statusReasons holds "status N" for every valid status, so that the hot
// path does not format a string per response.
var statusReasons = func() (r [600]string) {
	for i := 100; i < len(r); i++ {
		r[i] = "status " + strconv.Itoa(i)
	}
	return r
}()

func statusReason(status int) string {
	if status >= 100 && status < len(statusReasons) {
		return statusReasons[status]
	}
	return "status " + strconv.Itoa(status)
}

// codeRule is what a known error.type / error.code value means, with the
// reasons precomputed (no string is built per response).
type codeRule struct {
	class             Class
	code, typ, detail string // "error.code X", "error.type X", "error.details.error_code X"
}

func rules(class Class, values ...string) map[string]codeRule {
	m := make(map[string]codeRule, len(values))
	for _, v := range values {
		m[v] = codeRule{class: class, code: "error.code " + v, typ: "error.type " + v, detail: "error.details.error_code " + v}
	}
	return m
}

var (
	// quotaCodes: the account cannot pay for the request; waiting a few
	// seconds will not change that. OpenAI sends insufficient_quota as both
	// type and code on a 429. Anthropic sends billing_error as the type of
	// a 402, and a spend limit as a 429 rate_limit_error whose
	// error.details.error_code says which limit: the organisation's
	// monthly cap (enforced_), its contract's, or the one a linked
	// organisation set (or its credit): all lifted by people, not by
	// waiting. (ramp_limit_exceeded, the cap on how fast usage grows, is a
	// rate limit: it asks for a retry after retry-after.)
	quotaCodes = rules(Quota,
		"insufficient_quota",
		"billing_hard_limit_reached",
		"billing_not_active",
		"billing_limit_reached",
		"quota_exceeded",
		"billing_error",
		"enforced_spend_limit_reached",
		"contract_spend_limit_reached",
		"linked_organization_spend_limit_reached",
		// A chained llmgate's own: the client's stored answers at that
		// gateway are at its quota, which frees only as they expire.
		"client_storage_quota_exceeded",
		// A chained llmgate's client budget, spent until its window resets.
		"budget_exceeded",
	)
	// chainedOutcome is the header in which a chained llmgate says how it
	// classified its upstream's answer.
	chainedOutcome = "X-Llmgate-Outcome"
	// contentFilterCodes: Azure OpenAI's 400 for a filtered prompt, and
	// OpenAI's content_policy_violation.
	contentFilterCodes = rules(ContentFilter,
		"content_filter",
		"content_policy_violation",
	)
	// typeRules classify an error object that arrived without a status
	// (inside a stream): OpenAI's and Anthropic's error types and the codes
	// that imply one.
	typeRules = merge(
		rules(RateLimited, "rate_limit_exceeded", "rate_limit_error", "requests", "tokens"),
		rules(Transient, "overloaded_error", "overloaded", "service_unavailable", "timeout", "timeout_error"),
		rules(ServerError, "server_error", "api_error", "internal_error", "internal_server_error"),
		rules(Unauthorized, "authentication_error", "invalid_api_key", "invalid_authentication"),
		rules(Auth, "permission_error"),
		rules(ClientError, "invalid_request_error", "not_found_error", "context_length_exceeded", "request_too_large", "invalid_prompt"),
	)
)

func merge(ms ...map[string]codeRule) map[string]codeRule {
	out := make(map[string]codeRule)
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// lookupCode finds e's detail, then its code, then its type, in m: the
// more specific wins.
func lookupCode(m map[string]codeRule, e errorFields) (reason string, ok bool) {
	if e.detail != "" {
		if r, ok := m[e.detail]; ok {
			return r.detail, true
		}
	}
	if e.code != "" {
		if r, ok := m[e.code]; ok {
			return r.code, true
		}
	}
	if e.typ != "" {
		if r, ok := m[e.typ]; ok {
			return r.typ, true
		}
	}
	return "", false
}
