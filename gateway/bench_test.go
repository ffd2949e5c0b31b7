package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/cache"
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
		_ = fingerprint(benchBody)
	}
}

func BenchmarkParseIdempotencyKey(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseIdempotencyKey(`"order-4711/summarize"`); err != nil {
			b.Fatal(err)
		}
	}
}

// sseStream is a 64-event chat stream as an upstream sends it.
func sseStream() []byte {
	var buf bytes.Buffer
	for i := 0; i < 64; i++ {
		fmt.Fprintf(&buf, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"word %d "},"finish_reason":null}]}`+"\n\n", i)
	}
	buf.WriteString("data: [DONE]\n\n")
	return buf.Bytes()
}

// BenchmarkSSERecord splits a stream into events and records them, as a
// keyed stream does on its way to the client.
func BenchmarkSSERecord(b *testing.B) {
	stream := sseStream()
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		rd := newSSEReader(bytes.NewReader(stream), 1<<20)
		rec := &recorder{maxBytes: 8 << 20, maxEvents: 1000}
		for {
			ev, err := rd.next()
			if err != nil {
				if err != io.EOF {
					b.Fatal(err)
				}
				break
			}
			_ = eventData(ev)
			rec.add(ev)
		}
		rd.release()
	}
}

// BenchmarkSSEReplay writes a committed stream back to a client.
func BenchmarkSSEReplay(b *testing.B) {
	stream := sseStream()
	rd := newSSEReader(bytes.NewReader(stream), 1<<20)
	rec := &cache.Record{Status: 200, Stream: true, Upstream: "u", Header: map[string][]string{"Content-Type": {"text/event-stream"}}}
	for {
		ev, err := rd.next()
		if err != nil {
			break
		}
		rec.Events = append(rec.Events, append([]byte(nil), ev...))
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		w := httptest.NewRecorder()
		replayRecord(echo.NewResponse(w, nil), rec)
	}
}
