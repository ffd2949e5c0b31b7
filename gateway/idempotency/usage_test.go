package idempotency

import (
	"strings"
	"testing"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/classify"
)

func sseEvents(data ...string) [][]byte {
	out := make([][]byte, len(data))
	for i, d := range data {
		out[i] = []byte("data: " + d + "\n\n")
	}
	return out
}

const (
	contentChunk = `{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}],"usage":null}`
	finishChunk  = `{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}`
	usageChunk   = `{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}`
)

func TestRecordUsage(t *testing.T) {
	tests := []struct {
		name string
		rec  cache.Record
		want classify.Tokens
	}{
		{"json", cache.Record{Status: 200, Body: []byte(`{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}`)}, classify.Tokens{In: 4, Out: 2, Reported: true}},
		{"json without usage", cache.Record{Status: 200, Body: []byte(`{"choices":[]}`)}, classify.Tokens{}},
		{"stream with include_usage", cache.Record{Status: 200, Stream: true,
			Events: sseEvents(contentChunk, contentChunk, finishChunk, usageChunk, "[DONE]")}, classify.Tokens{In: 12, Out: 3, Reported: true}},
		{"usage on the finish chunk", cache.Record{Status: 200, Stream: true,
			Events: sseEvents(contentChunk, `{"choices":[{"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`, "[DONE]")}, classify.Tokens{In: 1, Out: 1, Reported: true}},
		{"stream without usage", cache.Record{Status: 200, Stream: true,
			Events: sseEvents(contentChunk, finishChunk, "[DONE]")}, classify.Tokens{}},
		// The usage of a stream is what comes with or after its finish;
		// the walk back stops there.
		{"usage before the finish is not the stream's", cache.Record{Status: 200, Stream: true,
			Events: sseEvents(usageChunk, contentChunk, finishChunk, "[DONE]")}, classify.Tokens{}},
		{"not-stored marker", cache.Record{Status: 410, Body: []byte(`{"error":{"code":"idempotency_result_not_stored"},"usage":{"prompt_tokens":1}}`)}, classify.Tokens{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RecordUsage(&tt.rec, nil); got != tt.want {
				t.Errorf("RecordUsage = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// BenchmarkRecordUsage is what a replay adds to read the tokens it saves:
// a 65-event stream (the gateway's SSE replay benchmark's size) with and
// without its usage chunk.
func BenchmarkRecordUsage(b *testing.B) {
	stream := func(tail ...string) *cache.Record {
		data := []string{strings.Replace(contentChunk, `"Hi"`, `"Hello there, how are you today?"`, 1)}
		for range 61 {
			data = append(data, contentChunk)
		}
		data = append(append(data, finishChunk), tail...)
		return &cache.Record{Status: 200, Stream: true, Events: sseEvents(append(data, "[DONE]")...)}
	}
	for _, c := range []struct {
		name string
		rec  *cache.Record
	}{
		{"stream with usage", stream(usageChunk)},
		{"stream without usage", stream()},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				RecordUsage(c.rec, nil)
			}
		})
	}
}
