package apierror

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// retriesExhausted is the answer to a call whose retries ran out on an
// upstream's transient failures: the upstream's status and error.type
// (SDKs raise RateLimitError, InternalServerError, OverloadedError, ... by
// them), its error.code or, where it had none, upstream_retries_exhausted,
// and a message that says how many attempts were made and how the last
// one failed, then what the upstream said. x-should-retry is false: the
// gateway has done the retrying.
func retriesExhausted(re *RetriesExhausted) *Error {
	p := parseProviderError(re.Body)
	e := &Error{Status: re.Status, Type: p.typ, ProviderType: p.typ != "", Code: p.code, Param: p.param,
		RetryAfter: re.RetryAfter, Header: re.Header, Err: re}
	if e.Type == "" {
		e.Type = "server_error"
		if re.Status == http.StatusTooManyRequests {
			e.Type = "requests" // OpenAI's own rate-limit type
		}
	}
	if e.Code == "" {
		e.Code = "upstream_retries_exhausted"
	}
	attempts := "1 attempt"
	if re.Attempts != 1 {
		attempts = fmt.Sprintf("%d attempts", re.Attempts)
	}
	var msg strings.Builder
	fmt.Fprintf(&msg, "The gateway made %s at upstream %s and stopped retrying; the last failed as %s (%s).",
		attempts, re.Upstream, re.Class, re.Reason)
	if p.message != "" {
		msg.WriteString(" The upstream said: " + p.message)
	}
	e.Message = msg.String()
	return e
}

// providerError is what an upstream's error body says, in either
// provider's shape: OpenAI's {"error":{"message","type","param","code"}}
// or Anthropic's {"type":"error","error":{"type","message"}}. A field that
// is not a non-empty string (a null code, a numeric one) is left empty.
type providerError struct{ typ, code, param, message string }

func parseProviderError(body []byte) providerError {
	var b struct {
		Error struct {
			Type, Code, Param, Message any
		} `json:"error"`
	}
	if json.Unmarshal(body, &b) != nil {
		return providerError{}
	}
	str := func(v any) string { s, _ := v.(string); return s }
	return providerError{typ: str(b.Error.Type), code: str(b.Error.Code), param: str(b.Error.Param), message: str(b.Error.Message)}
}

// SetHeader writes e's headers to h: those it carries (an upstream's
// relayed ones), then Content-Type and, by SetRetry, Retry-After and
// x-should-retry — so that SetRetry stays the one writer of those two.
func SetHeader(h http.Header, e *Error) {
	for k, v := range e.Header {
		switch k {
		case "Content-Type", "Content-Length", "Retry-After", "X-Should-Retry":
			continue
		}
		h[k] = v
	}
	h.Set("Content-Type", "application/json")
	SetRetry(h, e.ShouldRetry, e.RetryAfter)
}
