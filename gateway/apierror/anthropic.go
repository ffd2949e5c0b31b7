package apierror

import (
	"encoding/json"
	"net/http"
)

// Anthropic's error shape. On an Anthropic route (/v1/messages) the
// gateway's own errors are what Anthropic's API sends,
// {"type":"error","error":{"type":...,"message":...}}, with the status
// Wire chose and the error type Anthropic uses for that status, so the
// official SDKs (anthropic-sdk-go, @anthropic-ai/sdk, anthropic-python)
// raise their own error type for them. Only the message is the gateway's;
// the OpenAI error.code (Error.Code) has no place in the shape and is not
// sent.

// AnthropicType is Anthropic's error.type for a status:
//
//   - 400 and any 4xx Anthropic has no type of its own for (410, 422, 499,
//     ...): invalid_request_error, as Anthropic's docs say that type
//     covers;
//   - 401 authentication_error, 402 billing_error, 403 permission_error,
//     404 not_found_error, 409 conflict_error, 413 request_too_large, 429
//     rate_limit_error;
//   - 503 and 529 overloaded_error: every 503 the gateway sends (a breaker
//     open, the idempotency store unavailable or full) means "cannot take
//     this now, retry after Retry-After", which is what overloaded_error
//     says; the status stays 503, so an SDK's retry decision (by status and
//     x-should-retry) is the same as on the OpenAI route;
//   - 504 timeout_error;
//   - 500, 502 and any other status: api_error (an upstream that could not
//     be reached or answered unusably is, to the client, an unexpected
//     error behind the API).
func AnthropicType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusConflict:
		return "conflict_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

// anthropicError is Anthropic's error body.
type anthropicError struct {
	Type  string             `json:"type"` // always "error"
	Error anthropicErrorBody `json:"error"`
}

type anthropicErrorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

func anthropicJSON(status int, msg string) []byte {
	b, _ := json.Marshal(anthropicError{Type: "error", Error: anthropicErrorBody{Type: AnthropicType(status), Message: msg}})
	return b
}

// AnthropicBody renders e in Anthropic's error shape, its error.type
// chosen by AnthropicType from e.Status.
func AnthropicBody(e *Error) []byte { return anthropicJSON(e.Status, e.Message) }

// WriteAnthropic is Write in Anthropic's error shape: err mapped by Wire,
// with the same status, Retry-After and x-should-retry.
func WriteAnthropic(w http.ResponseWriter, err error) *Error {
	e := Wire(err)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	SetHeaders(h, e)
	w.WriteHeader(e.Status)
	_, _ = w.Write(AnthropicBody(e))
	return e
}

// anthropicStreamStatus is the status of the gateway's stream-ending
// errors, by the code the relay and the keyed path give them (the one an
// OpenAI stream's event carries as error.code): it picks the event's
// Anthropic type as a JSON answer of that status would have it. A code
// not here is a 500 (api_error).
var anthropicStreamStatus = map[string]int{
	"upstream_stream_error":         http.StatusBadGateway,         // the upstream's stream broke or was no answer
	"upstream_bad_response":         http.StatusBadGateway,         // ... likewise
	"upstream_timeout":              http.StatusGatewayTimeout,     // it stalled
	"client_deadline_exceeded":      http.StatusGatewayTimeout,     // X-Llmgate-Deadline passed
	"idempotency_store_unavailable": http.StatusServiceUnavailable, // the commit failed
	"idempotency_store_full":        http.StatusServiceUnavailable,
}

// AnthropicStreamEvent is the event that ends a Messages stream which
// broke after its first byte reached the client: `event: error` with
// Anthropic's error body as its data, which is what the official SDKs
// raise on (a stream that just stopped would be taken as complete by
// @anthropic-ai/sdk's finalMessage()). code is the gateway's error code;
// it only picks the error.type (see anthropicStreamStatus).
func AnthropicStreamEvent(msg, code string) []byte {
	status, ok := anthropicStreamStatus[code]
	if !ok {
		status = http.StatusInternalServerError
	}
	b := anthropicJSON(status, msg)
	out := make([]byte, 0, len(b)+22)
	out = append(out, "event: error\ndata: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}
