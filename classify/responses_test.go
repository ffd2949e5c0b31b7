package classify

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// respCompleted is a typical OpenAI Responses answer.
const respCompleted = `{"id":"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b","object":"response","created_at":1741476542,"status":"completed","error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"model":"gpt-4.1-2025-04-14","output":[{"type":"message","id":"msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b","status":"completed","role":"assistant","content":[{"type":"output_text","text":"In a peaceful grove beneath a silver moon, a unicorn named Lumina discovered a hidden pool that reflected the stars.","annotations":[]}]}],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123},"user":null,"metadata":{}}`

func TestFromResponsesOutput(t *testing.T) {
	tests := []struct {
		name, body string
		want       Class
		note       string
	}{
		{"completed text", respCompleted, Success, ""},
		{"function call", `{"status":"completed","output":[{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{}"}]}`, Success, ""},
		{"web search call", `{"status":"completed","output":[{"type":"web_search_call","id":"ws_1","status":"completed"}]}`, Success, ""},
		{"escaped call type", `{"status":"completed","output":[{"type":"file\u005fsearch_call","id":"fs_1"}]}`, Success, ""},
		{"type after content", `{"status":"completed","output":[{"content":[{"type":"output_text","text":"hi"}],"type":"message"}]}`, Success, ""},
		{"refusal", `{"status":"completed","output":[{"type":"message","content":[{"type":"refusal","refusal":"I can't help with that."}]}]}`, Success, ""},
		{"reasoning then text", `{"status":"completed","output":[{"type":"reasoning","summary":[]},{"type":"message","content":[{"type":"output_text","text":"42"}]}]}`, Success, ""},
		{"a type named _call alone", `{"status":"completed","output":[{"type":"_call"}]}`, Empty, ""},
		{"background queued", `{"id":"resp_bg","object":"response","status":"queued","background":true,"output":[]}`, Success, ""},
		{"background in_progress", `{"id":"resp_bg","object":"response","status":"in_progress","background":true,"output":[]}`, Success, ""},
		{"max_output_tokens without text", `{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"reasoning","summary":[]}]}`, Success, NoteMaxOutputTokens},
		{"incomplete, other reason, with text", `{"status":"incomplete","incomplete_details":{"reason":"other"},"output":[{"type":"message","content":[{"type":"output_text","text":"x"}]}]}`, Success, ""},
		{"failed invalid_prompt, whatever the message says", `{"status":"failed","error":{"code":"invalid_prompt","message":"content_filter quota server_error"}}`, ClientError, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := FromResponses([]byte(tc.body), nil, now)
			if o.Class != tc.want || o.Note != tc.note {
				t.Errorf("FromResponses = %+v, want %s note %q", o, tc.want, tc.note)
			}
			checkOutcome(t, o)
		})
	}
}

func TestOutcomeHeader(t *testing.T) {
	tests := []struct {
		o    Outcome
		want string
	}{
		{Outcome{Class: Success}, ""},
		{Outcome{Class: Success, Note: NoteMaxOutputTokens}, "max_output_tokens"},
		{Outcome{Class: ContentFilter}, "content_filter"},
		{Outcome{Class: Empty}, "empty_output"},
	}
	for _, tc := range tests {
		if got := tc.o.Header(); got != tc.want {
			t.Errorf("%+v.Header() = %q, want %q", tc.o, got, tc.want)
		}
	}
}

func TestFromResponsesUsage(t *testing.T) {
	o := FromResponses([]byte(respCompleted), nil, now)
	if o.Usage != (Tokens{In: 36, Out: 87, Reported: true}) {
		t.Errorf("usage = %+v", o.Usage)
	}
	// Usage reads it too (a replay counts saved tokens with it).
	if u := Usage([]byte(respCompleted)); u != o.Usage {
		t.Errorf("Usage = %+v, FromResponses %+v", u, o.Usage)
	}
}

func TestFromResponsesRetryAfter(t *testing.T) {
	h := http.Header{"X-Ratelimit-Reset-Requests": {"2s"}, "Retry-After": {"7"}}
	reset := http.Header{"X-Ratelimit-Reset-Tokens": {"3s"}}
	tests := []struct {
		name, body string
		h          http.Header
		want       time.Duration
		has        bool
	}{
		{"rate limited, Retry-After", `{"status":"failed","error":{"code":"rate_limit_exceeded"}}`, h, 7 * time.Second, true},
		{"rate limited, reset header", `{"status":"failed","error":{"code":"rate_limit_exceeded"}}`, reset, 3 * time.Second, true},
		{"server error ignores reset headers", `{"status":"failed","error":{"code":"server_error"}}`, reset, 0, false},
		{"success has none", respCompleted, h, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := FromResponses([]byte(tc.body), tc.h, now)
			if o.RetryAfter != tc.want || o.HasRetryAfter != tc.has {
				t.Errorf("FromResponses = %+v, want RetryAfter %v (%v)", o, tc.want, tc.has)
			}
		})
	}
}

// responsesEvents is a real-shaped stream, data payloads only.
var responsesEvents = []string{
	`{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}`,
	`{"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}`,
	`{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}`,
	`{"type":"response.content_part.added","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}`,
	`{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}`,
	`{"type":"response.output_text.done","sequence_number":5,"item_id":"msg_1","output_index":0,"content_index":0,"text":"Hi"}`,
	`{"type":"response.completed","sequence_number":6,"response":{"id":"resp_1","object":"response","status":"completed","output":[{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}]}],"usage":{"input_tokens":5,"output_tokens":1,"total_tokens":6}}}`,
}

func TestResponsesObserverStates(t *testing.T) {
	var o ResponsesObserver
	for i, e := range responsesEvents {
		o.Observe([]byte(e))
		last := i == len(responsesEvents)-1
		if o.Finished() != last || o.Ended() != last || o.SawError() {
			t.Fatalf("after event %d: finished=%v ended=%v error=%v", i, o.Finished(), o.Ended(), o.SawError())
		}
	}
	out := o.Outcome()
	if out.Class != Success || out.Usage != (Tokens{In: 5, Out: 1, Reported: true}) {
		t.Errorf("Outcome = %+v", out)
	}
}

func TestResponsesObserverFailedIsNotFinished(t *testing.T) {
	var o ResponsesObserver
	o.Observe([]byte(responsesEvents[4]))
	o.Observe([]byte(`{"type":"response.failed","response":{"status":"failed","error":{"code":"rate_limit_exceeded"},"usage":{"input_tokens":5,"output_tokens":0}}}`))
	if o.Finished() || !o.Ended() || !o.SawError() {
		t.Errorf("finished=%v ended=%v error=%v; want a failed end", o.Finished(), o.Ended(), o.SawError())
	}
	if out := o.Outcome(); out.Class != RateLimited || !out.Usage.Reported {
		t.Errorf("Outcome = %+v", out)
	}
}

func TestResponsesObserverFunctionCallStream(t *testing.T) {
	var o ResponsesObserver
	o.Observe([]byte(`{"type":"response.output_item.added","item":{"type":"function_call","id":"fc_1","name":"f","arguments":""}}`))
	o.Observe([]byte(`{"type":"response.function_call_arguments.delta","delta":"{}"}`))
	if out := o.Outcome(); out.Class != Success {
		t.Errorf("a function call stream before its end = %+v", out)
	}
	// Reasoning deltas are not output.
	var r ResponsesObserver
	r.Observe([]byte(`{"type":"response.reasoning_summary_text.delta","delta":"thinking"}`))
	if out := r.Outcome(); out.Class != Empty {
		t.Errorf("reasoning only = %+v", out)
	}
}

func TestResponsesPreamble(t *testing.T) {
	for i, e := range responsesEvents {
		if got, want := ResponsesPreamble([]byte(e)), i < 2; got != want {
			t.Errorf("ResponsesPreamble(event %d) = %v", i, got)
		}
	}
	for _, e := range []string{`{"type":"response.queued"}`, `{"sequence_number":0,"type":"response.created"}`} {
		if !ResponsesPreamble([]byte(e)) {
			t.Errorf("ResponsesPreamble(%s) = false", e)
		}
	}
	for _, e := range []string{`{"type":"error","code":"server_error"}`, `not json`, ``, `{"type":"response.failed"}`} {
		if ResponsesPreamble([]byte(e)) {
			t.Errorf("ResponsesPreamble(%s) = true", e)
		}
	}
}

func FuzzResponsesObserver(f *testing.F) {
	f.Add(strings.Join(responsesEvents, "\n"))
	f.Add(`{"type":"error","error":{"code":429}}` + "\n" + `{"type":"response.incomplete","response":{"incomplete_details":{"reason":"content_filter"}}}`)
	f.Fuzz(func(t *testing.T, events string) {
		var o ResponsesObserver
		for _, e := range strings.Split(events, "\n") {
			o.Observe([]byte(e))
			ResponsesPreamble([]byte(e))
		}
		checkOutcome(t, o.Outcome())
		checkOutcome(t, FromResponses([]byte(events), nil, now))
	})
}

func BenchmarkFromResponses(b *testing.B) {
	body := []byte(respCompleted)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if o := FromResponses(body, nil, now); o.Class != Success {
			b.Fatal(o)
		}
	}
}

func BenchmarkResponsesObserver(b *testing.B) {
	delta := []byte(responsesEvents[4])
	b.ReportAllocs()
	b.SetBytes(int64(len(delta)))
	var o ResponsesObserver
	for b.Loop() {
		o.Observe(delta)
	}
	if o.Outcome().Class != Success {
		b.Fatal(o.Outcome())
	}
}

// BenchmarkResponsesObserverStream observes a whole short stream, from
// response.created to response.completed (with its output and usage).
func BenchmarkResponsesObserverStream(b *testing.B) {
	events := make([][]byte, len(responsesEvents))
	size := 0
	for i, e := range responsesEvents {
		events[i] = []byte(e)
		size += len(e)
	}
	b.ReportAllocs()
	b.SetBytes(int64(size))
	for b.Loop() {
		var o ResponsesObserver
		for _, e := range events {
			o.Observe(e)
		}
		if !o.Finished() {
			b.Fatal(o.Outcome())
		}
	}
}
