package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
)

// apiError is every error the gateway itself produces. The client sees
// Message (and Type, Code, Param) in OpenAI's error shape; the log sees Err.
// Model: tailscale's tsweb.HTTPError.
type apiError struct {
	Status  int
	Type    string // OpenAI error.type: invalid_request_error, authentication_error, ...
	Code    string // OpenAI error.code, may be empty
	Param   string
	Message string
	// RetryAfter, when > 0, is sent as Retry-After (whole seconds, rounded up).
	RetryAfter time.Duration
	// ShouldRetry sets x-should-retry: true. The gateway is the retry layer,
	// so it is false everywhere except where a later retry can succeed
	// without another upstream call (a keyed request still in flight).
	ShouldRetry bool
	Err         error
}

func (e *apiError) Error() string {
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

func (e *apiError) Unwrap() error { return e.Err }

// errClientGone answers (for the log and metrics) a client that left
// before the gateway could: nginx's 499.
var errClientGone = &apiError{Status: 499, Type: "invalid_request_error", Code: "client_closed_request",
	Message: "The client closed the request.", Err: context.Canceled}

func errInvalid(param, msg string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: msg}
}

// openAIError is the wire shape {"error":{"message","type","param","code"}}.
type openAIError struct {
	Error openAIErrorBody `json:"error"`
}

type openAIErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// errorBody renders e in OpenAI's error shape.
func errorBody(e *apiError) []byte {
	b, _ := json.Marshal(openAIError{Error: openAIErrorBody{
		Message: e.Message, Type: e.Type, Param: nullable(e.Param), Code: nullable(e.Code),
	}})
	return b
}

// retryAfterSeconds renders d as whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}

// writeAPIError writes e to w. It is the one place gateway errors become
// HTTP responses.
func writeAPIError(w http.ResponseWriter, e *apiError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", retryAfterSeconds(e.RetryAfter))
	}
	if e.ShouldRetry {
		h.Set("X-Should-Retry", "true")
	} else {
		h.Set("X-Should-Retry", "false")
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(errorBody(e))
}

// toAPIError maps any error a handler returned to an apiError: our own pass
// through, echo's (404 for unknown routes, 405, 413 from its middleware) get
// OpenAI's shape, anything else is a 500 whose detail stays in the log.
func toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "unknown_url",
				Message: "Unknown request URL. Please check the URL for typos, or see the docs at https://platform.openai.com/docs/api-reference/.", Err: err}
		case http.StatusMethodNotAllowed:
			return &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
				Message: "Method not allowed for this URL.", Err: err}
		case http.StatusRequestEntityTooLarge:
			return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
				Message: "Request body too large.", Err: err}
		}
		msg := http.StatusText(he.Code)
		if msg == "" {
			msg = "error"
		}
		return &apiError{Status: he.Code, Type: "invalid_request_error", Message: msg, Err: err}
	}
	return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error",
		Message: "The gateway failed to handle the request; see its log for details.", Err: err}
}
