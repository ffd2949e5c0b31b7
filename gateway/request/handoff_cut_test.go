package request

import (
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// h2Writer stands for an HTTP/2 ResponseWriter: a write deadline in the
// past resets the stream for good (net/http's HTTP/2 SetWriteDeadline
// ends the stream at once), after which writes and flushes fail. Its
// first flush waits for finish; onCut runs inside the cutting
// SetWriteDeadline, before the reset takes effect.
type h2Writer struct {
	hdr      http.Header
	once     sync.Once
	flushing chan struct{} // closed as the first flush begins
	finish   chan struct{}
	onCut    func()
	reset    atomic.Bool
}

func (w *h2Writer) Header() http.Header { return w.hdr }
func (w *h2Writer) WriteHeader(int)     {}
func (w *h2Writer) Write(b []byte) (int, error) {
	if w.reset.Load() {
		return 0, os.ErrDeadlineExceeded
	}
	return len(b), nil
}
func (w *h2Writer) FlushError() error {
	first := false
	w.once.Do(func() { first = true })
	if first {
		close(w.flushing)
		<-w.finish
	}
	if w.reset.Load() {
		return os.ErrDeadlineExceeded
	}
	return nil
}
func (w *h2Writer) SetWriteDeadline(t time.Time) error {
	if !t.IsZero() && !t.After(time.Now()) {
		if w.onCut != nil {
			w.onCut()
		}
		w.reset.Store(true)
	}
	return nil
}

// TestEndCutNeverCountsAsDelivered: the client's deadline passes while
// deliver flushes a stream's end; end sees the flush under way and cuts
// it, and the flush, finishing first, lets deliver go on. The answer must
// not then count as delivered (its not-stored marker committed, a retry
// answered 410) while the cut resets the stream over HTTP/2. end checked
// "a write under way, not delivered" and cut afterwards, with nothing
// tying the two: deliver could mark it delivered in between. (onCut
// stands for end being preempted between its check and its cut.)
func TestEndCutNeverCountsAsDelivered(t *testing.T) {
	w := &h2Writer{hdr: http.Header{}, flushing: make(chan struct{}), finish: make(chan struct{})}
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	r.ProtoMajor = 2
	h := newHandoff(w, r, nil, 0)
	h.Header().Set("Content-Type", "text/event-stream")
	if _, err := h.Write([]byte("data: x\n\ndata: [DONE]\n\n")); err != nil {
		t.Fatal(err)
	}
	type result struct{ delivered, settled bool }
	got := make(chan result, 1)
	go func() {
		settled := false
		d, _ := h.deliver(func() error { settled = true; return nil })
		got <- result{d, settled}
	}()
	<-w.flushing
	var dv result
	w.onCut = func() {
		close(w.finish)
		dv = <-got
	}
	_, endDelivered := h.end(nil)
	if !w.reset.Load() {
		t.Fatal("end did not cut the flush under way")
	}
	if endDelivered || dv.delivered || dv.settled {
		t.Fatalf("the stream was reset by end's cut, yet end reports delivered=%v, deliver delivered=%v, its marker committed=%v",
			endDelivered, dv.delivered, dv.settled)
	}
}

// stuckWriter is a client that stopped reading: a write blocks until a
// write deadline is set, as if it then passed (the test injects its
// passing), and fails; deadline is the one set.
type stuckWriter struct {
	hdr      http.Header
	writing  chan struct{}
	once     sync.Once
	unstick  chan struct{}
	mu       sync.Mutex
	deadline time.Time
}

func (w *stuckWriter) Header() http.Header { return w.hdr }
func (w *stuckWriter) WriteHeader(int)     {}
func (w *stuckWriter) Write([]byte) (int, error) {
	close(w.writing)
	<-w.unstick
	return 0, os.ErrDeadlineExceeded
}
func (w *stuckWriter) FlushError() error { return nil }
func (w *stuckWriter) SetWriteDeadline(t time.Time) error {
	if !t.IsZero() {
		w.mu.Lock()
		w.deadline = t
		w.mu.Unlock()
		w.once.Do(func() { close(w.unstick) })
	}
	return nil
}

// A write of the answer's end (finish) stuck on a client that stopped
// reading when the client's deadline passes is given
// server.write_stall_timeout, not cut at once and not waited on forever:
// end, which the stuck write's lock held, returns once that passes
// (found by review: before, end took the lock with no deadline set, and
// the handler waited as long as the client did not read).
func TestEndBoundsAStuckEnd(t *testing.T) {
	const stall = 30 * time.Second
	w := &stuckWriter{hdr: http.Header{}, writing: make(chan struct{}), unstick: make(chan struct{})}
	r := httptest.NewRequest(http.MethodPost, "/v1/embeddings", nil)
	h := newHandoff(w, r, nil, stall) // a JSON call: no live stream, no stall guard
	h.Header().Set("Content-Type", "application/json")
	h.finish()
	go func() { _, _ = h.Write(make([]byte, 1<<20)) }()
	<-w.writing
	before := time.Now()
	done := make(chan struct{})
	go func() {
		h.end(func(http.ResponseWriter, bool) bool { return true })
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // a bound, not a synchronisation
		w.once.Do(func() { close(w.unstick) })
		t.Fatal("end waited on the stuck write with no deadline set")
	}
	w.mu.Lock()
	d := w.deadline.Sub(before)
	w.mu.Unlock()
	if d < stall-time.Second || d > stall+time.Second {
		t.Fatalf("the end's write got a deadline %v ahead, want write_stall_timeout (%v)", d, stall)
	}
}

// cutWriter's first write blocks until end cuts it (a write deadline in
// the past), when onCut runs: the work goes on meanwhile.
type cutWriter struct {
	hdr     http.Header
	writing chan struct{}
	unstick chan struct{}
	onCut   func()
}

func (w *cutWriter) Header() http.Header { return w.hdr }
func (w *cutWriter) WriteHeader(int)     {}
func (w *cutWriter) Write(b []byte) (int, error) {
	select {
	case <-w.writing:
	default:
		close(w.writing)
		<-w.unstick
		return 0, os.ErrDeadlineExceeded
	}
	return len(b), nil
}
func (w *cutWriter) FlushError() error { return nil }
func (w *cutWriter) SetWriteDeadline(t time.Time) error {
	if !t.IsZero() && !t.After(time.Now()) && w.onCut != nil {
		f := w.onCut
		w.onCut = nil
		f()
	}
	return nil
}

// end that cut a write of the answer itself (over HTTP/2 the stream is
// reset) never reports it delivered, even when the work, between that cut
// and end's lock, went on to write its end (finish; found by review).
func TestEndCutThenFinishIsNotDelivered(t *testing.T) {
	w := &cutWriter{hdr: http.Header{}, writing: make(chan struct{}), unstick: make(chan struct{})}
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	r.ProtoMajor = 2
	h := newHandoff(w, r, nil, 0)
	h.Header().Set("Content-Type", "text/event-stream")
	finished := make(chan struct{})
	go func() {
		_, _ = h.Write([]byte("data: a\n\n")) // stuck, then cut
		h.finish()                            // committed: the tail goes out
		close(finished)
	}()
	<-w.writing
	w.onCut = func() { close(w.unstick); <-finished }
	if _, delivered := h.end(func(http.ResponseWriter, bool) bool { return false }); delivered {
		t.Fatal("end cut the stream (an HTTP/2 reset), yet reports it delivered")
	}
}
