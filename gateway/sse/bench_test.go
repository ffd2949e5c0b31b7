package sse

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
)

// Stream is a 64-event chat stream as an upstream sends it.
func Stream() []byte {
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
	stream := Stream()
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		rd := NewReader(bytes.NewReader(stream), 1<<20)
		rec := &Recorder{MaxBytes: 8 << 20, MaxEvents: 1000}
		for {
			ev, err := rd.Next()
			if err != nil {
				if err != io.EOF {
					b.Fatal(err)
				}
				break
			}
			_ = Data(ev)
			rec.Add(ev)
		}
		rd.Release()
	}
}

// BenchmarkSSENext splits streams into events, with each line ending and
// with lines longer than the reader's buffer; nothing is kept, so the
// allocations are the reader's own (per stream, not per event).
func BenchmarkSSENext(b *testing.B) {
	chat := Stream()
	long := bytes.Repeat([]byte("data: "+strings.Repeat("x", 100000)+"\n\n"), 4)
	for _, bc := range []struct {
		name   string
		stream []byte
	}{
		{"LF", chat},
		{"CRLF", bytes.ReplaceAll(chat, []byte("\n"), []byte("\r\n"))},
		{"CR", bytes.ReplaceAll(chat, []byte("\n"), []byte("\r"))},
		{"long lines", long},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.stream)))
			for b.Loop() {
				rd := NewReader(bytes.NewReader(bc.stream), 1<<20)
				for {
					if _, err := rd.Next(); err != nil {
						break
					}
				}
				rd.Release()
			}
		})
	}
}
