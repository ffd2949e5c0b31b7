// Package sse is llmgate's one implementation of text/event-stream framing:
// a reader that splits an upstream stream into events as the exact bytes
// received, a recorder that keeps a keyed stream's events for its commit,
// and the data payload of an event. It knows nothing of HTTP, upstreams or
// the store.
package sse

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"sync"
)

// Reader splits an upstream text/event-stream into events, each returned
// as the exact bytes received, blank line included, so that what the client
// gets (and what a keyed stream commits) is byte for byte what the upstream
// sent. Lines may end in \n or \r\n.
type Reader struct {
	br       *bufio.Reader
	maxEvent int
	event    []byte
}

var bufioPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 32<<10) }}

// ErrEventTooLarge ends a stream whose single event exceeds the limit.
var ErrEventTooLarge = errors.New("SSE event too large")

// NewReader reads events from r; an event over maxEvent bytes (when > 0)
// ends the stream with ErrEventTooLarge. Call Release when done.
func NewReader(r io.Reader, maxEvent int) *Reader {
	br := bufioPool.Get().(*bufio.Reader)
	br.Reset(r)
	return &Reader{br: br, maxEvent: maxEvent}
}

// Release returns the reader's buffer to the pool; the reader is unusable after.
func (s *Reader) Release() {
	if s.br != nil {
		s.br.Reset(nil)
		bufioPool.Put(s.br)
		s.br = nil
	}
}

// Next returns the next whole event. The slice is valid until the next call.
// At a clean end of stream it returns io.EOF; a stream cut inside an event
// returns io.ErrUnexpectedEOF.
func (s *Reader) Next() ([]byte, error) {
	s.event = s.event[:0]
	for {
		line, err := s.br.ReadSlice('\n')
		if len(line) > 0 {
			if s.maxEvent > 0 && len(s.event)+len(line) > s.maxEvent {
				return nil, ErrEventTooLarge
			}
			s.event = append(s.event, line...)
		}
		switch {
		case err == nil:
			if isBlankLine(line) {
				if len(s.event) == len(line) {
					// Stray blank lines between events: forward them with
					// the next event rather than as an event of their own.
					continue
				}
				return s.event, nil
			}
		case errors.Is(err, bufio.ErrBufferFull):
			// A line longer than the buffer: keep accumulating.
		case errors.Is(err, io.EOF):
			if len(bytes.TrimSpace(s.event)) == 0 {
				return nil, io.EOF
			}
			return s.event, io.ErrUnexpectedEOF
		default:
			return s.event, err
		}
	}
}

func isBlankLine(line []byte) bool {
	return len(line) == 1 || (len(line) == 2 && line[0] == '\r')
}

// Data returns the data payload of one event: its "data:" lines joined
// by \n, per the SSE spec (one optional space after the colon is dropped).
// Events with a single data line, the common case, return a sub-slice of ev.
func Data(ev []byte) []byte {
	var out []byte
	n := 0
	for len(ev) > 0 {
		i := bytes.IndexByte(ev, '\n')
		var line []byte
		if i < 0 {
			line, ev = ev, nil
		} else {
			line, ev = ev[:i], ev[i+1:]
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue
		}
		d := line[5:]
		if len(d) > 0 && d[0] == ' ' {
			d = d[1:]
		}
		if n == 0 {
			out = d
		} else {
			if n == 1 {
				out = append([]byte(nil), out...)
			}
			out = append(append(out, '\n'), d...)
		}
		n++
	}
	return out
}
