package apierror_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/llmgate/llmgate/gateway/apierror"
)

func TestAnthropicType(t *testing.T) {
	for status, want := range map[int]string{
		400: "invalid_request_error",
		401: "authentication_error",
		402: "billing_error",
		403: "permission_error",
		404: "not_found_error",
		409: "conflict_error",
		410: "invalid_request_error",
		413: "request_too_large",
		422: "invalid_request_error",
		429: "rate_limit_error",
		499: "invalid_request_error",
		500: "api_error",
		502: "api_error",
		503: "overloaded_error",
		504: "timeout_error",
		529: "overloaded_error",
		501: "api_error",
	} {
		if got := apierror.AnthropicType(status); got != want {
			t.Errorf("AnthropicType(%d) = %q, want %q", status, got, want)
		}
	}
}

// documented is Anthropic's error body as its API reference gives it;
// decoding refuses any other member.
type documented struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeDocumented(t *testing.T, b []byte) documented {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var d documented
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if d.Type != "error" || d.Error.Type == "" || d.Error.Message == "" {
		t.Fatalf("not Anthropic's error shape: %s", b)
	}
	return d
}

// gatewayErrors are errors the gateway makes on a request path, with what
// an Anthropic client gets for each.
var gatewayErrors = []struct {
	name        string
	err         error
	status      int
	typ         string
	retryAfter  string
	shouldRetry string
}{
	{"invalid request", apierror.Invalid("max_tokens", "max_tokens: required"), 400, "invalid_request_error", "", "false"},
	{"no gateway key", &apierror.Error{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key", Message: "Invalid API key."}, 401, "authentication_error", "", "false"},
	{"unknown model", apierror.NotFound("model_not_found", "model", "The model claude-x does not exist."), 404, "not_found_error", "", "false"},
	{"key in flight", &apierror.KeyInFlight{}, 409, "conflict_error", "1", "true"},
	{"body too large", &apierror.TooLarge{Limit: 1 << 20}, 413, "request_too_large", "", "false"},
	{"key reused", &apierror.KeyReused{}, 422, "invalid_request_error", "", "false"},
	{"client rate limit", &apierror.ClientLimited{Client: "team-a", Limit: apierror.LimitRate, RetryAfter: 2 * time.Second}, 429, "rate_limit_error", "2", "true"},
	{"client storage quota", &apierror.ClientLimited{Client: "team-a", Limit: apierror.LimitStorage, RetryAfter: time.Hour}, 429, "rate_limit_error", "3600", "false"},
	{"internal", errors.New("boom"), 500, "api_error", "", "false"},
	{"upstream refused the gateway's key", &apierror.UpstreamAuth{Upstream: "anthropic", Status: 401}, 502, "api_error", "", "false"},
	{"upstream unreachable", &apierror.Transport{Upstream: "anthropic", Reason: "connection refused"}, 502, "api_error", "", "false"},
	{"bad answer", &apierror.BadAnswer{Upstream: "anthropic", Class: "transient", Reason: "malformed message body"}, 502, "api_error", "", "false"},
	{"breaker open", &apierror.BreakerOpen{Upstream: "anthropic", RetryAfter: 5 * time.Second}, 503, "overloaded_error", "5", "false"},
	{"store unavailable", &apierror.StoreUnavailable{Err: errors.New("redis down")}, 503, "overloaded_error", "1", "false"},
	{"store full", &apierror.StoreFull{Reason: "disk", Err: errors.New("full")}, 503, "overloaded_error", "30", "false"},
	{"upstream timeout", &apierror.Transport{Upstream: "anthropic", Reason: "timeout", Timeout: true}, 504, "timeout_error", "", "false"},
	{"client deadline", &apierror.ClientDeadline{Keyed: true}, 504, "timeout_error", "", "true"},
	{"retries exhausted on 529", &apierror.RetriesExhausted{Upstream: "anthropic", Status: 529, Class: "transient", Reason: "status 529", Attempts: 3,
		RetryAfter: 9 * time.Second, Body: []byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)}, 529, "overloaded_error", "9", "false"},
	{"retries exhausted on a 503 api_error", &apierror.RetriesExhausted{Upstream: "anthropic", Status: 503, Class: "transient", Reason: "status 503", Attempts: 3,
		Body: []byte(`{"type":"error","error":{"type":"api_error","message":"Internal"}}`)}, 503, "api_error", "", "false"},
	{"retries exhausted on HTML", &apierror.RetriesExhausted{Upstream: "anthropic", Status: 502, Class: "transient", Reason: "status 502", Attempts: 3,
		Body: []byte(`<html>`)}, 502, "api_error", "", "false"},
}

func TestWriteAnthropic(t *testing.T) {
	for _, tc := range gatewayErrors {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			e := apierror.WriteAnthropic(rec, tc.err)
			if rec.Code != tc.status || e.Status != tc.status {
				t.Errorf("status %d (Error %d), want %d", rec.Code, e.Status, tc.status)
			}
			h := rec.Header()
			if h.Get("Content-Type") != "application/json" || h.Get("Retry-After") != tc.retryAfter || h.Get("X-Should-Retry") != tc.shouldRetry {
				t.Errorf("headers %v, want Retry-After %q, x-should-retry %s", h, tc.retryAfter, tc.shouldRetry)
			}
			d := decodeDocumented(t, rec.Body.Bytes())
			if d.Error.Type != tc.typ || d.Error.Message != e.Message {
				t.Errorf("body %s, want type %q and the message %q", rec.Body, tc.typ, e.Message)
			}
		})
	}
}

// anthropicClient is the official Go SDK pointed at srv, without retries
// of its own unless told.
func anthropicClient(srv *httptest.Server, opts ...option.RequestOption) anthropic.Client {
	return anthropic.NewClient(append([]option.RequestOption{
		option.WithBaseURL(srv.URL), option.WithAPIKey("llmgate-client-key"),
		option.WithHTTPClient(srv.Client()), option.WithMaxRetries(0),
	}, opts...)...)
}

var sdkParams = anthropic.MessageNewParams{
	Model: "claude-sonnet-4-5", MaxTokens: 16,
	Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hi"))},
}

// The official Go SDK raises its own error type for each gateway error,
// with the status and the Anthropic error type the gateway chose.
func TestWriteAnthropicWithTheSDK(t *testing.T) {
	for _, tc := range gatewayErrors {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				apierror.WriteAnthropic(w, tc.err)
			}))
			defer srv.Close()
			client := anthropicClient(srv)
			_, err := client.Messages.New(context.Background(), sdkParams)
			var ae *anthropic.Error
			if !errors.As(err, &ae) {
				t.Fatalf("Messages.New: %v (%T), want an *anthropic.Error", err, err)
			}
			if ae.StatusCode != tc.status || string(ae.Type()) != tc.typ || ae.Message != apierror.Wire(tc.err).Message {
				t.Errorf("SDK error: status %d type %q message %q; want %d %q %q", ae.StatusCode, ae.Type(), ae.Message, tc.status, tc.typ, apierror.Wire(tc.err).Message)
			}
		})
	}
}

// x-should-retry: false keeps the SDK from retrying what the gateway has
// already retried, even a 503 it would retry by its status.
func TestWriteAnthropicSDKHonoursShouldRetry(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		apierror.WriteAnthropic(w, &apierror.Transport{Upstream: "anthropic", Reason: "connection refused"})
	}))
	defer srv.Close()
	client := anthropicClient(srv, option.WithMaxRetries(2))
	if _, err := client.Messages.New(context.Background(), sdkParams); err == nil {
		t.Fatal("no error")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the SDK sent %d requests, want 1", n)
	}
}

func TestAnthropicStreamEvent(t *testing.T) {
	for _, tc := range []struct{ code, typ string }{
		{"upstream_stream_error", "api_error"},
		{"idempotency_store_unavailable", "overloaded_error"},
		{"client_deadline_exceeded", "timeout_error"},
		{"something_new", "api_error"},
	} {
		ev := apierror.AnthropicStreamEvent("The upstream stream failed before it finished: status 529.", tc.code)
		data, ok := bytes.CutPrefix(ev, []byte("event: error\ndata: "))
		if !ok || !bytes.HasSuffix(data, []byte("\n\n")) || bytes.Count(ev, []byte("\n")) != 3 {
			t.Fatalf("%q: not one SSE event named error", ev)
		}
		d := decodeDocumented(t, bytes.TrimSuffix(data, []byte("\n\n")))
		if d.Error.Type != tc.typ {
			t.Errorf("code %s: type %q, want %q", tc.code, d.Error.Type, tc.typ)
		}
	}
}

// A Messages stream that the gateway ends with its error event is an error
// to the official Go SDK (its type and message as sent), never a stream
// that ended cleanly.
func TestAnthropicStreamEventWithTheSDK(t *testing.T) {
	const msg = "The upstream stream failed before it finished: stream ended without message_stop."
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			`event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}` + "\n\n",
			`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n",
			`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}` + "\n\n",
		} {
			_, _ = w.Write([]byte(ev))
		}
		_, _ = w.Write(apierror.AnthropicStreamEvent(msg, "upstream_stream_error"))
	}))
	defer srv.Close()
	client := anthropicClient(srv)
	stream := client.Messages.NewStreaming(context.Background(), sdkParams)
	var acc anthropic.Message
	events := 0
	for stream.Next() {
		events++
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	var ae *anthropic.Error
	if err := stream.Err(); !errors.As(err, &ae) {
		t.Fatalf("stream.Err() = %v (%T), want an *anthropic.Error", err, err)
	}
	if events != 3 || string(ae.Type()) != "api_error" || ae.Message != msg {
		t.Errorf("%d events, then type %q message %q; want 3, api_error, %q", events, ae.Type(), ae.Message, msg)
	}
}
