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
