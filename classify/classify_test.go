package classify

import (
	"bufio"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)

// A policy case is one way a row of the table can happen.
type policyCase struct {
	name    string
	outcome func(t *testing.T) Outcome
	reason  string // the expected Reason; "" = not checked
	timeout bool   // the expected Outcome.Timeout
}

func transport(f func(*testing.T) error) func(*testing.T) Outcome {
	return func(t *testing.T) Outcome { return FromError(f(t)) }
}

func response(status int, body string) func(*testing.T) Outcome {
	return func(*testing.T) Outcome { return FromResponse(status, nil, []byte(body), now) }
}

func completion(body string) func(*testing.T) Outcome {
	return func(*testing.T) Outcome { return FromCompletion([]byte(body)) }
}

func stream(events ...string) func(*testing.T) Outcome {
	return func(*testing.T) Outcome {
		var o StreamObserver
		for _, e := range events {
			o.Observe([]byte(e))
		}
		return o.Outcome()
	}
}

func responses(body string) func(*testing.T) Outcome {
	return func(*testing.T) Outcome { return FromResponses([]byte(body), nil, now) }
}

func responsesStream(events ...string) func(*testing.T) Outcome {
	return func(*testing.T) Outcome {
		var o ResponsesObserver
		for _, e := range events {
			o.Observe([]byte(e))
		}
		return o.Outcome()
	}
}

// policy is POLICY.md's table: the first four fields of each row are its
// cells, word for word (TestPolicyDoc holds the file to that), and the
// cases are how the row happens.
var policy = []struct {
	what, class, retried, breaker string
	want                          Class
	cases                         []policyCase
}{
	{
		"connection refused / reset, DNS failure, TLS handshake timeout, upstream timeout",
		"transient", "yes, with backoff", "yes", Transient,
		[]policyCase{
			{"dial refused", transport(errDialRefused), "connection refused", false},
			{"http refused", transport(errHTTPRefused), "connection refused", false},
			{"http reset", transport(errHTTPReset), "connection reset", false},
			{"closed before answering", transport(errHTTPClosedBeforeAnswer), "EOF", false},
			{"body cut short", transport(errHTTPTruncatedBody), "unexpected EOF", false},
			{"broken pipe", transport(errBrokenPipe), "broken pipe", false},
			{"http dns failure", transport(errHTTPDNS), "dns failure", false},
			{"dns not found", transport(errDNSNotFound), "dns failure", false},
			{"dns timeout", transport(errDNSTimeout), "timeout", true},
			{"tls handshake timeout", transport(errTLSHandshakeTimeout), "timeout", true},
			{"client timeout", transport(errClientTimeout), "timeout", true},
			{"context deadline", transport(errContextDeadline), "timeout", true},
			{"read deadline", transport(errReadDeadline), "timeout", true},
			{"other network error", transport(errOtherOp), "network error", false},
			{"unknown error", transport(errUnknown), "transport error", false},
		},
	},
	{
		"502, 503, 504, 529 (overloaded)",
		"transient", "yes, with backoff", "yes", Transient,
		[]policyCase{
			{"502", response(502, "<html>Bad Gateway</html>"), "status 502", false},
			{"503", response(503, `{"error":{"message":"The engine is currently overloaded","type":"server_error"}}`), "status 503", false},
			{"504", response(504, ""), "status 504", false},
			{"529", response(529, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`), "status 529", false},
			{"stream overloaded_error", stream(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`), "error.type overloaded_error", false},
			{"stream numeric code 503", stream(`{"error":{"code":503,"message":"unavailable","status":"UNAVAILABLE"}}`), "status 503", false},
			{"anthropic 504 timeout_error", response(504, anthropicError("timeout_error")), "status 504", false},
			{"messages error event overloaded_error", messagesRecorded("error_after_two_deltas.sse"), "error.type overloaded_error", false},
			{"messages error event timeout_error", messagesStream(`{"type":"error","error":{"type":"timeout_error","message":"x"}}`), "error.type timeout_error", false},
			{"messages 200 overloaded_error", messages(anthropicError("overloaded_error")), "error.type overloaded_error", false},
		},
	},
	{
		"200 with a truncated or unparseable JSON body",
		"transient", "yes, with backoff", "yes", Transient,
		[]policyCase{
			{"truncated", completion(`{"id":"chatcmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"Hel`), "malformed completion body", false},
			{"html", completion(`<html><body>upstream error</body></html>`), "malformed completion body", false},
			{"empty body", completion(``), "malformed completion body", false},
			{"not an object", completion(`[{"choices":[]}]`), "malformed completion body", false},
			{"stream event not json", stream(`{"choices":[{"delta":{"content":"Hi"}}]}`, `{"choices":[{"del`), "malformed stream event", false},
			{"responses truncated", responses(`{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hel`), "malformed response body", false},
			{"responses html", responses(`<html>bad gateway</html>`), "malformed response body", false},
			{"responses stream event not json", responsesStream(`{"type":"response.created","response":{"status":"in_progress"}}`, `{"type":"response.output_text.del`), "malformed stream event", false},
			{"messages truncated", messages(`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hel`), "malformed message body", false},
			{"messages html", messages(`<html>bad gateway</html>`), "malformed message body", false},
			{"messages stream event not json", messagesStream(`{"type":"message_start","message":{"content":[]}}`, `{"type":"content_block_del`), "malformed stream event", false},
		},
	},
	{
		"429 rate limit",
		"transient (rate_limited)", "yes, after Retry-After (delta-seconds or HTTP-date) or x-ratelimit-reset-*, else backoff", "yes", RateLimited,
		[]policyCase{
			{"429 no body", response(429, ""), "status 429", false},
			{"429 tokens", response(429, `{"error":{"message":"Rate limit reached for gpt-4o on tokens per min (TPM)","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`), "status 429", false},
			{"429 anthropic", response(429, `{"type":"error","error":{"type":"rate_limit_error","message":"quota-like words do not matter"}}`), "status 429", false},
			{"429 message mentions quota", response(429, `{"error":{"message":"insufficient_quota? no: you exceeded your quota of requests per minute","type":"requests","code":"rate_limit_exceeded"}}`), "status 429", false},
			{"stream rate_limit_exceeded", stream(`{"error":{"type":"tokens","code":"rate_limit_exceeded"}}`), "error.code rate_limit_exceeded", false},
			{"responses failed rate_limit_exceeded", responses(`{"id":"resp_1","object":"response","status":"failed","error":{"code":"rate_limit_exceeded","message":"Rate limit reached"},"output":[]}`), "error.code rate_limit_exceeded", false},
			{"responses error event rate_limit_exceeded", responsesStream(`{"type":"error","code":"rate_limit_exceeded","message":"Rate limit reached","param":null,"sequence_number":1}`), "error.code rate_limit_exceeded", false},
			{"anthropic 429 with details that are no spend limit", response(429, `{"type":"error","error":{"type":"rate_limit_error","details":{"error_code":"output_tokens_per_minute"}}}`), "status 429", false},
			{"messages error event rate_limit_error", messagesStream(`{"type":"error","error":{"type":"rate_limit_error","message":"x"}}`), "error.type rate_limit_error", false},
		},
	},
	{
		"429 with insufficient_quota (and other billing/quota codes)",
		"permanent (quota)", "no", "no", Quota,
		[]policyCase{
			{"insufficient_quota", response(429, `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`), "error.code insufficient_quota", false},
			{"type only", response(429, `{"error":{"message":"x","type":"insufficient_quota","code":null}}`), "error.type insufficient_quota", false},
			{"flat", response(429, `{"type":"insufficient_quota","code":"insufficient_quota","message":"x"}`), "error.code insufficient_quota", false},
			{"billing_hard_limit_reached on 400", response(400, `{"error":{"code":"billing_hard_limit_reached","type":"invalid_request_error"}}`), "error.code billing_hard_limit_reached", false},
			{"billing_not_active", response(429, `{"error":{"code":"billing_not_active","type":"insufficient_quota"}}`), "error.code billing_not_active", false},
			{"truncated after the code", response(429, `{"error":{"message":"You exceeded your current quota, please check your plan","type":"insufficient_quota","param":null,"code":"insufficient_quota","more":"aaaaaaaa`), "error.code insufficient_quota", false},
			{"escaped code", response(429, `{"error":{"code":"insufficient\u005fquota"}}`), "error.code insufficient_quota", false},
			{"array-wrapped", response(429, `[{"error":{"code":"quota_exceeded","status":"RESOURCE_EXHAUSTED"}}]`), "error.code quota_exceeded", false},
			{"stream", stream(`{"choices":[{"delta":{"content":"Hi"}}]}`, `{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}`), "error.code insufficient_quota", false},
			{"responses failed insufficient_quota", responses(`{"status":"failed","error":{"code":"insufficient_quota","message":"x"}}`), "error.code insufficient_quota", false},
		},
	},
	{
		"500",
		"transient, once (server_error)", "one retry only", "yes", ServerError,
		[]policyCase{
			{"500", response(500, `{"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}`), "status 500", false},
			{"500 no body", response(500, ""), "status 500", false},
			{"stream server_error", stream(`{"error":{"message":"The server had an error","type":"server_error"}}`), "error.type server_error", false},
			{"stream unknown error", stream(`{"error":{"message":"?"}}`), "error object", false},
			{"200 with an unknown error object", completion(`{"error":{"message":"?","type":"weird"}}`), "error object", false},
			{"responses failed server_error", responses(`{"id":"resp_1","object":"response","status":"failed","error":{"code":"server_error","message":"The server had an error"},"incomplete_details":null,"output":[]}`), "error.code server_error", false},
			{"responses failed without an error", responses(`{"id":"resp_1","object":"response","status":"failed","error":null,"output":[]}`), "status failed", false},
			{"responses 200 error object", responses(`{"error":{"message":"?","type":"weird"}}`), "error object", false},
			{"responses stream response.failed", responsesStream(`{"type":"response.created","response":{"status":"in_progress"}}`, `{"type":"response.output_text.delta","delta":"Hel"}`, `{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"x"}}}`), "error.code server_error", false},
			{"responses stream error event", responsesStream(`{"type":"error","code":"server_error","message":"x","param":null}`), "error.code server_error", false},
			{"anthropic 500 api_error", response(500, anthropicError("api_error")), "status 500", false},
			{"messages error event api_error", messagesStream(`{"type":"message_start","message":{"content":[]}}`, `{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`), "error.type api_error", false},
			{"messages 200 type error", messages(`{"type":"error"}`), "error object", false},
		},
	},
	{
		"other 5xx (501, 505, ...)",
		"transient, once (server_error)", "one retry only", "yes", ServerError,
		[]policyCase{
			{"501", response(501, ""), "status 501", false},
			{"505", response(505, ""), "status 505", false},
			{"520", response(520, "<html>cloudflare</html>"), "status 520", false},
			{"599", response(599, ""), "status 599", false},
			{"3xx", response(302, ""), "status 302", false},
		},
	},
	{
		"400, 404, 409, 413, 422 and other 4xx",
		"permanent (client_error)", "no", "no", ClientError,
		[]policyCase{
			{"400", response(400, `{"error":{"message":"This model's maximum context length is 8192 tokens","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`), "status 400", false},
			{"404", response(404, `{"error":{"message":"The model does not exist","type":"invalid_request_error","code":"model_not_found"}}`), "status 404", false},
			{"409", response(409, ""), "status 409", false},
			{"413", response(413, "<html>Request Entity Too Large</html>"), "status 413", false},
			{"422", response(422, `{"detail":[{"loc":["body","messages"],"msg":"field required"}]}`), "status 422", false},
			{"418", response(418, ""), "status 418", false},
			{"400 numeric code", response(400, `{"error":{"code":400,"message":"x"}}`), "status 400", false},
			{"400 error is a string", response(400, `{"error":"bad request"}`), "status 400", false},
			{"stream invalid_request_error", stream(`{"error":{"type":"invalid_request_error","code":null}}`), "error.type invalid_request_error", false},
			{"responses error event invalid_request_error", responsesStream(`{"type":"error","error":{"type":"invalid_request_error","code":null,"message":"x"}}`), "error.type invalid_request_error", false},
			{"anthropic 400 invalid_request_error", response(400, anthropicError("invalid_request_error")), "status 400", false},
			{"anthropic 404 not_found_error", response(404, anthropicError("not_found_error")), "status 404", false},
			{"anthropic 413 request_too_large", response(413, anthropicError("request_too_large")), "status 413", false},
			{"messages error event invalid_request_error", messagesStream(`{"type":"error","error":{"type":"invalid_request_error","message":"x"}}`), "error.type invalid_request_error", false},
		},
	},
	{
		"401 (the provider rejects the gateway's key)",
		"permanent (unauthorized)", "no", "yes", Unauthorized,
		[]policyCase{
			{"401", response(401, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`), "status 401", false},
			{"stream authentication_error", stream(`{"type":"error","error":{"type":"authentication_error"}}`), "error.type authentication_error", false},
			{"anthropic 401 authentication_error", response(401, anthropicError("authentication_error")), "status 401", false},
		},
	},
	{
		"403",
		"permanent (auth)", "no", "no", Auth,
		[]policyCase{
			{"403", response(403, `{"error":{"type":"permission_error"}}`), "status 403", false},
			{"anthropic 403 permission_error", response(403, anthropicError("permission_error")), "status 403", false},
			{"messages error event permission_error", messagesStream(`{"type":"error","error":{"type":"permission_error"}}`), "error.type permission_error", false},
		},
	},
	{
		"200 with finish_reason: content_filter, or a 400 whose code is content_filter",
		"content filtered", "no", "no", ContentFilter,
		[]policyCase{
			{"chat", completion(`{"choices":[{"index":0,"message":{"role":"assistant","content":null},"finish_reason":"content_filter"}]}`), "finish_reason content_filter", false},
			{"second choice", completion(`{"choices":[{"index":0,"message":{"content":"ok"},"finish_reason":"stop"},{"index":1,"message":{"content":"par"},"finish_reason":"content_filter"}]}`), "finish_reason content_filter", false},
			{"legacy completion", completion(`{"object":"text_completion","choices":[{"text":"","index":0,"finish_reason":"content_filter"}]}`), "finish_reason content_filter", false},
			{"azure 400", response(400, `{"error":{"message":"The response was filtered","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation"}}}`), "error.code content_filter", false},
			{"content_policy_violation", response(400, `{"error":{"code":"content_policy_violation","type":"invalid_request_error"}}`), "error.code content_policy_violation", false},
			{"stream", stream(`{"choices":[{"delta":{"role":"assistant","content":"I"}}]}`, `{"choices":[{"delta":{},"finish_reason":"content_filter"}]}`, `[DONE]`), "finish_reason content_filter", false},
		},
	},
	{
		"200 whose output is empty (no content, no tool calls, no refusal, in every choice)",
		"empty output", "no", "no", Empty,
		[]policyCase{
			{"no choices", completion(`{"id":"x","choices":[]}`), "empty output", false},
			{"choices absent", completion(`{"id":"x"}`), "empty output", false},
			{"empty content", completion(`{"choices":[{"message":{"role":"assistant","content":"","tool_calls":[],"refusal":null},"finish_reason":"stop"}]}`), "empty output", false},
			{"null content, two choices", completion(`{"choices":[{"message":{"content":null}},{"message":{"content":"  "}}]}`), "empty output", false},
			{"legacy empty text", completion(`{"choices":[{"text":"","finish_reason":"length"}]}`), "empty output", false},
			{"stream of role and usage only", stream(`{"choices":[{"delta":{"role":"assistant","content":""}}]}`, `{"choices":[{"delta":{},"finish_reason":"stop"}]}`, `{"choices":[],"usage":{"total_tokens":9}}`, `[DONE]`), "empty output", false},
		},
	},
	{
		"Responses: status incomplete, incomplete_details.reason content_filter",
		"content filtered", "no", "no", ContentFilter,
		[]policyCase{
			{"json", responses(`{"id":"resp_1","object":"response","status":"incomplete","incomplete_details":{"reason":"content_filter"},"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"I"}]}]}`), "incomplete_details.reason content_filter", false},
			{"json, details first", responses(`{"incomplete_details":{"reason":"content_filter"},"output":[],"status":"incomplete"}`), "incomplete_details.reason content_filter", false},
			{"stream", responsesStream(`{"type":"response.output_text.delta","delta":"I"}`, `{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"content_filter"},"output":[]}}`), "incomplete_details.reason content_filter", false},
		},
	},
	{
		"Responses: completed with no output items, or no output text, refusal or tool call (`*_call` item)",
		"empty output", "no", "no", Empty,
		[]policyCase{
			{"no output items", responses(`{"id":"resp_1","object":"response","status":"completed","output":[]}`), "empty output", false},
			{"empty text", responses(`{"status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"","annotations":[]}]}]}`), "empty output", false},
			{"reasoning only", responses(`{"status":"completed","output":[{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"thinking"}]}]}`), "empty output", false},
			{"stream of no output", responsesStream(`{"type":"response.created","response":{"status":"in_progress","output":[]}}`, `{"type":"response.output_text.delta","delta":""}`, `{"type":"response.completed","response":{"status":"completed","output":[]}}`), "empty output", false},
		},
	},
	{
		"Responses: status incomplete, incomplete_details.reason max_output_tokens",
		"success (`X-Llmgate-Outcome: max_output_tokens`)", "no", "no", Success,
		[]policyCase{
			{"json", responses(`{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"message","content":[{"type":"output_text","text":"The quick"}]}]}`), "incomplete_details.reason max_output_tokens", false},
			{"stream", responsesStream(`{"type":"response.output_text.delta","delta":"The"}`, `{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}`), "incomplete_details.reason max_output_tokens", false},
		},
	},
	{
		"Anthropic: 429 rate_limit_error whose error.details.error_code is a spend limit, or 402 billing_error",
		"permanent (quota)", "no", "no", Quota,
		[]policyCase{
			{"enforced_spend_limit_reached", response(429, `{"type":"error","error":{"type":"rate_limit_error","message":"x","details":{"error_code":"enforced_spend_limit_reached"}}}`), "error.details.error_code enforced_spend_limit_reached", false},
			{"contract_spend_limit_reached", response(429, `{"type":"error","error":{"type":"rate_limit_error","message":"x","details":{"error_code":"contract_spend_limit_reached"}}}`), "error.details.error_code contract_spend_limit_reached", false},
			{"402 billing_error", response(402, anthropicError("billing_error")), "error.type billing_error", false},
			{"402 without a body", response(402, ``), "status 402", false},
			{"messages error event spend limit", messagesStream(`{"type":"error","error":{"type":"rate_limit_error","message":"x","details":{"error_code":"enforced_spend_limit_reached"}}}`), "error.details.error_code enforced_spend_limit_reached", false},
			{"messages error event billing_error", messagesStream(anthropicError("billing_error")), "error.type billing_error", false},
		},
	},
	{
		"Messages: stop_reason refusal",
		"content filtered", "no", "no", ContentFilter,
		[]policyCase{
			{"json", messages(`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"I can"}],"stop_reason":"refusal","stop_sequence":null}`), "stop_reason refusal", false},
			{"json, no content", messages(`{"type":"message","content":[],"stop_reason":"refusal"}`), "stop_reason refusal", false},
			{"stream", messagesRecorded("refusal.sse"), "stop_reason refusal", false},
		},
	},
	{
		"Messages: no content blocks, or only empty text or thinking blocks",
		"empty output", "no", "no", Empty,
		[]policyCase{
			{"no content blocks", messages(`{"id":"msg_1","type":"message","role":"assistant","content":[],"stop_reason":"end_turn"}`), "empty output", false},
			{"only empty text", messages(`{"type":"message","content":[{"type":"text","text":""}],"stop_reason":"end_turn"}`), "empty output", false},
			{"only thinking", messages(`{"type":"message","content":[{"type":"thinking","thinking":"hmm","signature":"Eq"}],"stop_reason":"end_turn"}`), "empty output", false},
			{"stream", messagesRecorded("empty.sse"), "empty output", false},
		},
	},
	{
		"Messages: stop_reason max_tokens",
		"success (`X-Llmgate-Outcome: max_tokens`)", "no", "no", Success,
		[]policyCase{
			{"json", messages(`{"type":"message","content":[{"type":"text","text":"The quick"}],"stop_reason":"max_tokens"}`), "stop_reason max_tokens", false},
			{"stream", messagesStream(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"The"}}`, `{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":1}}`, `{"type":"message_stop"}`), "stop_reason max_tokens", false},
		},
	},
	{
		"client went away / request context cancelled",
		"canceled", "no", "excluded", Canceled,
		[]policyCase{
			{"http canceled", transport(errHTTPCanceled), "canceled", false},
			{"cancel cause", transport(errCanceledCause), "canceled", false},
		},
	},
}

func TestPolicy(t *testing.T) {
	for _, row := range policy {
		t.Run(row.what, func(t *testing.T) {
			c := row.want
			if got, want := c.Retryable(), row.retried != "no"; got != want {
				t.Errorf("%s.Retryable() = %v, the table says %q", c, got, row.retried)
			}
			if got, want := c.MaxAttempts() == 2, row.retried == "one retry only"; got != want {
				t.Errorf("%s.MaxAttempts() = %d, the table says %q", c, c.MaxAttempts(), row.retried)
			}
			if got, want := c.BreakerFailure(), row.breaker == "yes"; got != want {
				t.Errorf("%s.BreakerFailure() = %v, the table says %q", c, got, row.breaker)
			}
			if got, want := c.Excluded(), row.breaker == "excluded"; got != want {
				t.Errorf("%s.Excluded() = %v, the table says %q", c, got, row.breaker)
			}
			for _, tc := range row.cases {
				t.Run(tc.name, func(t *testing.T) {
					o := tc.outcome(t)
					if o.Class != row.want || (tc.reason != "" && o.Reason != tc.reason) || o.Timeout != tc.timeout {
						t.Errorf("got %s %q timeout=%v, want %s %q timeout=%v",
							o.Class, o.Reason, o.Timeout, row.want, tc.reason, tc.timeout)
					}
				})
			}
		})
	}
}

// TestPolicyDoc holds POLICY.md, and the README's copy of its table, to
// the table above, so that neither can drift from what the code does.
func TestPolicyDoc(t *testing.T) {
	for _, file := range []string{"POLICY.md", "../README.md"} {
		t.Run(file, func(t *testing.T) {
			rows := policyTable(t, file)
			if len(rows) != len(policy) {
				t.Errorf("%s has %d rows, the test table %d", file, len(rows), len(policy))
			}
			for i := range min(len(rows), len(policy)) {
				want := []string{policy[i].what, policy[i].class, policy[i].retried, policy[i].breaker}
				if strings.Join(rows[i], " | ") != strings.Join(want, " | ") {
					t.Errorf("%s row %d:\n got  %q\n want %q", file, i+1, rows[i], want)
				}
			}
		})
	}
}

// policyTable returns the rows of the first table in file whose header's
// first cell is "what happened".
func policyTable(t *testing.T, file string) [][]string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows [][]string
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "|---"):
			continue
		case !strings.HasPrefix(line, "| "):
			if found {
				return rows
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		switch {
		case found:
			rows = append(rows, cells)
		case cells[0] == "what happened":
			found = true
		}
	}
	if !found {
		t.Fatalf("%s: no table with a %q header", file, "what happened")
	}
	return rows
}

func TestFromErrorNil(t *testing.T) {
	if o := FromError(nil); o.Class != Success {
		t.Errorf("FromError(nil) = %+v", o)
	}
}

func TestTransportStatusIsZero(t *testing.T) {
	for _, err := range []error{errDNSNotFound(t), errBrokenPipe(t), errUnknown(t)} {
		if o := FromError(err); o.Status != 0 || o.HasRetryAfter {
			t.Errorf("FromError(%v) = %+v", err, o)
		}
	}
}

func TestFromResponseSuccess(t *testing.T) {
	h := http.Header{"Retry-After": {"5"}, "X-Ratelimit-Reset-Requests": {"1s"}}
	for _, status := range []int{200, 201, 204} {
		// The body is not looked at: even an error object or garbage.
		o := FromResponse(status, h, []byte(`{"error":{"code":"insufficient_quota"}`), now)
		if o.Class != Success || o.Status != status || o.HasRetryAfter {
			t.Errorf("FromResponse(%d) = %+v", status, o)
		}
	}
}

func TestFromResponseRetryAfter(t *testing.T) {
	reset := http.Header{"X-Ratelimit-Reset-Requests": {"1s"}, "X-Ratelimit-Reset-Tokens": {"6m0s"}}
	tests := []struct {
		name   string
		status int
		h      http.Header
		body   string
		want   time.Duration
		has    bool
	}{
		{"429 delta seconds", 429, http.Header{"Retry-After": {"20"}}, "", 20 * time.Second, true},
		{"429 http-date", 429, http.Header{"Retry-After": {now.Add(7 * time.Second).Format(http.TimeFormat)}}, "", 7 * time.Second, true},
		{"429 retry-after-ms", 429, http.Header{"Retry-After-Ms": {"350"}}, "", 350 * time.Millisecond, true},
		{"429 x-ratelimit-reset, the larger", 429, reset, "", 6 * time.Minute, true},
		{"429 nothing", 429, nil, "", 0, false},
		{"503 retry-after", 503, http.Header{"Retry-After": {"3"}}, "", 3 * time.Second, true},
		// OpenAI sends x-ratelimit-reset-* on every response; they only
		// mean "wait" on a 429.
		{"503 x-ratelimit-reset ignored", 503, reset, "", 0, false},
		{"500 retry-after-ms", 500, http.Header{"Retry-After-Ms": {"10"}}, "", 10 * time.Millisecond, true},
		{"quota keeps its retry-after", 429, http.Header{"Retry-After": {"60"}}, `{"error":{"code":"insufficient_quota"}}`, time.Minute, true},
		{"content filter drops it", 400, http.Header{"Retry-After": {"60"}}, `{"error":{"code":"content_filter"}}`, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := FromResponse(tt.status, tt.h, []byte(tt.body), now)
			if o.RetryAfter != tt.want || o.HasRetryAfter != tt.has || o.Status != tt.status {
				t.Errorf("got %+v, want RetryAfter=%v HasRetryAfter=%v", o, tt.want, tt.has)
			}
		})
	}
}

func TestFromCompletionSuccess(t *testing.T) {
	tests := []struct{ name, body string }{
		{"content", `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!","refusal":null},"finish_reason":"stop"}],"usage":{"total_tokens":12}}`},
		{"tool calls only", `{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`},
		{"function call only", `{"choices":[{"message":{"content":null,"function_call":{"name":"f","arguments":"{}"}},"finish_reason":"function_call"}]}`},
		{"refusal only", `{"choices":[{"message":{"content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}]}`},
		{"audio only", `{"choices":[{"message":{"content":null,"audio":{"id":"audio_1","data":"AAAA","transcript":"hi"}}}]}`},
		{"one of two choices", `{"choices":[{"message":{"content":""}},{"message":{"content":"x"}}]}`},
		{"legacy text", `{"object":"text_completion","choices":[{"text":"Once upon","index":0,"finish_reason":"length"}]}`},
		{"content parts", `{"choices":[{"message":{"content":[{"type":"text","text":"hi"}]}}]}`},
		{"leading whitespace", " \n{\"choices\":[{\"message\":{\"content\":\"x\"}}]}\n"},
		{"choices with an error object too", `{"choices":[{"message":{"content":"x"}}],"error":{"type":"server_error"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if o := FromCompletion([]byte(tt.body)); o.Class != Success {
				t.Errorf("got %+v, want success", o)
			}
		})
	}
}

func TestStreamObserver(t *testing.T) {
	chunk := func(delta string) string {
		return `{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}]}`
	}
	tests := []struct {
		name   string
		events []string
		want   Class
		done   bool
	}{
		{"content", []string{chunk(`{"role":"assistant","content":""}`), chunk(`{"content":"Hel"}`), chunk(`{"content":"lo"}`), `{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, "[DONE]"}, Success, true},
		{"tool call deltas", []string{chunk(`{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}`), "[DONE]"}, Success, true},
		{"refusal delta", []string{chunk(`{"refusal":"no"}`)}, Success, false},
		{"legacy text", []string{`{"object":"text_completion","choices":[{"text":"Once","index":0,"finish_reason":null}]}`, "[DONE]"}, Success, true},
		{"done with spaces", []string{chunk(`{"content":"x"}`), " [DONE]\n"}, Success, true},
		{"empty payloads ignored", []string{"", "  ", chunk(`{"content":"x"}`)}, Success, false},
		{"nothing at all", nil, Empty, false},
		{"only done", []string{"[DONE]"}, Empty, true},
		// Later chunks decode into the same choices; what was seen stays seen.
		{"content then empty chunks", []string{chunk(`{"content":"x"}`), chunk(`{}`), chunk(`{}`)}, Success, false},
		{"filter after content", []string{chunk(`{"content":"x"}`), `{"choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]}`}, ContentFilter, false},
		{"error after content", []string{chunk(`{"content":"x"}`), `{"error":{"type":"server_error","message":"boom"}}`}, ServerError, false},
		{"first error wins", []string{`{"error":{"code":"insufficient_quota"}}`, `{"error":{"type":"server_error"}}`}, Quota, false},
		{"error as a string is not an error object", []string{chunk(`{"content":"x"}`), `{"error":"x","choices":[]}`}, Success, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o StreamObserver
			for _, e := range tt.events {
				o.Observe([]byte(e))
			}
			if got := o.Outcome(); got.Class != tt.want {
				t.Errorf("Outcome() = %+v, want %s", got, tt.want)
			}
			if o.SawDone() != tt.done {
				t.Errorf("SawDone() = %v, want %v", o.SawDone(), tt.done)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	h := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	tests := []struct {
		name string
		h    http.Header
		want time.Duration
		ok   bool
	}{
		{"delta seconds", h("Retry-After", "30"), 30 * time.Second, true},
		{"zero", h("Retry-After", "0"), 0, true},
		{"decimal", h("Retry-After", "1.5"), 1500 * time.Millisecond, true},
		{"spaces", h("Retry-After", " 7 "), 7 * time.Second, true},
		{"http-date", h("Retry-After", now.Add(90*time.Second).Format(http.TimeFormat)), 90 * time.Second, true},
		{"rfc850 date", h("Retry-After", now.Add(2*time.Minute).Format(time.RFC850)), 2 * time.Minute, true},
		{"past date", h("Retry-After", now.Add(-time.Hour).Format(http.TimeFormat)), 0, true},
		{"far date capped", h("Retry-After", now.AddDate(1, 0, 0).Format(http.TimeFormat)), 24 * time.Hour, true},
		{"huge delta capped", h("Retry-After", "99999999999999999999999"), 24 * time.Hour, true},
		{"negative ignored", h("Retry-After", "-5"), 0, false},
		{"garbage ignored", h("Retry-After", "soon"), 0, false},
		{"exponent ignored", h("Retry-After", "1e3"), 0, false},
		{"Inf ignored", h("Retry-After", "Inf"), 0, false},
		{"NaN ignored", h("Retry-After", "NaN"), 0, false},
		{"hex ignored", h("Retry-After", "0x10"), 0, false},
		{"two dots ignored", h("Retry-After", "1.2.3"), 0, false},
		{"retry-after-ms", h("Retry-After-Ms", "1500"), 1500 * time.Millisecond, true},
		{"retry-after-ms decimal", h("Retry-After-Ms", "20.5"), 20500 * time.Microsecond, true},
		{"retry-after wins over ms", h("Retry-After", "2", "Retry-After-Ms", "1500"), 2 * time.Second, true},
		{"garbage falls through to ms", h("Retry-After", "soon", "Retry-After-Ms", "250"), 250 * time.Millisecond, true},
		{"ms wins over reset", h("Retry-After-Ms", "5", "X-Ratelimit-Reset-Requests", "1s"), 5 * time.Millisecond, true},
		{"reset requests 1s", h("X-Ratelimit-Reset-Requests", "1s"), time.Second, true},
		{"reset tokens 6m0s", h("X-Ratelimit-Reset-Tokens", "6m0s"), 6 * time.Minute, true},
		{"reset 20ms", h("X-Ratelimit-Reset-Requests", "20ms"), 20 * time.Millisecond, true},
		{"reset 0.5s", h("X-Ratelimit-Reset-Tokens", "0.5s"), 500 * time.Millisecond, true},
		{"reset larger of both", h("X-Ratelimit-Reset-Requests", "20ms", "X-Ratelimit-Reset-Tokens", "1m30.5s"), 90500 * time.Millisecond, true},
		{"reset bare seconds", h("X-Ratelimit-Reset-Requests", "2"), 2 * time.Second, true},
		{"reset negative ignored", h("X-Ratelimit-Reset-Requests", "-1s", "X-Ratelimit-Reset-Tokens", "1s"), time.Second, true},
		{"reset garbage ignored", h("X-Ratelimit-Reset-Requests", "later"), 0, false},
		{"reset capped", h("X-Ratelimit-Reset-Tokens", "48h"), 24 * time.Hour, true},
		{"nil header", nil, 0, false},
		{"empty values", h("Retry-After", "", "Retry-After-Ms", ""), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, ok := ParseRetryAfter(tt.h, now)
			if d != tt.want || ok != tt.ok {
				t.Errorf("ParseRetryAfter = %v, %v; want %v, %v", d, ok, tt.want, tt.ok)
			}
		})
	}
}
