package jsonscan

import (
	"strings"
	"testing"
)

var benchInputs = []struct{ name, body string }{
	{"request", `{"model":"gpt-4o-mini","temperature":0,"messages":[{"role":"system","content":"You are a careful assistant that summarises orders."},` +
		`{"role":"user","content":"` + strings.Repeat("Summarise order 4711 for the customer. ", 20) + `"}],"stream_options":{"include_usage":true},"max_tokens":256}`},
	{"chunk", `{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_fc9f1d7035","choices":[{"index":0,"delta":{"content":" brown"},"logprobs":null,"finish_reason":null}]}`},
	{"numbers", `[` + strings.Repeat(`{"index":12,"logprob":-0.25,"bytes":[32,98,114],"ok":true,"x":null},`, 20) + `0]`},
}

// BenchmarkSkip validates a whole text, reading nothing.
func BenchmarkSkip(b *testing.B) {
	for _, in := range benchInputs {
		b.Run(in.name, func(b *testing.B) {
			body := []byte(in.body)
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				s := New(body, 0)
				s.Skip()
				if s.Err() != nil {
					b.Fatal(s.Err())
				}
			}
		})
	}
}

var benchKeys = NewKeys("model", "stream", "stream_options", "previous_response_id", "background", "store", "conversation")

// BenchmarkFields reads the top-level members of a request as the
// gateway does.
func BenchmarkFields(b *testing.B) {
	body := []byte(benchInputs[0].body)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		s := New(body, 64)
		n := 0
		for range s.Fields(benchKeys) {
			n++
		}
		if s.Err() != nil || n != 2 {
			b.Fatal(s.Err(), n)
		}
	}
}
