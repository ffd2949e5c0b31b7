package proxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"sync/atomic"
)

// Body is a request body an attempt sends: held in memory, spooled to a
// file (every attempt reads it from the start, so a retry resends the same
// bytes), or read once from the client as it arrives (too large to spool:
// one attempt, no retry, no fallback).
type Body struct {
	mem  []byte
	file *os.File
	size int64
	once io.Reader
	used atomic.Bool
	// holders: Close closes the file when the last holder lets go.
	holders atomic.Int32
	// closed, if not nil, is called once the file is closed.
	closed func()
}

// MemoryBody is a body held in memory.
func MemoryBody(b []byte) *Body { return &Body{mem: b, size: int64(len(b))} }

// FileBody is a body spooled to f, size bytes from its start. The Body
// owns f: Close closes it, then calls closed if it is not nil (to give
// back the spool's disk reservation).
func FileBody(f *os.File, size int64, closed func()) *Body {
	b := &Body{file: f, size: size, closed: closed}
	b.holders.Store(1)
	return b
}

// OnceBody is a body read from r as an attempt sends it; size is its length,
// or -1 when unknown. It can be sent once.
func OnceBody(r io.Reader, size int64) *Body { return &Body{once: r, size: size} }

// Size is the body's length in bytes, -1 when unknown.
func (b *Body) Size() int64 { return b.size }

// Resendable reports whether the body can be sent more than once.
func (b *Body) Resendable() bool { return b.once == nil }

// Hold keeps the body's file open for one more user (a keyed call that
// may outlive its handler), who calls Close when done. Nil-safe.
func (b *Body) Hold() {
	if b != nil {
		b.holders.Add(1)
	}
}

// Close lets go of the body; the last to let go closes its file, if any.
// Nil-safe.
func (b *Body) Close() error {
	if b == nil || b.file == nil || b.holders.Add(-1) != 0 {
		return nil
	}
	err := b.file.Close()
	if b.closed != nil {
		b.closed()
	}
	return err
}

// errBodySent: a body read from the client as it arrived cannot be resent.
var errBodySent = errors.New("the request body was streamed to the upstream once and cannot be resent")

// reader returns the body from its start, with its length (-1 unknown).
func (b *Body) reader() (io.Reader, int64, error) {
	switch {
	case b.file != nil:
		return io.NewSectionReader(b.file, 0, b.size), b.size, nil
	case b.once != nil:
		if b.used.Swap(true) {
			return nil, 0, errBodySent
		}
		return b.once, b.size, nil
	}
	return nil, 0, nil
}

// body is what attempts of c send: c.Source when set, else c.Body.
func (c *Call) body() (io.Reader, int64, error) {
	if c.Source != nil && (c.Source.file != nil || c.Source.once != nil) {
		return c.Source.reader()
	}
	b := c.Body
	if c.Source != nil {
		b = c.Source.mem
	}
	return bytes.NewReader(b), int64(len(b)), nil
}

// resendable reports whether c's body can be sent again (a retry, a
// fallback).
func (c *Call) resendable() bool { return c.Source == nil || c.Source.Resendable() }

// setBody gives req the body r of n bytes (-1 unknown). No GetBody: see
// newUpstreamRequest.
func setBody(req *http.Request, r io.Reader, n int64) {
	if n == 0 || r == nil {
		req.Body, req.ContentLength = http.NoBody, 0
		return
	}
	req.Body, req.ContentLength = io.NopCloser(r), n
}
