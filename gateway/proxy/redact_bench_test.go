package proxy

import (
	"strings"
	"testing"
)

// BenchmarkRedactKey: what every relayed stream event and buffered answer
// pays to be checked for the attempt's key (a project key's length): no
// allocation when the key is absent.
func BenchmarkRedactKey(b *testing.B) {
	key := "sk-proj-" + strings.Repeat("k", 156)
	ev := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}`)
	b.ReportAllocs()
	for b.Loop() {
		_ = redactKey(ev, key)
	}
}
