package sse_test

import (
	"bytes"
	"net/http/httptest"
	"testing"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/gateway/idempotency"
	"github.com/llmgate/llmgate/gateway/sse"
)

// BenchmarkSSEReplay writes a committed stream back to a client.
func BenchmarkSSEReplay(b *testing.B) {
	stream := sse.Stream()
	rd := sse.NewReader(bytes.NewReader(stream), 1<<20)
	rec := &cache.Record{Status: 200, Stream: true, Upstream: "u", Header: map[string][]string{"Content-Type": {"text/event-stream"}}}
	for {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		rec.Events = append(rec.Events, append([]byte(nil), ev...))
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		w := httptest.NewRecorder()
		idempotency.Replay(w, rec)
	}
}
