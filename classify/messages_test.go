package classify

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// msgText is a typical Messages answer.
const msgText = `{"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Hi! My name is Claude."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":1800,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":503,"service_tier":"standard"}}`

// recordedEvents reads the data payloads of a recorded SSE stream in
// testdata/messages, one per event.
func recordedEvents(t testing.TB, name string) [][]byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "messages", name))
	if err != nil {
		t.Fatal(err)
	}
	var events [][]byte
	for ev := range bytes.SplitSeq(raw, []byte("\n\n")) {
		for line := range bytes.SplitSeq(ev, []byte("\n")) {
			if data, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
				events = append(events, data)
			}
		}
	}
	return events
}

func messages(body string) func(*testing.T) Outcome {
	return func(*testing.T) Outcome { return FromMessages([]byte(body), nil, now) }
}

func messagesStream(events ...string) func(*testing.T) Outcome {
	return func(*testing.T) Outcome {
		var o MessagesObserver
		for _, e := range events {
			o.Observe([]byte(e))
		}
		return o.Outcome()
	}
}

func messagesRecorded(name string) func(*testing.T) Outcome {
	return func(t *testing.T) Outcome {
		var o MessagesObserver
		for _, e := range recordedEvents(t, name) {
			o.Observe(e)
		}
		return o.Outcome()
	}
}

// anthropicError is Anthropic's error body for an error of type typ.
func anthropicError(typ string) string {
	return `{"type":"error","error":{"type":"` + typ + `","message":"quota billing overloaded refusal: the words do not matter"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}`
}

func TestFromMessagesOutput(t *testing.T) {
	tests := []struct {
		name, body string
		want       Class
		reason     string
		note       string
	}{
		{"end_turn text", msgText, Success, "output", ""},
		{"tool_use", `{"type":"message","content":[{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{"location":"SF"}}],"stop_reason":"tool_use"}`, Success, "output", ""},
		{"thinking then text", `{"type":"message","content":[{"type":"thinking","thinking":"hmm","signature":"Eq"},{"type":"text","text":"42"}],"stop_reason":"end_turn"}`, Success, "output", ""},
		{"pause_turn with a server tool", `{"type":"message","content":[{"type":"server_tool_use","id":"srvtoolu_01","name":"web_search","input":{"query":"x"}}],"stop_reason":"pause_turn"}`, Success, "output", ""},
		{"web search result block", `{"type":"message","content":[{"type":"web_search_tool_result","tool_use_id":"srvtoolu_01","content":[]}],"stop_reason":"end_turn"}`, Success, "output", ""},
		{"stop_sequence", `{"type":"message","content":[{"type":"text","text":"A, B"}],"stop_reason":"stop_sequence","stop_sequence":", C"}`, Success, "output", ""},
		{"model_context_window_exceeded", `{"type":"message","content":[{"type":"text","text":"The long"}],"stop_reason":"model_context_window_exceeded"}`, Success, "output", ""},
		{"unknown stop_reason", `{"type":"message","content":[{"type":"text","text":"x"}],"stop_reason":"a_new_reason"}`, Success, "output", ""},
		{"type after text", `{"type":"message","content":[{"text":"hi","type":"text"}],"stop_reason":"end_turn"}`, Success, "output", ""},
		{"max_tokens", `{"type":"message","content":[{"type":"text","text":"The quick"}],"stop_reason":"max_tokens"}`, Success, "stop_reason max_tokens", NoteMaxTokens},
		{"max_tokens in thinking", `{"type":"message","content":[{"type":"thinking","thinking":"long","signature":""}],"stop_reason":"max_tokens"}`, Success, "stop_reason max_tokens", NoteMaxTokens},
		{"refusal with partial text", `{"type":"message","content":[{"type":"text","text":"I can"}],"stop_reason":"refusal"}`, ContentFilter, "stop_reason refusal", ""},
		{"refusal, reason first", `{"stop_reason":"refusal","content":[],"type":"message"}`, ContentFilter, "stop_reason refusal", ""},
		{"no content blocks", `{"type":"message","content":[],"stop_reason":"end_turn"}`, Empty, "empty output", ""},
		{"only empty text", `{"type":"message","content":[{"type":"text","text":""},{"type":"text","text":"  "}],"stop_reason":"end_turn"}`, Empty, "empty output", ""},
		{"only thinking", `{"type":"message","content":[{"type":"thinking","thinking":"hmm","signature":"Eq"},{"type":"redacted_thinking","data":"EmwK"}],"stop_reason":"end_turn"}`, Empty, "empty output", ""},
		{"a block without a type", `{"type":"message","content":[{"text":"x"}],"stop_reason":"end_turn"}`, Empty, "empty output", ""},
		{"content absent", `{"type":"message","stop_reason":"end_turn"}`, Empty, "empty output", ""},
		{"truncated", `{"type":"message","content":[{"type":"text","text":"Hel`, Transient, "malformed message body", ""},
		{"html", `<html>502 Bad Gateway</html>`, Transient, "malformed message body", ""},
		{"empty body", ``, Transient, "malformed message body", ""},
		{"200 overloaded_error", anthropicError("overloaded_error"), Transient, "error.type overloaded_error", ""},
		{"200 spend limit", `{"type":"error","error":{"type":"rate_limit_error","details":{"error_code":"enforced_spend_limit_reached"}}}`, Quota, "error.details.error_code enforced_spend_limit_reached", ""},
		{"200 type error without an object", `{"type":"error"}`, ServerError, "error object", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := FromMessages([]byte(tc.body), nil, now)
			if o.Class != tc.want || o.Reason != tc.reason || o.Note != tc.note {
				t.Errorf("FromMessages = %+v, want %s %q note %q", o, tc.want, tc.reason, tc.note)
			}
			checkOutcome(t, o)
		})
	}
}

func TestMessagesOutcomeHeader(t *testing.T) {
	for body, want := range map[string]string{
		`{"type":"message","content":[{"type":"text","text":"I"}],"stop_reason":"refusal"}`:      "content_filter",
		`{"type":"message","content":[],"stop_reason":"end_turn"}`:                               "empty_output",
		`{"type":"message","content":[{"type":"text","text":"The"}],"stop_reason":"max_tokens"}`: "max_tokens",
		msgText: "",
	} {
		if got := FromMessages([]byte(body), nil, now).Header(); got != want {
			t.Errorf("FromMessages(%s).Header() = %q, want %q", body, got, want)
		}
	}
}

func TestFromMessagesUsage(t *testing.T) {
	o := FromMessages([]byte(msgText), nil, now)
	want := Tokens{In: 2095, Out: 503, Reported: true, CacheCreation: 0, CacheRead: 1800}
	if o.Usage != want {
		t.Errorf("usage = %+v, want %+v", o.Usage, want)
	}
	// Usage reads it too (a replay counts saved tokens with it).
	if u := Usage([]byte(msgText)); u != want {
		t.Errorf("Usage = %+v, want %+v", u, want)
	}
}

func TestFromMessagesRetryAfter(t *testing.T) {
	h := http.Header{"Retry-After": {"7"}}
	if o := FromMessages([]byte(anthropicError("overloaded_error")), h, now); !o.HasRetryAfter || o.RetryAfter != 7*time.Second {
		t.Errorf("overloaded: %+v, want Retry-After 7s", o)
	}
	if o := FromMessages([]byte(msgText), h, now); o.HasRetryAfter {
		t.Errorf("a success has no wait: %+v", o)
	}
}

// Anthropic's errors, with the statuses it sends them with: each is
// classified by its status (and, for a spend limit or billing, its type
// or error.details.error_code), never by its message.
func TestAnthropicErrors(t *testing.T) {
	spend := func(code string) string {
		return `{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your monthly spend limit.","details":{"error_code":"` + code + `"}}}`
	}
	tests := []struct {
		name   string
		status int
		body   string
		want   Class
		reason string
	}{
		{"overloaded_error", 529, anthropicError("overloaded_error"), Transient, "status 529"},
		{"api_error", 500, anthropicError("api_error"), ServerError, "status 500"},
		{"timeout_error", 504, anthropicError("timeout_error"), Transient, "status 504"},
		{"rate_limit_error", 429, anthropicError("rate_limit_error"), RateLimited, "status 429"},
		{"rate_limit_error, other details", 429, spend("requests_per_minute"), RateLimited, "status 429"},
		{"enforced_spend_limit_reached", 429, spend("enforced_spend_limit_reached"), Quota, "error.details.error_code enforced_spend_limit_reached"},
		{"contract_spend_limit_reached", 429, spend("contract_spend_limit_reached"), Quota, "error.details.error_code contract_spend_limit_reached"},
		{"linked_organization_spend_limit_reached", 429, spend("linked_organization_spend_limit_reached"), Quota, "error.details.error_code linked_organization_spend_limit_reached"},
		{"ramp_limit_exceeded is a rate limit", 429, spend("ramp_limit_exceeded"), RateLimited, "status 429"},
		{"details before type", 429, `{"type":"error","error":{"details":{"error_code":"contract_spend_limit_reached"},"type":"rate_limit_error"}}`, Quota, "error.details.error_code contract_spend_limit_reached"},
		{"spend limit, cut after details", 429, `{"type":"error","error":{"type":"rate_limit_error","details":{"error_code":"enforced_spend_limit_reached"},"message":"You have rea`, Quota, "error.details.error_code enforced_spend_limit_reached"},
		{"google details are an array, not Anthropic's", 429, `{"error":{"code":429,"message":"x","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","error_code":"enforced_spend_limit_reached"}]}}`, RateLimited, "status 429"},
		{"details not an object", 429, `{"type":"error","error":{"type":"rate_limit_error","details":"enforced_spend_limit_reached"}}`, RateLimited, "status 429"},
		{"invalid_request_error", 400, anthropicError("invalid_request_error"), ClientError, "status 400"},
		{"authentication_error", 401, anthropicError("authentication_error"), Unauthorized, "status 401"},
		{"billing_error", 402, anthropicError("billing_error"), Quota, "error.type billing_error"},
		{"402 without a body", 402, ``, Quota, "status 402"},
		{"permission_error", 403, anthropicError("permission_error"), Auth, "status 403"},
		{"not_found_error", 404, anthropicError("not_found_error"), ClientError, "status 404"},
		{"request_too_large", 413, anthropicError("request_too_large"), ClientError, "status 413"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := FromResponse(tc.status, nil, []byte(tc.body), now)
			if o.Class != tc.want || o.Reason != tc.reason || o.Status != tc.status {
				t.Errorf("FromResponse(%d) = %+v, want %s %q", tc.status, o, tc.want, tc.reason)
			}
			// The same error as a stream's error event has no status: its
			// type decides (a 529 and a 504 are transient either way; the
			// statuses in between are the type's own class).
			var obs MessagesObserver
			obs.Observe([]byte(tc.body))
			if tc.body == "" || strings.HasPrefix(tc.name, "spend limit, cut") || strings.HasPrefix(tc.name, "google") {
				return
			}
			if got := obs.Outcome(); got.Class != tc.want || !obs.SawError() || !obs.Ended() {
				t.Errorf("as an error event: %+v (error %v, ended %v), want %s", got, obs.SawError(), obs.Ended(), tc.want)
			}
		})
	}
}

// Anthropic's anthropic-ratelimit-*-reset headers are times at which a
// limit is wholly replenished, not waits: a 429 is retried after its
// retry-after, or after backoff when there is none, never at those times.
func TestAnthropicRateLimitResetIsNoWait(t *testing.T) {
	reset := now.Add(30 * time.Minute).Format(time.RFC3339)
	h := http.Header{
		"Anthropic-Ratelimit-Requests-Reset":       {reset},
		"Anthropic-Ratelimit-Tokens-Reset":         {reset},
		"Anthropic-Ratelimit-Input-Tokens-Reset":   {reset},
		"Anthropic-Ratelimit-Output-Tokens-Reset":  {reset},
		"Anthropic-Ratelimit-Requests-Remaining":   {"0"},
		"Anthropic-Ratelimit-Unified-Reset":        {"1741965566"},
		"Anthropic-Ratelimit-Unified-5h-Reset":     {"1741965566"},
		"Anthropic-Ratelimit-Unified-Fallback-Pct": {"0.5"},
	}
	o := FromResponse(429, h, []byte(anthropicError("rate_limit_error")), now)
	if o.Class != RateLimited || o.HasRetryAfter {
		t.Errorf("429 with only anthropic-ratelimit-* headers = %+v, want rate_limited without a wait", o)
	}
	h.Set("Retry-After", "1")
	o = FromResponse(429, h, []byte(anthropicError("rate_limit_error")), now)
	if !o.HasRetryAfter || o.RetryAfter != time.Second {
		t.Errorf("429 with retry-after: 1 = %+v, want a 1s wait", o)
	}
	o = FromResponse(529, http.Header{"Retry-After": {"3"}, "Anthropic-Ratelimit-Requests-Reset": {reset}}, []byte(anthropicError("overloaded_error")), now)
	if !o.HasRetryAfter || o.RetryAfter != 3*time.Second {
		t.Errorf("529 with retry-after: 3 = %+v, want a 3s wait", o)
	}
}

// The recorded streams: where the held tail starts, when the stream has
// ended, and what it came to.
func TestMessagesObserverRecorded(t *testing.T) {
	tests := []struct {
		file     string
		want     Class
		reason   string
		tailAt   int // the index of the event from which Finished holds; -1: never
		endedAt  int // the index of the event at which Ended first holds
		sawError bool
		usage    Tokens
	}{
		{"thinking_tool_text.sse", Success, "output", 16, 17, false, Tokens{In: 472, Out: 89, Reported: true, CacheCreation: 1536, CacheRead: 2048}},
		{"error_after_two_deltas.sse", Transient, "error.type overloaded_error", -1, 5, true, Tokens{In: 25, Out: 1, Reported: true}},
		{"refusal.sse", ContentFilter, "stop_reason refusal", 4, 5, false, Tokens{In: 31, Out: 3, Reported: true}},
		{"empty.sse", Empty, "empty output", 5, 6, false, Tokens{In: 12, Out: 2, Reported: true}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			var o MessagesObserver
			tailAt, endedAt := -1, -1
			for i, ev := range recordedEvents(t, tc.file) {
				if o.Ended() {
					t.Fatalf("event %d after the end", i)
				}
				o.Observe(ev)
				if o.Finished() && tailAt < 0 {
					tailAt = i
				}
				if o.Ended() && endedAt < 0 {
					endedAt = i
				}
			}
			got := o.Outcome()
			if got.Class != tc.want || got.Reason != tc.reason {
				t.Errorf("Outcome = %+v, want %s %q", got, tc.want, tc.reason)
			}
			if tailAt != tc.tailAt || endedAt != tc.endedAt || o.SawError() != tc.sawError {
				t.Errorf("tail from event %d, ended at %d, error %v; want %d, %d, %v", tailAt, endedAt, o.SawError(), tc.tailAt, tc.endedAt, tc.sawError)
			}
			if got.Usage != tc.usage || o.Usage() != tc.usage {
				t.Errorf("usage %+v (Usage() %+v), want %+v", got.Usage, o.Usage(), tc.usage)
			}
		})
	}
}

func TestMessagesObserverUsage(t *testing.T) {
	start := `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"stop_reason":null,"usage":{"input_tokens":100,"cache_creation_input_tokens":20,"cache_read_input_tokens":30,"output_tokens":1}}}`
	delta := func(usage string) string {
		return `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":` + usage + `}`
	}
	text := `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`
	tests := []struct {
		name   string
		events []string
		want   Tokens
	}{
		{"start, then the delta's output", []string{start, text, delta(`{"output_tokens":15}`)}, Tokens{In: 100, Out: 15, Reported: true, CacheCreation: 20, CacheRead: 30}},
		{"cumulative: the last delta counts, never a sum", []string{start, delta(`{"output_tokens":5}`), delta(`{"output_tokens":15}`)}, Tokens{In: 100, Out: 15, Reported: true, CacheCreation: 20, CacheRead: 30}},
		{"cumulative input and cache replace the start's", []string{start, delta(`{"input_tokens":180,"cache_creation_input_tokens":20,"cache_read_input_tokens":90,"output_tokens":40}`)}, Tokens{In: 180, Out: 40, Reported: true, CacheCreation: 20, CacheRead: 90}},
		{"null cache counts keep the start's", []string{start, delta(`{"input_tokens":null,"cache_creation_input_tokens":null,"cache_read_input_tokens":null,"output_tokens":7}`)}, Tokens{In: 100, Out: 7, Reported: true, CacheCreation: 20, CacheRead: 30}},
		{"only message_start", []string{start, text}, Tokens{In: 100, Out: 1, Reported: true, CacheCreation: 20, CacheRead: 30}},
		{"no input count anywhere", []string{text, delta(`{"output_tokens":15}`)}, Tokens{}},
		{"no input at the start, one in the delta", []string{`{"type":"message_start","message":{"content":[],"usage":{"output_tokens":1}}}`, delta(`{"input_tokens":9,"output_tokens":15}`)}, Tokens{In: 9, Out: 15, Reported: true}},
		{"a usage outside message_delta is not the stream's", []string{start, `{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"},"usage":{"output_tokens":999}}`}, Tokens{In: 100, Out: 1, Reported: true, CacheCreation: 20, CacheRead: 30}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o MessagesObserver
			for _, e := range tt.events {
				o.Observe([]byte(e))
			}
			if got := o.Usage(); got != tt.want {
				t.Errorf("Usage() = %+v, want %+v", got, tt.want)
			}
			if got := o.Outcome().Usage; got != tt.want {
				t.Errorf("Outcome().Usage = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestMessagesObserverEvents(t *testing.T) {
	tests := []struct {
		name            string
		events          []string
		want            Class
		finished, ended bool
		sawError        bool
	}{
		{"citations delta alone is no output", []string{`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":"","citations":[]}}`, `{"type":"content_block_delta","index":0,"delta":{"type":"citations_delta","citation":{"type":"char_location","cited_text":"x"}}}`, `{"type":"message_delta","delta":{"stop_reason":"end_turn"}}`, `{"type":"message_stop"}`}, Empty, true, true, false},
		{"a tool_use block is output at its start", []string{`{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"f","input":{}}}`, `{"type":"message_stop"}`}, Success, true, true, false},
		{"text in content_block_start", []string{`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":"Hi"}}`}, Success, false, false, false},
		{"message_stop without a message_delta starts the tail", []string{`{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}`, `{"type":"message_stop"}`}, Success, true, true, false},
		{"message_delta without a stop_reason is no tail", []string{`{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}`, `{"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":3}}`}, Success, false, false, false},
		{"max_tokens", []string{`{"type":"content_block_delta","delta":{"type":"text_delta","text":"The"}}`, `{"type":"message_delta","delta":{"stop_reason":"max_tokens"}}`, `{"type":"message_stop"}`}, Success, true, true, false},
		{"malformed event", []string{`{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}`, `{"type":"content_block_del`, `{"type":"message_stop"}`}, Transient, true, true, false},
		{"not an object", []string{`[DONE]`}, Transient, false, false, false},
		{"ping and unknown events change nothing", []string{`{"type": "ping"}`, `{"type":"a_new_event","delta":{"text":"x"}}`}, Empty, false, false, false},
		{"error event first", []string{`{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`}, ServerError, false, true, true},
		{"error after the tail started", []string{`{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}`, `{"type":"message_delta","delta":{"stop_reason":"end_turn"}}`, `{"type":"error","error":{"type":"overloaded_error"}}`}, Transient, true, true, true},
		{"stream spend limit", []string{`{"type":"error","error":{"type":"rate_limit_error","details":{"error_code":"enforced_spend_limit_reached"}}}`}, Quota, false, true, true},
		{"empty payloads are ignored", []string{``, " \n", `{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}`}, Success, false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o MessagesObserver
			for _, e := range tt.events {
				o.Observe([]byte(e))
			}
			out := o.Outcome()
			if out.Class != tt.want || o.Finished() != tt.finished || o.Ended() != tt.ended || o.SawError() != tt.sawError {
				t.Errorf("Outcome %+v finished %v ended %v error %v; want %s %v %v %v",
					out, o.Finished(), o.Ended(), o.SawError(), tt.want, tt.finished, tt.ended, tt.sawError)
			}
			checkOutcome(t, out)
		})
	}
}

func TestMessagesPreamble(t *testing.T) {
	for data, want := range map[string]bool{
		`{"type":"message_start","message":{"id":"msg_1","content":[]}}`: true,
		`{"type": "ping"}`: true,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`:         true,
		`{"index":0,"type":"content_block_start","content_block":{"type":"thinking","thinking":""}}`: true,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`:         false,
		`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`:                false,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1}}`:    false,
		`{"type":"message_stop"}`:              false,
		`{"message":{"type":"message_start"}}`: false,
		`not json`:                             false,
	} {
		if got := MessagesPreamble([]byte(data)); got != want {
			t.Errorf("MessagesPreamble(%s) = %v, want %v", data, got, want)
		}
	}
}

// Observing an event of a stream that goes well allocates nothing.
func TestMessagesObserverAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	for _, ev := range recordedEvents(t, "thinking_tool_text.sse") {
		var o MessagesObserver
		if n := testing.AllocsPerRun(100, func() { o.Observe(ev) }); n != 0 {
			t.Errorf("Observe(%s): %v allocations", ev, n)
		}
	}
}

func BenchmarkMessagesObserver(b *testing.B) {
	events := recordedEvents(b, "thinking_tool_text.sse")
	var size int64
	for _, ev := range events {
		size += int64(len(ev))
	}
	b.Run("text_delta", func(b *testing.B) {
		ev := events[8]
		b.ReportAllocs()
		b.SetBytes(int64(len(ev)))
		var o MessagesObserver
		for b.Loop() {
			o.Observe(ev)
		}
		if o.Outcome().Class != Success {
			b.Fatal(o.Outcome())
		}
	})
	b.Run("whole stream", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(size)
		for b.Loop() {
			var o MessagesObserver
			for _, ev := range events {
				o.Observe(ev)
			}
			if !o.Ended() {
				b.Fatal(o.Outcome())
			}
		}
	})
}

func BenchmarkFromMessages(b *testing.B) {
	body := []byte(msgText)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if o := FromMessages(body, nil, now); o.Class != Success {
			b.Fatal(o)
		}
	}
}

func FuzzFromMessages(f *testing.F) {
	f.Add([]byte(msgText))
	f.Add([]byte(`{"type":"message","content":[{"type":"tool_use","id":"t","name":"f","input":{}}],"stop_reason":"tool_use"}`))
	f.Add([]byte(`{"type":"message","content":[{"type":"text","text":""}],"stop_reason":"refusal"}`))
	f.Add([]byte(`{"type":"message","content":[{"type":"thinking","thinking":"x"}],"stop_reason":"max_tokens"}`))
	f.Add([]byte(`{"type":"error","error":{"type":"rate_limit_error","details":{"error_code":"enforced_spend_limit_reached"}}}`))
	f.Add([]byte(`{"content":{"type":"text"},"stop_reason":1,"usage":[]}`))
	f.Add([]byte(`{"type":"message","content":[{"type":"text","text":"Hel`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, body []byte) {
		o := FromMessages(body, nil, now)
		checkOutcome(t, o)
		if o.Timeout || o.Class == Canceled {
			t.Fatalf("FromMessages = %+v", o)
		}
		// The walker must agree with encoding/json on what is valid JSON.
		malformed := o.Reason == "malformed message body"
		object := json.Valid(body) && bytes.TrimSpace(body)[0] == '{'
		if malformed == object {
			t.Fatalf("valid object: %v, but classified %+v", object, o)
		}
		if !o.Usage.Reported && o.Usage != (Tokens{}) {
			t.Fatalf("usage %+v without Reported", o.Usage)
		}
	})
}

// FuzzMessagesObserver feeds a stream as lines, one event each, and holds
// the observer to what the relay relies on.
func FuzzMessagesObserver(f *testing.F) {
	for _, name := range []string{"thinking_tool_text.sse", "error_after_two_deltas.sse", "refusal.sse", "empty.sse"} {
		f.Add(bytes.Join(recordedEvents(f, name), []byte("\n")))
	}
	f.Add([]byte("{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null},\"usage\":{\"input_tokens\":1,\"output_tokens\":\"x\"}}\n{\"type\":\"message_stop\"}"))
	f.Add([]byte("{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n{\"type\":\"message_stop\"}"))
	f.Add([]byte("{\"type\":\"message_sta\n\n[DONE]"))
	f.Fuzz(func(t *testing.T, events []byte) {
		var o MessagesObserver
		wasFinished, wasEnded := false, false
		for e := range bytes.SplitSeq(events, []byte("\n")) {
			o.Observe(e)
			// The tail, once started, and the end, once reached, stay.
			if wasFinished && !o.Finished() || wasEnded && !o.Ended() {
				t.Fatalf("Finished %v→%v, Ended %v→%v", wasFinished, o.Finished(), wasEnded, o.Ended())
			}
			wasFinished, wasEnded = o.Finished(), o.Ended()
		}
		out := o.Outcome()
		checkOutcome(t, out)
		if out.Class == Canceled || out.HasRetryAfter || out.Timeout {
			t.Fatalf("Outcome() = %+v", out)
		}
		if o.SawError() && !o.Ended() {
			t.Fatal("an error event that does not end the stream")
		}
		if o.Ended() && !o.SawError() && !o.Finished() {
			t.Fatal("a clean end that is not the tail")
		}
		if u := o.Usage(); !u.Reported && u != (Tokens{}) {
			t.Fatalf("usage %+v without Reported", u)
		}
		if again := o.Outcome(); again != out {
			t.Fatalf("Outcome() changed: %+v then %+v", out, again)
		}
	})
}
