package classify

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// usageCases are the answers whose usage the gateway counts, and the ways
// a usage object can fail to say what an answer cost.
var usageCases = []struct {
	name, body string
	want       Tokens
}{
	{"chat completion", `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`, Tokens{In: 19, Out: 10, Reported: true}},
	{"chat completion, prompt cache hit", `{"object":"chat.completion","choices":[],"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0}}}`, Tokens{In: 2006, Out: 300, Reported: true, Cached: 1920}},
	{"responses, prompt cache hit", `{"object":"response","status":"completed","usage":{"input_tokens":1500,"input_tokens_details":{"cached_tokens":1024},"output_tokens":20,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":1520}}`, Tokens{In: 1500, Out: 20, Reported: true, Cached: 1024}},
	{"cached_tokens malformed is ignored", `{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":"x"}}}`, Tokens{In: 5, Reported: true}},
	{"details not an object is ignored", `{"usage":{"prompt_tokens":5,"prompt_tokens_details":null}}`, Tokens{In: 5, Reported: true}},
	{"legacy completion", `{"object":"text_completion","choices":[{"text":"Once","index":0,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`, Tokens{In: 5, Out: 7, Reported: true}},
	{"embeddings", `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.0023064255,-0.009327292,1e-7]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`, Tokens{In: 8, Out: 0, Reported: true}},
	{"usage chunk", `{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`, Tokens{In: 3, Out: 4, Reported: true}},
	{"usage first", `{"usage":{"completion_tokens":2,"prompt_tokens":1},"choices":[]}`, Tokens{In: 1, Out: 2, Reported: true}},
	{"zero counts", `{"usage":{"prompt_tokens":0,"completion_tokens":0}}`, Tokens{In: 0, Out: 0, Reported: true}},
	{"completion_tokens null", `{"usage":{"prompt_tokens":4,"completion_tokens":null}}`, Tokens{In: 4, Out: 0, Reported: true}},
	{"largest count", `{"usage":{"prompt_tokens":9223372036854775807}}`, Tokens{In: 9223372036854775807, Out: 0, Reported: true}},
	{"escaped keys", `{"us\u0061ge":{"prompt_\u0074okens":6,"completion_tokens":1}}`, Tokens{In: 6, Out: 1, Reported: true}},
	{"whitespace", " \n{ \"usage\" : { \"prompt_tokens\" : 2 , \"completion_tokens\" : 3 } }\n", Tokens{In: 2, Out: 3, Reported: true}},
	{"last usage wins", `{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2,"completion_tokens":5}}`, Tokens{In: 2, Out: 5, Reported: true}},
	{"last count wins", `{"usage":{"prompt_tokens":1,"prompt_tokens":9}}`, Tokens{In: 9, Out: 0, Reported: true}},
	{"nested usage is not the answer's", `{"choices":[{"message":{"content":"x","usage":{"prompt_tokens":1}}}],"metadata":{"usage":{"prompt_tokens":2}}}`, Tokens{}},

	{"anthropic message", `{"id":"msg_01","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":12,"cache_creation_input_tokens":1024,"cache_read_input_tokens":2048,"cache_creation":{"ephemeral_5m_input_tokens":1024,"ephemeral_1h_input_tokens":0},"output_tokens":6,"service_tier":"standard"}}`, Tokens{In: 12, Out: 6, Reported: true, CacheCreation: 1024, CacheRead: 2048}},
	{"anthropic cache counts null", `{"usage":{"input_tokens":3,"cache_creation_input_tokens":null,"cache_read_input_tokens":null,"output_tokens":1}}`, Tokens{In: 3, Out: 1, Reported: true}},
	{"anthropic cache count malformed", `{"usage":{"input_tokens":3,"cache_read_input_tokens":"7","output_tokens":1}}`, Tokens{}},
	{"anthropic cache counts without input", `{"usage":{"cache_read_input_tokens":7,"output_tokens":1}}`, Tokens{}},

	{"no usage", `{"choices":[{"message":{"content":"x"}}]}`, Tokens{}},
	{"usage null (a stream chunk before the last)", `{"choices":[{"delta":{"content":"x"},"finish_reason":null}],"usage":null}`, Tokens{}},
	{"null after a usage", `{"usage":{"prompt_tokens":1},"usage":null}`, Tokens{}},
	{"usage not an object", `{"usage":[1,2]}`, Tokens{}},
	{"no prompt_tokens", `{"usage":{"completion_tokens":3,"total_tokens":3}}`, Tokens{}},
	{"prompt_tokens null", `{"usage":{"prompt_tokens":null,"completion_tokens":3}}`, Tokens{}},
	{"prompt_tokens a string", `{"usage":{"prompt_tokens":"12"}}`, Tokens{}},
	{"negative", `{"usage":{"prompt_tokens":-1}}`, Tokens{}},
	{"fraction", `{"usage":{"prompt_tokens":1.0}}`, Tokens{}},
	{"exponent", `{"usage":{"prompt_tokens":1e3}}`, Tokens{}},
	{"too large", `{"usage":{"prompt_tokens":9223372036854775808}}`, Tokens{}},
	{"completion_tokens malformed", `{"usage":{"prompt_tokens":3,"completion_tokens":"4"}}`, Tokens{}},
	{"case matters", `{"Usage":{"prompt_tokens":3},"usage":{"Prompt_Tokens":3}}`, Tokens{}},
	{"truncated after usage", `{"usage":{"prompt_tokens":3,"completion_tokens":4},"choices":[`, Tokens{}},
	{"invalid after usage", `{"usage":{"prompt_tokens":3}} x`, Tokens{}},
	{"array", `[{"usage":{"prompt_tokens":3}}]`, Tokens{}},
	{"null", `null`, Tokens{}},
	{"empty", ``, Tokens{}},
	{"done", `[DONE]`, Tokens{}},
}

func TestUsage(t *testing.T) {
	for _, tt := range usageCases {
		t.Run(tt.name, func(t *testing.T) {
			if got := Usage([]byte(tt.body)); got != tt.want {
				t.Errorf("Usage = %+v, want %+v", got, tt.want)
			}
			if got := referenceUsage([]byte(tt.body)); got != tt.want {
				t.Errorf("referenceUsage = %+v, want %+v (the test's reference disagrees)", got, tt.want)
			}
		})
	}
}

// FromCompletion and a StreamObserver read usage in the walk that
// classifies, and agree with Usage.
func TestUsageFromTheClassifyingWalk(t *testing.T) {
	for _, tt := range usageCases {
		t.Run(tt.name, func(t *testing.T) {
			if got := FromCompletion([]byte(tt.body)).Usage; got != tt.want {
				t.Errorf("FromCompletion(...).Usage = %+v, want %+v", got, tt.want)
			}
			var o StreamObserver
			o.Observe([]byte(tt.body))
			if got := o.Usage(); got != tt.want {
				t.Errorf("StreamObserver.Usage() = %+v, want %+v", got, tt.want)
			}
			if got := o.Outcome().Usage; got != tt.want {
				t.Errorf("StreamObserver.Outcome().Usage = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestStreamObserverUsage(t *testing.T) {
	content := `{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}],"usage":null}`
	finish := `{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}`
	usage := func(in, out int) string {
		return `{"choices":[],"usage":{"prompt_tokens":` + strconv.Itoa(in) + `,"completion_tokens":` + strconv.Itoa(out) + `}}`
	}
	tests := []struct {
		name   string
		events []string
		want   Tokens
	}{
		{"include_usage", []string{content, finish, usage(12, 3), "[DONE]"}, Tokens{In: 12, Out: 3, Reported: true}},
		{"without include_usage", []string{`{"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]}`, `{"choices":[{"delta":{},"finish_reason":"stop"}]}`, "[DONE]"}, Tokens{}},
		{"cut before the usage chunk", []string{content, finish}, Tokens{}},
		{"usage on the finish chunk", []string{content, `{"choices":[{"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":1}}`, "[DONE]"}, Tokens{In: 2, Out: 1, Reported: true}},
		{"running totals: the last counts", []string{usage(5, 1), usage(5, 2), usage(5, 3), "[DONE]"}, Tokens{In: 5, Out: 3, Reported: true}},
		{"a null after the usage keeps it", []string{usage(5, 3), `{"choices":[],"usage":null}`, "[DONE]"}, Tokens{In: 5, Out: 3, Reported: true}},
		{"a malformed event keeps it", []string{usage(5, 3), `{"choices":[`, "[DONE]"}, Tokens{In: 5, Out: 3, Reported: true}},
		{"after an error event", []string{content, `{"error":{"type":"server_error"}}`, usage(4, 1)}, Tokens{In: 4, Out: 1, Reported: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o StreamObserver
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

// referenceUsage is Usage by encoding/json: the body decoded into
// map[string]json.RawMessage (exact keys, the last of a repeated key),
// then its usage member by member, in order (prompt_tokens and
// input_tokens name the same count, and the last of them counts).
func referenceUsage(body []byte) Tokens {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil || top == nil {
		return Tokens{}
	}
	var u map[string]json.RawMessage
	if json.Unmarshal(top["usage"], &u) != nil || u == nil {
		return Tokens{}
	}
	dec := json.NewDecoder(bytes.NewReader(top["usage"]))
	dec.Token() // {
	var t Tokens
	raw := map[*int64]json.RawMessage{}
	for dec.More() {
		key, _ := dec.Token()
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return Tokens{}
		}
		switch key {
		case "prompt_tokens", "input_tokens":
			raw[&t.In] = v
		case "completion_tokens", "output_tokens":
			raw[&t.Out] = v
		case "cache_creation_input_tokens":
			raw[&t.CacheCreation] = v
		case "cache_read_input_tokens":
			raw[&t.CacheRead] = v
		case "prompt_tokens_details", "input_tokens_details":
			var d struct {
				Cached json.RawMessage `json:"cached_tokens"`
			}
			t.Cached = 0
			if json.Unmarshal(v, &d) == nil {
				t.Cached, _ = referenceCount(d.Cached)
			}
		}
	}
	if in, present := raw[&t.In]; !present || string(in) == "null" {
		return Tokens{}
	}
	for dst, v := range raw {
		if string(v) == "null" {
			continue
		}
		n, ok := referenceCount(v)
		if !ok {
			return Tokens{}
		}
		*dst = n
	}
	t.Reported = true
	return t
}

func referenceCount(raw json.RawMessage) (int64, bool) {
	s := string(raw)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") {
		return 0, false
	}
	return n, true
}

// FuzzUsage holds Usage to encoding/json's reading of the same body, and
// the classifying walks (FromCompletion, StreamObserver) to Usage.
func FuzzUsage(f *testing.F) {
	for _, c := range usageCases {
		f.Add([]byte(c.body))
	}
	f.Add(benchCompletion)
	f.Add([]byte(`{"usage":{"prompt_tokens":1,"prompt_tokens":-0}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":00}}`))
	f.Add([]byte("{\"\\u0075sage\":{\"prompt_tokens\":1},\"us\xffage\":{\"prompt_tokens\":2}}"))
	f.Add([]byte(`{"usage":{"prompt_tokens":1,"completion_tokens":18446744073709551616}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got := Usage(body)
		if want := referenceUsage(body); got != want {
			t.Fatalf("Usage = %+v, encoding/json reads %+v", got, want)
		}
		if !got.Reported && got != (Tokens{}) {
			t.Fatalf("Usage = %+v: counts without Reported", got)
		}
		if c := FromCompletion(body).Usage; c != got {
			t.Fatalf("FromCompletion(...).Usage = %+v, Usage = %+v", c, got)
		}
		// Observe trims the payload (as SSE framing leaves it) and takes
		// [DONE] as the end.
		trimmed := bytes.TrimSpace(body)
		var o StreamObserver
		o.Observe(body)
		if want := Usage(trimmed); o.Usage() != want {
			t.Fatalf("StreamObserver.Usage() = %+v, Usage = %+v", o.Usage(), want)
		}
	})
}

// benchEmbeddings is an embeddings answer for one input at 1536
// dimensions (text-embedding-3-small's default): 30 KiB of floats before
// the usage object.
var benchEmbeddings = func() []byte {
	var b bytes.Buffer
	b.WriteString(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[`)
	for i := range 1536 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatFloat(float64(i%97-48)/1013.0, 'g', -1, 32))
	}
	b.WriteString(`]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`)
	return b.Bytes()
}()

func BenchmarkUsage(b *testing.B) {
	for _, c := range []struct {
		name string
		body []byte
		want Tokens
	}{
		{"completion 1KiB", benchCompletion, Tokens{In: 19, Out: 10, Reported: true}},
		{"embeddings 1536 dims", benchEmbeddings, Tokens{In: 8, Out: 0, Reported: true}},
		{"usage chunk", []byte(`{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_fc9f1d7035","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29}}`), Tokens{In: 19, Out: 10, Reported: true}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if got := Usage(c.body); got != c.want {
					b.Fatal(got)
				}
			}
		})
	}
}

// BenchmarkStreamObserverUsageChunk is BenchmarkStreamObserver for the
// chunk that carries the usage.
func BenchmarkStreamObserverUsageChunk(b *testing.B) {
	chunk := []byte(`{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_fc9f1d7035","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29}}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(chunk)))
	var o StreamObserver
	for b.Loop() {
		o.Observe(chunk)
	}
	if !o.Usage().Reported {
		b.Fatal(o.Usage())
	}
}
