package apierror_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/gateway/apierror"
)

// TestRetriesExhausted: the exhausted-retries answer in OpenAI's shape
// keeps the upstream's status, error.type, error.param and a string
// error.code; a null, absent or numeric code becomes
// upstream_retries_exhausted; the message says the attempts, the last
// class and what the upstream said; the upstream's headers go out except
// the ones the gateway writes itself.
func TestRetriesExhausted(t *testing.T) {
	for _, tc := range []struct {
		name                string
		status              int
		body                string
		typ, code, param    string
		retryAfter          time.Duration
		wantRetryAfter      string
		wantInMessage       []string
		wantNotInMessageErr string
	}{
		{"503, code null", 503, `{"error":{"message":"Service Unavailable","type":"server_error","param":null,"code":null}}`,
			"server_error", "upstream_retries_exhausted", "", 0, "", []string{"3 attempts", "transient (status 503)", "The upstream said: Service Unavailable"}, ""},
		{"429 with its code", 429, `{"error":{"message":"Rate limit reached","type":"requests","param":"model","code":"rate_limit_exceeded"}}`,
			"requests", "rate_limit_exceeded", "model", 1500 * time.Millisecond, "2", []string{"3 attempts"}, ""},
		{"429 without a body", 429, ``, "requests", "upstream_retries_exhausted", "", 0, "", []string{"3 attempts"}, "The upstream said"},
		{"numeric code", 503, `{"error":{"message":"x","type":"unavailable","code":503}}`, "unavailable", "upstream_retries_exhausted", "", 0, "", nil, ""},
		{"HTML", 502, `<html>bad gateway</html>`, "server_error", "upstream_retries_exhausted", "", 0, "", []string{"3 attempts"}, "html"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			upstreamHeader := http.Header{"X-Request-Id": {"req_1"}, "Retry-After": {"Wed, 21 Oct 2015 07:28:00 GMT"},
				"Content-Type": {"text/html"}, "X-Should-Retry": {"true"}}
			apierror.Write(rec, &apierror.RetriesExhausted{Upstream: "openai", Status: tc.status, Class: "transient", Reason: "status " + itoa(tc.status),
				Attempts: 3, RetryAfter: tc.retryAfter, Body: []byte(tc.body), Header: upstreamHeader})
			if rec.Code != tc.status {
				t.Errorf("status %d, want %d", rec.Code, tc.status)
			}
			var b struct {
				Error struct {
					Message string
					Type    string
					Param   *string
					Code    *string
				}
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
				t.Fatalf("%s: %v", rec.Body, err)
			}
			param := ""
			if b.Error.Param != nil {
				param = *b.Error.Param
			}
			if b.Error.Type != tc.typ || b.Error.Code == nil || *b.Error.Code != tc.code || param != tc.param {
				t.Errorf("body %s, want type %q code %q param %q", rec.Body, tc.typ, tc.code, tc.param)
			}
			for _, s := range tc.wantInMessage {
				if !strings.Contains(b.Error.Message, s) {
					t.Errorf("message %q lacks %q", b.Error.Message, s)
				}
			}
			if tc.wantNotInMessageErr != "" && strings.Contains(b.Error.Message, tc.wantNotInMessageErr) {
				t.Errorf("message %q has %q", b.Error.Message, tc.wantNotInMessageErr)
			}
			h := rec.Header()
			if h.Get("Retry-After") != tc.wantRetryAfter || h.Get("X-Should-Retry") != "false" ||
				h.Get("Content-Type") != "application/json" || h.Get("X-Request-Id") != "req_1" {
				t.Errorf("headers %v, want Retry-After %q (the gateway's, not the upstream's), x-should-retry false, the upstream's request id", h, tc.wantRetryAfter)
			}
		})
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
