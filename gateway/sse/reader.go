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
// sent. Lines may end in LF, CRLF or CR, mixed in one stream, and may be of
// any length up to the event limit. An event ends, as the spec says, at the
// first blank line after a line that is not blank; blank lines before an
// event are returned with it.
//
// An event whose blank line is a CR is returned without waiting to see
// whether an LF follows, unless the line before it ended in CRLF (the
// stream has shown it ends lines in CRLF, so its LF is on its way): a
// stream framed with CRs alone must not stall an event until the next one
// begins. An LF that then arrives is the end of that CRLF, not a blank
// line; it is returned at the start of the next event (or dropped with
// the blank lines at the stream's end).
type Reader struct {
	br       *bufio.Reader
	maxEvent int
	event    []byte
	// afterCR: the last byte read is a CR that ended a line, so an LF
	// next is the rest of that line ending.
	afterCR bool
	// err is a read error met while looking past an event's end, for the
	// next call to report.
	err error
	// ends finds line endings in what has arrived; its offsets are from
	// the first byte not yet read, so that what it has scanned is not
	// scanned again at the next call.
	ends lineEnds
}

const bufferSize = 32 << 10

var bufioPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, bufferSize) }}

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
// At a clean end of stream (nothing but blank lines after the last event)
// it returns io.EOF; a stream cut inside an event returns the bytes read
// with io.ErrUnexpectedEOF; any other read error is returned with the bytes
// read. (One loop over the buffered bytes, longer than 60 lines: the
// line-ending states — a line running past the buffer, a CR waiting for its
// LF — are clearest kept together.)
func (s *Reader) Next() ([]byte, error) {
	s.event = s.event[:0]
	if s.err != nil {
		return s.end(s.err)
	}
	var (
		inLine   bool // part of the current line has been read
		started  bool // a line that is not blank has been read: a blank line ends the event
		lastCRLF bool // the last line ended in CRLF
	)
	for {
		buf, err := s.fill()
		if err != nil {
			return s.end(err)
		}
		// Scan what has arrived for line endings; n is how much of it is
		// this event's.
		n := 0
		if s.afterCR {
			s.afterCR = false
			if buf[0] == '\n' {
				n, lastCRLF = 1, true
			}
		}
		complete, waitLF := false, false
		for n < len(buf) {
			i := s.ends.next(buf, n)
			if i < 0 {
				inLine, n = true, len(buf) // the line goes on past what has arrived
				break
			}
			blank := i == n && !inLine
			prevCRLF := lastCRLF // of the line before this one
			inLine, n, lastCRLF = false, i+1, false
			if buf[i] == '\r' {
				switch {
				case n == len(buf):
					s.afterCR = true
				case buf[n] == '\n':
					n, lastCRLF = n+1, true
				}
			}
			if blank && started {
				complete = true
				waitLF = s.afterCR && prevCRLF
				break
			}
			started = started || !blank
		}
		if err := s.keep(buf[:n]); err != nil {
			return nil, err
		}
		if !complete {
			continue
		}
		if waitLF {
			// The blank line is a CR, the last byte to have arrived, after
			// a line that ended in CRLF: the LF of this CRLF is on its
			// way. Wait for it, so the event ends where its sender ended it.
			s.afterCR = false
			next, err := s.br.Peek(1)
			switch {
			case err != nil:
				// A CR at the stream's end ends its line; the error is
				// the next call's to report.
				s.err = err
			case next[0] == '\n':
				if err := s.keep(next); err != nil {
					return nil, err
				}
			}
		}
		return s.event, nil
	}
}

// fill returns what has arrived and not been read, reading more if
// nothing has.
func (s *Reader) fill() ([]byte, error) {
	if s.br.Buffered() == 0 {
		if _, err := s.br.Peek(1); err != nil {
			return nil, err
		}
	}
	return s.br.Peek(s.br.Buffered())
}

// keep adds b, the next bytes of the buffered input, to the event.
func (s *Reader) keep(b []byte) error {
	if s.maxEvent > 0 && len(s.event)+len(b) > s.maxEvent {
		return ErrEventTooLarge
	}
	s.event = append(s.event, b...)
	_, _ = s.br.Discard(len(b)) // b is buffered: Discard cannot fail
	s.ends.cr = max(s.ends.cr-len(b), 0)
	s.ends.lf = max(s.ends.lf-len(b), 0)
	return nil
}

// end is how Next ends on a read error.
func (s *Reader) end(err error) ([]byte, error) {
	if errors.Is(err, io.EOF) {
		if len(bytes.TrimSpace(s.event)) == 0 {
			return nil, io.EOF
		}
		return s.event, io.ErrUnexpectedEOF
	}
	return s.event, err
}

// lineEnds finds the line endings in a buffer that may grow at its end
// between calls. It remembers how far it has looked for each of CR and LF,
// so that a stream whose lines end in LF is scanned for CR once, not once
// per line (nor the other way round). Its zero value is ready to use.
type lineEnds struct {
	// cr and lf are where the search for the next CR and LF resumes:
	// there is none between the last index asked for and them. When one
	// was found, that is where it is.
	cr, lf int
}

// next returns the index of the first CR or LF in buf at or after i, or
// -1. Each call's i is at least the last's, and buf holds the last's.
func (l *lineEnds) next(buf []byte, i int) int {
	if l.cr < i || l.cr < len(buf) && buf[l.cr] != '\r' {
		l.cr = indexFrom(buf, max(i, l.cr), '\r')
	}
	if l.lf < i || l.lf < len(buf) && buf[l.lf] != '\n' {
		l.lf = indexFrom(buf, max(i, l.lf), '\n')
	}
	if e := min(l.cr, l.lf); e < len(buf) {
		return e
	}
	return -1
}

// indexFrom is the index of the first c in b at or after i, or len(b).
func indexFrom(b []byte, i int, c byte) int {
	if j := bytes.IndexByte(b[i:], c); j >= 0 {
		return i + j
	}
	return len(b)
}

// Data returns the data payload of one event: its "data" fields joined by
// \n, per the SSE spec (lines end in LF, CRLF or CR; one optional space
// after the colon is dropped; a "data" line without a colon is an empty
// value). Events with a single data line, the common case, return a
// sub-slice of ev.
func Data(ev []byte) []byte {
	var out []byte
	n := 0
	var ends lineEnds
	for i := 0; i < len(ev); {
		var line []byte
		if e := ends.next(ev, i); e < 0 {
			line, i = ev[i:], len(ev)
		} else {
			line, i = ev[i:e], e+1
			if ev[e] == '\r' && i < len(ev) && ev[i] == '\n' {
				i++
			}
		}
		var d []byte
		switch {
		case bytes.HasPrefix(line, []byte("data:")):
			d = line[5:]
			if len(d) > 0 && d[0] == ' ' {
				d = d[1:]
			}
		case string(line) == "data":
			d = line[4:]
		default:
			continue
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
