package request

import (
	"strings"
	"testing"

	"github.com/llmgate/llmgate/gateway/idempotency"
)

// benchBody is a typical chat request of about 1 KiB.
var benchBody = []byte(`{"model":"gpt-4o-mini","temperature":0,"messages":[{"role":"system","content":"You are a careful assistant that summarises orders."},` +
	`{"role":"user","content":"` + strings.Repeat("Summarise order 4711 for the customer. ", 20) + `"}],"stream_options":{"include_usage":true},"max_tokens":256}`)

func BenchmarkParseRouting(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	for b.Loop() {
		if _, err := parseRouting(benchBody, 64); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFingerprint(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	for b.Loop() {
		_, _ = idempotency.Fingerprint(benchBody)
	}
}

func BenchmarkParseIdempotencyKey(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := idempotency.ParseKey(`"order-4711/summarize"`); err != nil {
			b.Fatal(err)
		}
	}
}
