package request

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/proxy"
)

// workSet tracks the keyed calls in flight, so that shutdown can give them
// the grace period and then end them (their keys released, their dead
// letters recorded) before the store closes, and counts the detached ones
// — those whose client stopped waiting — against a cap, and each client's
// against its share of it (see detach).
type workSet struct {
	mu       sync.Mutex
	cancels  map[*workItem]struct{}
	wg       sync.WaitGroup
	detached atomic.Int64
	max      int64
	closed   bool
	// byClient holds each client's detached calls, under mu.
	byClient map[string]map[*workItem]struct{}
	seq      int64 // orders detaches, under mu
}

// workItem is one keyed call. Its state moves once from running to
// detached (its client stopped waiting) and once to finished, by
// compare-and-swap, so a detach that loses the race with the call's end is
// a no-op and the detached count is decremented exactly once; a detached
// call cancelled to make room for another client's moves to evicted, and
// is no longer counted.
type workItem struct {
	cancel context.CancelCauseFunc
	state  atomic.Int32
	client string
	seq    int64 // when it detached, under workSet.mu
}

const (
	workRunning int32 = iota
	workDetached
	workEvicted
	workFinished
)

func newWorkSet(max int) *workSet {
	return &workSet{cancels: map[*workItem]struct{}{}, max: int64(max), byClient: map[string]map[*workItem]struct{}{}}
}

// start registers a keyed call of the client parent's request was
// authenticated as. Its context is detached from the client's (parent's
// values are kept) and ends at operatorDeadline (when not zero), at
// Drain's cancellation, or when done is called.
func (s *workSet) start(parent context.Context, operatorDeadline time.Time) (ctx context.Context, it *workItem, done func()) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	var stopDL context.CancelFunc = func() {}
	if !operatorDeadline.IsZero() {
		ctx, stopDL = context.WithDeadlineCause(ctx, operatorDeadline, outcome.ErrOperatorDeadline)
	}
	client, _ := parent.Value(clientCtxKey{}).(string)
	it = &workItem{cancel: cancel, client: client}
	s.mu.Lock()
	if s.closed {
		cancel(outcome.ErrShutdown)
	}
	s.cancels[it] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	return ctx, it, func() {
		stopDL()
		cancel(context.Canceled)
		s.mu.Lock()
		if it.state.Swap(workFinished) == workDetached {
			s.forget(it)
		}
		delete(s.cancels, it)
		s.mu.Unlock()
		s.wg.Done()
	}
}

// share is the most detached calls client may hold: half the cap (as a
// client may hold half of limits.max_inflight_bytes), so that one client
// whose calls hang cannot take every slot; at least one. With no clients
// configured every request's client is "", the only tenant: the whole cap.
func (s *workSet) share(client string) int {
	if client == "" {
		return int(s.max)
	}
	return max(int(s.max/2), 1)
}

// detach counts it as running on without its client. A call already
// finished (or already detached) is left as it is. Past its client's
// share (see share), the call is cancelled instead: it reports false.
// Within the share but past the cap (several clients each near their
// share), room is made by cancelling the newest detached call of the
// client holding the most — never of a client holding fewer than this
// one; if this client holds the most, this call is cancelled.
func (s *workSet) detach(it *workItem) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !it.state.CompareAndSwap(workRunning, workDetached) {
		return true
	}
	own := s.byClient[it.client]
	if len(own) >= s.share(it.client) {
		it.state.Store(workEvicted)
		it.cancel(errDetachedCap)
		return false
	}
	if s.detached.Load() >= s.max {
		victim := s.biggest()
		if victim == nil || len(s.byClient[victim.client]) <= len(own) {
			it.state.Store(workEvicted)
			it.cancel(errDetachedCap)
			return false
		}
		victim.state.Store(workEvicted)
		s.forget(victim)
		victim.cancel(errDetachedCap)
	}
	if own == nil {
		own = map[*workItem]struct{}{}
		s.byClient[it.client] = own
	}
	s.seq++
	it.seq = s.seq
	own[it] = struct{}{}
	s.detached.Add(1)
	return true
}

// biggest is the newest detached call of the client holding the most.
// The caller holds mu.
func (s *workSet) biggest() *workItem {
	var most map[*workItem]struct{}
	for _, own := range s.byClient {
		if len(own) > len(most) {
			most = own
		}
	}
	var newest *workItem
	for it := range most {
		if newest == nil || it.seq > newest.seq {
			newest = it
		}
	}
	return newest
}

// forget uncounts a detached call. The caller holds mu.
func (s *workSet) forget(it *workItem) {
	own := s.byClient[it.client]
	delete(own, it)
	if len(own) == 0 {
		delete(s.byClient, it.client)
	}
	s.detached.Add(-1)
}

var errDetachedCap = &capError{}

type capError struct{}

func (*capError) Error() string {
	return "too many detached keyed calls (idempotency.max_detached, or this client's share of it)"
}
func (*capError) Is(target error) bool { return target == outcome.ErrShutdown }

// Drain waits for the keyed calls in flight until ctx ends, then cancels
// the rest and waits (bounded by wait) for them to release their keys and
// record their dead letters.
func (s *workSet) Drain(ctx context.Context, wait time.Duration) {
	idle := make(chan struct{})
	go func() { s.wg.Wait(); close(idle) }()
	select {
	case <-idle:
		return
	case <-ctx.Done():
	}
	s.mu.Lock()
	s.closed = true
	for it := range s.cancels {
		it.cancel(outcome.ErrShutdown)
	}
	s.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	}
}

// handoff is the ResponseWriter a keyed call's work writes through. The
// handler may end it at the client's deadline: from then on the work's
// writes go nowhere, so the work can outlive its handler (net/http forbids
// touching a ResponseWriter after the handler returns). The work's headers
// are its own until it writes the status line.
type handoff struct {
	mu sync.Mutex
	w  http.ResponseWriter
	// client is the client's request context: done once it has left.
	client context.Context
	header http.Header
	wrote  bool
	ended  bool
	// failed: a write (or flush) of the work's did not reach the client
	// (it left, or the handler had ended the handoff).
	failed bool
	// settled is how the answer's delivery settled, once: delivered (the
	// work's whole answer went out before the handler ended the handoff:
	// deliver, or WriteWhole; the handler then leaves it be) or cut (end,
	// or a write that began as end did, set a write deadline of now to
	// cut a write; the answer can no longer count as delivered: over
	// HTTP/2 the cut resets the stream). Whichever comes first holds.
	settled atomic.Int32
	// live, when not nil, records what the work writes for duplicates
	// that join it (live.go), also after the handler has ended.
	live *liveStream
	// stall bounds each write to the client while live is set
	// (server.write_stall_timeout): a client that stopped reading must
	// not hold back the joiners, who follow the work, not the client.
	stall time.Duration
	rc    *http.ResponseController
	// endStall bounds the writes of an answer's end that end leaves be
	// (finishing) to a client that stopped reading
	// (server.write_stall_timeout; 0: unbounded).
	endStall time.Duration
	// ending is set by end as it begins, before it takes mu: a write
	// that starts from then on is cut at once (beginWrite, after guard's
	// deadline). Cleared when end finds the answer delivered: the work
	// goes on writing its end.
	ending atomic.Bool
	// writing: a write or flush to the client is under way (beginWrite);
	// end cuts it short with a write deadline of now.
	writing atomic.Bool
	// finishing is set by the work as its answer's end goes out
	// (finish): before a committed stream's held-back tail, or once an
	// answer too large to record is written whole, before its delivery
	// decides its marker. From then on end cuts nothing and ends
	// nothing, as for an answer delivered (a write stuck on the client
	// gets server.write_stall_timeout): the end of an answer must never be
	// followed by the handler's 504, nor cut once it is going out.
	finishing atomic.Bool
	// guardedAt is when guard last set the write deadline (zero: none is
	// set). Under mu.
	guardedAt time.Time
	// perWrite: the deadline is lifted after each write (unguard), as
	// HTTP/2 needs: there a deadline that passes resets the stream,
	// whether a write is under way or not.
	perWrite bool
}

// The values of handoff.settled.
const (
	answerDelivered = 1
	answerCut       = 2
)

func newHandoff(w http.ResponseWriter, r *http.Request, live *liveStream, stall time.Duration) *handoff {
	h := &handoff{w: w, client: r.Context(), header: http.Header{}, live: live, perWrite: r.ProtoMajor >= 2, endStall: stall}
	if live != nil && stall > 0 {
		h.stall, h.rc = stall, http.NewResponseController(w)
	}
	return h
}

// guard bounds the client write about to start by h.stall, if set; the
// write then fails (and the client is dropped: stalled) once it has been
// stuck that long, or up to a quarter longer: the deadline, 1¼ × h.stall
// ahead, is set again only once a quarter of h.stall has passed since it
// was last set (setting it was the costliest part of a small write). It
// stays set between writes on HTTP/1, where a deadline only fails a
// write made after it: the next write sets it again if it is old, end
// replaces it, and over lifts it once the work has written all it will,
// before net/http writes the response's end. On HTTP/2 unguard lifts it
// after each write. The caller holds mu, and calls beginWrite next, which
// cuts the write at once (a deadline of now over this one) if end has
// begun.
func (h *handoff) guard() {
	if h.rc == nil {
		return
	}
	now := time.Now()
	if !h.guardedAt.IsZero() && now.Sub(h.guardedAt) < h.stall/4 {
		return
	}
	_ = h.rc.SetWriteDeadline(now.Add(h.stall + h.stall/4))
	h.guardedAt = now
}

// beginWrite marks a write (or flush) to the client under way, for end,
// and cuts it at once if end has begun; endWrite marks it over. The
// caller holds mu. end cuts only a write under way (it may be stuck on a
// client that stopped reading), never the response as such: over HTTP/2
// a write deadline that passes resets the stream whether a write is under
// way or not, which would cut the 504 end writes, or an answer it finds
// delivered. Each of end and a write that starts as it begins sees the
// other's mark (end sets ending, then reads writing; a write sets
// writing, then reads ending), so no write it should cut escapes both.
func (h *handoff) beginWrite() {
	h.writing.Store(true)
	if h.cutting() {
		h.cut()
	}
}

func (h *handoff) endWrite() { h.writing.Store(false) }

// cutting reports that end has begun and a write must be cut: unless the
// answer was delivered, after which the work only writes its end (a
// trailer, a last flush), which end leaves be.
func (h *handoff) cutting() bool {
	return h.ending.Load() && !h.delivered() && !h.finishing.Load()
}

// finish marks the writes from now on as the answer's end (finishing).
// Each of end and a write after finish sees the other's mark, as with
// beginWrite: end sets ending, then reads finishing; finish sets
// finishing before the write reads ending. An end that took mu first has
// ended the handoff, and the end's writes go nowhere.
func (h *handoff) finish() {
	h.finishing.Store(true)
	if h.live != nil {
		h.live.finishing.Store(true)
	}
}

// cut fails the write to the client under way, and any until the deadline
// is lifted, at once — unless the answer was delivered: settling it as cut
// first, so that it can no longer count as delivered (over HTTP/2 the cut
// resets the stream, which nothing undoes).
func (h *handoff) cut() {
	if h.settled.CompareAndSwap(0, answerCut) || h.settled.Load() == answerCut {
		_ = http.NewResponseController(h.w).SetWriteDeadline(time.Now())
	}
}

// markDelivered settles the answer as delivered and reports it, unless it
// was cut first.
func (h *handoff) markDelivered() bool {
	return h.settled.CompareAndSwap(0, answerDelivered) || h.delivered()
}

// delivered reports that the answer settled as delivered.
func (h *handoff) delivered() bool { return h.settled.Load() == answerDelivered }

// unguard lifts guard's deadline after a write, on HTTP/2 (perWrite).
// The caller holds mu.
func (h *handoff) unguard() {
	if h.rc != nil && h.perWrite {
		h.lift()
	}
}

// boundEnd gives the writes of the answer's end, which end leaves be
// (finishing), server.write_stall_timeout from now to reach the client,
// and reports whether it set that deadline.
func (h *handoff) boundEnd() bool {
	if h.endStall <= 0 {
		return false
	}
	_ = http.NewResponseController(h.w).SetWriteDeadline(time.Now().Add(h.endStall))
	return true
}

// lift clears guard's deadline, or the one end set for the answer's end.
// The caller holds mu.
func (h *handoff) lift() {
	rc := h.rc
	if rc == nil {
		rc = http.NewResponseController(h.w)
	}
	_ = rc.SetWriteDeadline(time.Time{})
	h.guardedAt = time.Time{}
}

// over lifts guard's deadline once the work has written all it will:
// what net/http writes after the handler returns (what its buffer holds,
// a chunked body's end, the trailers) must not fail on a deadline set for
// one of the work's writes, long past when the work's settling after it
// (a commit, a marker, a budget) took more than h.stall.
func (h *handoff) over() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended || h.guardedAt.IsZero() || h.ending.Load() {
		return // none set, or end's to lift
	}
	h.lift()
}

// stalled reports that the client of a stream duplicates may follow can no
// longer be written to: a write or flush of it failed. The work's later
// writes skip it (each would fail, a stuck one only after h.stall).
func (h *handoff) stalled() bool {
	return h.failed && h.live != nil && isStream(h.header)
}

func (h *handoff) Header() http.Header { return h.header }

func (h *handoff) WriteHeader(code int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.writeHeader(code)
}

func (h *handoff) writeHeader(code int) {
	if h.live != nil {
		h.live.start(code, h.header)
	}
	if h.ended || h.wrote {
		return
	}
	dst := h.w.Header()
	for k, v := range h.header {
		dst[k] = v
	}
	h.w.WriteHeader(code)
	h.wrote = true
}

func (h *handoff) Write(b []byte) (int, error) { return h.write(b, false) }

// WriteKept is Write for bytes that are never changed again
// (proxy.KeptWriter): the live stream keeps them rather than a copy.
func (h *handoff) WriteKept(b []byte) (int, error) { return h.write(b, true) }

func (h *handoff) write(b []byte, kept bool) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.writeLocked(b, kept)
}

// WriteWhole writes a JSON answer's status line and body under one hold
// of the lock (proxy.WholeWriter), and marks it delivered when both
// reached net/http: the client's deadline, which takes the same lock, then
// finds either nothing written (and answers 504 itself) or the whole
// answer, which goes out as the handler returns — never a status line
// without its body, which it could only cut.
func (h *handoff) WriteWhole(status int, body []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.writeHeader(status)
	if _, err := h.writeLocked(body, false); err == nil && !h.ended && !h.failed {
		h.markDelivered()
	}
}

// writeLocked is write; the caller holds mu.
func (h *handoff) writeLocked(b []byte, kept bool) (int, error) {
	if h.live != nil {
		h.live.start(http.StatusOK, h.header)
		h.live.write(b, kept)
	}
	if h.ended {
		h.failed = true
		return h.written(len(b), http.ErrHandlerTimeout)
	}
	if h.stalled() {
		return len(b), nil
	}
	h.writeHeader(http.StatusOK)
	h.guard()
	h.beginWrite()
	n, err := h.w.Write(b)
	h.endWrite()
	h.unguard()
	if err != nil {
		h.failed = true
		return h.written(n, err)
	}
	return n, err
}

// written is what a write that did not reach the client reports to the
// work: its error — unless duplicates may be following the work (live),
// for whom the work must go on writing all it would have sent; the
// delivery has failed all the same (failed), as deliver reports.
func (h *handoff) written(n int, err error) (int, error) {
	if h.live != nil && isStream(h.header) {
		return n, nil
	}
	return n, err
}

// deliver settles an answer whose last byte the work has written: if every
// write reached the client, the client is still there, what net/http holds
// of the answer flushes to the connection, and the handler has not ended
// the handoff, the client received the answer whole, and settle (the
// commit of a not-stored marker) runs. A write that returned no error says
// only that the bytes reached net/http's buffer: the last of a JSON answer
// may still sit there when the client leaves, so a client gone (its
// context done) or a flush that fails counts as not delivered — its retry
// runs again rather than getting 410 for an answer it never had; so does
// one the handler's deadline cut as it went out (cut: over HTTP/2 the
// stream is reset). The handoff stays held meanwhile, so the handler's
// deadline cannot end it in between: whether the client got the answer and
// what is committed for it are one decision. From then on the answer
// counts as delivered, whatever settle returned. Otherwise settle does not
// run and deliver reports false.
func (h *handoff) deliver(settle func() error) (delivered bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended || h.failed || h.client.Err() != nil {
		return false, nil
	}
	// A stream's last events are flushed here, so a client gone since
	// shows as a failed flush. A JSON answer is not: flushing it would
	// change its framing (a short body loses its Content-Length for
	// chunked encoding); its client's departure shows in its context.
	if isStream(h.w.Header()) {
		h.beginWrite()
		err := proxy.FlushClient(h.w)
		h.endWrite()
		if err != nil && !errors.Is(err, http.ErrNotSupported) {
			h.failed = true
			return false, nil
		}
	}
	if !h.markDelivered() {
		h.failed = true // cut as it was written: it may not have arrived
		return false, nil
	}
	return true, settle()
}

// isStream reports whether h's answer is an SSE stream.
func isStream(h http.Header) bool {
	return strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
}

// Flush flushes the work's writes to the client (http.Flusher).
func (h *handoff) Flush() { _ = h.FlushError() }

// FlushError flushes the work's writes to the client; a flush that fails
// (the client left) fails the delivery as a failed write does. It is what
// http.ResponseController.Flush calls.
func (h *handoff) FlushError() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		h.failed = true
		_, err := h.written(0, http.ErrHandlerTimeout)
		return err
	}
	if h.stalled() {
		return nil
	}
	h.guard()
	h.beginWrite()
	err := proxy.FlushClient(h.w)
	h.endWrite()
	h.unguard()
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		h.failed = true
		_, err = h.written(0, err)
	}
	return err
}

// trailer sets a trailer's value, if the handler has not ended.
func (h *handoff) trailer(k, v string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.live != nil {
		h.live.setTrailer(k, v)
	}
	if !h.ended {
		h.w.Header().Set(k, v)
	}
}

// end stops the work's writes; last, when non-nil, writes the handler's own
// ending first (wrote says whether the status line is out). A write the
// work is blocked in (a client that stopped reading) is cut first with a
// write deadline, so the handler never waits on a stuck client; only a
// write under way is (beginWrite). It reports what last reported — or,
// when the work's answer was delivered whole (deliver), it ends nothing
// and reports delivered: the handler waits for the work, which has
// nothing left to write but its end (a trailer, a last flush). So too
// once the work writes its answer's end (finishing), which is left to go
// out within server.write_stall_timeout.
func (h *handoff) end(last func(w http.ResponseWriter, wrote bool) (abort bool)) (abort, delivered bool) {
	h.ending.Store(true)
	if h.writing.Load() {
		if h.finishing.Load() {
			// A write of the answer's end may be stuck on a client that
			// stopped reading, holding mu: it gets write_stall_timeout.
			h.boundEnd()
		} else {
			h.cut()
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_ = http.NewResponseController(h.w).SetWriteDeadline(time.Time{})
	h.guardedAt = time.Time{}
	if h.delivered() || (h.finishing.Load() && !h.ended && h.settled.Load() != answerCut) {
		if !h.delivered() && h.boundEnd() {
			h.guardedAt = time.Now() // over lifts it
		}
		h.ending.Store(false) // the work's end must not be cut
		return false, true
	}
	if !h.ended && last != nil {
		abort = last(h.w, h.wrote)
	}
	h.ended = true
	return abort, false
}
