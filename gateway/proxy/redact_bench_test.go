package proxy

import (
	"net/http"
	"strings"
	"testing"
)

// BenchmarkRedactKey: what every relayed stream event and buffered answer
// pays to be checked for the attempt's key (a project key's length): no
// allocation when the key is absent.
func BenchmarkRedactKey(b *testing.B) {
	key := newSecret("sk-proj-" + strings.Repeat("k", 156))
	ev := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}`)
	b.ReportAllocs()
	for b.Loop() {
		_ = redactKey(ev, key)
	}
}

// BenchmarkRedactHeaderKey: the headers OpenAI answers with, as relayed,
// looked through for the key on every response.
func BenchmarkRedactHeaderKey(b *testing.B) {
	key := newSecret("sk-proj-" + strings.Repeat("k", 156))
	h := http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"req_0123456789abcdef0123456789abcdef"},
		"Openai-Processing-Ms": {"412"}, "Openai-Version": {"2020-10-01"},
		"X-Ratelimit-Limit-Requests": {"10000"}, "X-Ratelimit-Limit-Tokens": {"30000000"},
		"X-Ratelimit-Remaining-Requests": {"9999"}, "X-Ratelimit-Remaining-Tokens": {"29999986"},
		"X-Ratelimit-Reset-Requests": {"6ms"}, "X-Ratelimit-Reset-Tokens": {"0s"}}
	b.ReportAllocs()
	for b.Loop() {
		redactHeaderKey(h, key)
	}
}
