package request

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/idempotency"
	"github.com/llmgate/llmgate/gateway/proxy"
	"github.com/llmgate/llmgate/gateway/sse"
)

// liveStream is what a keyed stream's work has written so far — its status
// line, its headers, its body's bytes and, once it has ended, its trailers
// — for duplicates of the key on this replica to join (join): they get
// what was sent at once and the rest as it is sent, the same bytes the
// first client gets, whether or not that client is still there. It keeps
// at most max body bytes; past that it stops, and a joiner still reading
// is cut (such a stream is too large to record, and its retry gets the
// not-stored marker).
type liveStream struct {
	fp  string
	max int

	mu sync.Mutex
	// changed is closed at the next change; nil while no joiner waits
	// (most streams have none, and each change would make a channel).
	changed chan struct{}
	status  int
	header  http.Header
	// body is the bytes written, in chunks: a write goes whole into the
	// last chunk, or into a new one when it does not fit, so that no byte
	// is copied twice (a grown slice copied the whole stream so far) and
	// what a joiner holds is never written again. Kept bytes (a
	// recorder's, which nobody writes again) are a chunk of their own,
	// not copied.
	body    [][]byte
	size    int                // bytes in body
	inline  [liveInline][]byte // body's first chunks, without an allocation
	trailer http.Header
	done    bool
	over    bool
	// saved is the usage the finished stream reported, read once for all
	// its joiners (savedByJoin).
	savedOnce sync.Once
	saved     classify.Tokens
	// aborted: the work ended without its answer whole (a panic): a
	// joiner's response is aborted, never ended as if whole.
	aborted bool
	// unrecordable, when set (watch), reports whether the call's recorder
	// has given up (the stream is over the record limits): such a stream
	// is not committed, so joiners are cut rather than shown its end.
	unrecordable func() bool
	// sealed: the upstream's stream has ended, and what the call sends
	// from now on depends on its settlement; a duplicate arriving now
	// waits for that in the store instead (joinable).
	sealed bool
	// finishing: the call writes its answer's end (handoff.finish): a
	// joiner's deadline no longer ends its response, which follows the
	// call to the end rather than append a 504 after [DONE].
	finishing atomic.Bool
}

func newLiveStream(fp string, max int64) *liveStream {
	l := &liveStream{fp: fp, max: int(max)}
	l.body = l.inline[:0]
	return l
}

// notify wakes the joiners. The caller holds mu.
func (l *liveStream) notify() {
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// start records the status line and headers (the first time only).
func (l *liveStream) start(code int, h http.Header) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.status != 0 || l.done {
		return
	}
	l.status, l.header = code, h.Clone()
	l.notify()
}

// write records body bytes: kept, b itself, which its writer never
// changes again; else a copy.
func (l *liveStream) write(b []byte, kept bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done || l.over || len(b) == 0 {
		return
	}
	switch {
	case l.size+len(b) > l.max || l.unrecordable != nil && l.unrecordable():
		l.over, l.body, l.size, l.inline = true, nil, 0, [liveInline][]byte{}
	case kept:
		// Capacity cut to length: no later write appends to it.
		l.body = append(l.body, b[:len(b):len(b)])
		l.size += len(b)
	default:
		last := len(l.body) - 1
		if last < 0 || cap(l.body[last])-len(l.body[last]) < len(b) {
			// A stream is a few KiB: start there, then double, up to
			// liveChunkMax, never past what may be kept.
			next := liveChunk
			if last >= 0 {
				next = min(2*cap(l.body[last]), liveChunkMax)
			}
			l.body = append(l.body, make([]byte, 0, max(len(b), min(next, l.max-l.size))))
			last++
		}
		l.body[last] = append(l.body[last], b...)
		l.size += len(b)
	}
	l.notify()
}

// The first chunk of a live stream's body, and the most a later one grows
// to (a write larger than that gets a chunk of its own size); liveInline:
// the chunks held before the list of them takes an allocation (each kept
// event is one).
const (
	liveChunk    = 4 << 10
	liveChunkMax = 64 << 10
	liveInline   = 8
)

// reader reads the body written so far, without copying it. The caller
// holds mu; the reader may be used after, as written bytes never change.
func (l *liveStream) reader() (io.Reader, int) {
	rs := make([]io.Reader, len(l.body))
	for i, c := range l.body {
		rs[i] = bytes.NewReader(c)
	}
	return io.MultiReader(rs...), l.size
}

// setTrailer records a trailer's value.
func (l *liveStream) setTrailer(k, v string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.trailer == nil {
		l.trailer = http.Header{}
	}
	l.trailer.Set(k, v)
}

// watch makes the live stream stop (over) once over reports true; over
// is called on the work's goroutine, which owns it.
func (l *liveStream) watch(over func() bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unrecordable = over
}

// abort ends the live stream as not whole.
func (l *liveStream) abort() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.aborted = true
}

// seal stops new joiners; those already following go on to the end.
func (l *liveStream) seal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sealed = true
}

// joinable reports whether a duplicate with fingerprint fp may join.
func (l *liveStream) joinable(fp string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.sealed && !l.done && l.fp == fp
}

// finish marks the work's writes over.
func (l *liveStream) finish() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.done = true
		l.notify()
	}
}

// liveView is what a joiner reads of a liveStream at one moment.
type liveView struct {
	status int
	header http.Header
	more   []byte  // the body's bytes from the joiner's position
	next   livePos // the position after more
	done   bool
	over   bool            // or aborted
	wait   <-chan struct{} // closed at the next change
}

// livePos is a joiner's position in a live stream's body: a chunk, and
// an offset in it. Keeping it, rather than a byte offset, spares a
// joiner of a stream of many small kept chunks a walk over all of them
// at each read.
type livePos struct{ chunk, off int }

// view shows the body's bytes from p: the rest of p's chunk, or, when it
// has been read to its end and a later chunk has begun (so nothing more
// is written to it), the next chunk. The joiner asks again for the rest.
// Appends never touch the bytes shown.
func (l *liveStream) view(p livePos) liveView {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	v := liveView{status: l.status, header: l.header, done: l.done, over: l.over || l.aborted && l.done, wait: l.changed, next: p}
	if l.over {
		return v
	}
	for p.chunk < len(l.body) {
		if c := l.body[p.chunk]; p.off < len(c) {
			v.more = c[p.off:len(c):len(c)]
			v.next = livePos{p.chunk, len(c)}
			break
		}
		if p.chunk+1 == len(l.body) {
			break // the last chunk, read to its end
		}
		p = livePos{p.chunk + 1, 0}
	}
	return v
}

// liveSet is the keyed streams running on this replica, by key.
type liveSet struct {
	mu sync.Mutex
	m  map[cache.Key]*liveStream
}

// add registers l under k, unless k has a stream already (ok false: a
// duplicate of that one, which did not find it a moment ago); remove
// unregisters it.
func (s *liveSet) add(k cache.Key, l *liveStream) (remove func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[cache.Key]*liveStream{}
	}
	if s.m[k] != nil {
		return func() {}, false
	}
	s.m[k] = l
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.m[k] == l {
			delete(s.m, k)
		}
	}, true
}

func (s *liveSet) get(k cache.Key) *liveStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[k]
}

// liveMax is the most body bytes a live stream keeps for joiners: the
// record limit (a larger stream is not recorded either) and a margin.
func (g *Handler) liveMax() int64 {
	return g.cfg.Idempotency.MaxRecordBytes + 64<<10
}

// join serves a duplicate of a keyed stream running on this replica with
// the same fingerprint: once that stream's status line is out, as a 200
// SSE stream, the duplicate gets its headers, every byte sent so far and
// then each as it is sent, and its trailers at its end — one upstream
// call for both. Until the status line is out it waits as a duplicate
// waits for a commit (idempotency.wait_timeout: 409; its own deadline:
// 504). It reports false, having written nothing, when the running call's
// answer is not such a stream: the duplicate then waits for the store.
func (g *Handler) join(x *exchange, kr *idempotency.Request, l *liveStream) (bool, error) {
	w, r, s := x.w, x.req, x.sum
	deadline, stop := g.clientDeadline(x.dl, hooksOf(r.Context()))
	defer stop()
	v := l.view(livePos{})
	if v.status == 0 && !v.done {
		var err error
		if v, err = g.awaitStart(x, l, deadline); err != nil {
			return true, err
		}
	}
	if v.status != http.StatusOK || !strings.HasPrefix(v.header.Get("Content-Type"), "text/event-stream") {
		return false, nil
	}
	g.metrics.IdemEvent("join")
	s.idemEvent, s.class, s.replayed = "join", "replayed", true
	s.upstream = v.header.Get("X-Llmgate-Upstream")
	h := w.Header()
	for k, vv := range v.header {
		h[k] = vv
	}
	h.Set("Idempotent-Replayed", "true")
	h.Set(idempotency.JoinedHeader, "true")
	w.WriteHeader(v.status)
	return true, g.follow(x, kr, l, deadline)
}

// awaitStart waits for a live stream's status line, as Keeper.Claim waits
// for a commit: bounded by idempotency.wait_timeout (409, safe to retry)
// and by the client's deadline (504), counted and logged the same way.
func (g *Handler) awaitStart(x *exchange, l *liveStream, deadline <-chan time.Time) (liveView, error) {
	s := x.sum
	g.metrics.IdemEvent("wait")
	s.idemEvent = "wait"
	timer := time.NewTimer(g.cfg.Idempotency.WaitTimeout.D())
	defer timer.Stop()
	v := l.view(livePos{})
	for v.status == 0 && !v.done {
		select {
		case <-v.wait:
		case <-x.req.Context().Done():
			return v, apierror.ClientGone
		case <-deadline:
			s.class = "client_deadline"
			return v, &apierror.ClientDeadline{Keyed: true}
		case <-timer.C:
			g.metrics.IdemEvent("conflict")
			s.class, s.idemEvent = "idempotency_in_flight", "conflict"
			return v, &apierror.KeyInFlight{}
		}
		v = l.view(livePos{})
	}
	return v, nil
}

// follow copies a live stream to the joiner until it ends.
func (g *Handler) follow(x *exchange, kr *idempotency.Request, l *liveStream, deadline <-chan time.Time) error {
	w, r := x.w, x.req
	var at livePos
	unflushed := false // written since the last flush
	for {
		v := l.view(at)
		if v.over {
			// It outgrew what is kept or recorded, or its work broke:
			// never end it as if whole.
			panic(http.ErrAbortHandler)
		}
		if len(v.more) > 0 {
			if _, err := w.Write(v.more); err != nil {
				return apierror.ClientGone
			}
			at = v.next
			unflushed = true
			continue // the next chunk, if there is one, before a flush
		}
		if unflushed {
			_ = http.NewResponseController(w).Flush()
			unflushed = false
		}
		if v.done {
			l.mu.Lock()
			for k, vv := range l.trailer {
				w.Header()[k] = vv
			}
			l.mu.Unlock()
			g.savedByJoin(kr, v.header.Get("X-Llmgate-Upstream"), l)
			return nil
		}
		select {
		case <-v.wait:
		case <-r.Context().Done():
			return apierror.ClientGone
		case <-deadline:
			hk := hooksOf(r.Context())
			hk.call(hk.Cutting)
			if l.finishing.Load() {
				deadline = nil // the end is out or going out: follow it
				continue
			}
			if endAtClientDeadline(w, true, true, x.call) {
				panic(http.ErrAbortHandler)
			}
			x.sum.class = "client_deadline"
			return nil
		}
	}
}

// savedByJoin counts the tokens a joined stream (l, done) saved, as a
// replay does. The stream is read for its usage once, by its first joiner
// to finish: every joiner copying the whole stream at its end, all at
// once, took a copy of up to max_record_bytes each.
func (g *Handler) savedByJoin(kr *idempotency.Request, upstream string, l *liveStream) {
	l.savedOnce.Do(func() {
		l.mu.Lock()
		body, size := l.reader()
		l.mu.Unlock()
		rd := sse.NewReader(body, size+1)
		defer rd.Release()
		var events [][]byte
		for {
			ev, err := rd.Next()
			if err != nil {
				break
			}
			events = append(events, append([]byte(nil), ev...))
		}
		rec := &cache.Record{Status: http.StatusOK, Stream: true, Events: events}
		l.saved = idempotency.RecordUsage(rec, kr.StreamUsage)
	})
	g.metrics.UsageSaved(upstream, kr.Model, kr.Key.Scope, l.saved)
}

// goLive registers a keyed stream's call for duplicates to join, before
// its claim, so that a duplicate arriving while the claim is taken joins
// too (it waits for the status line; if the claim goes to another request,
// the registration ends with no status and the duplicate waits for the
// store instead). The function returned ends the registration and then
// the stream's record, when the call's writes are over (or its claim
// failed). A call that is not a stream, or whose key has a stream here
// already, gets nil.
func (g *Handler) goLive(cl *proxy.Call, kr *idempotency.Request) (*liveStream, func()) {
	if !cl.Stream {
		return nil, func() {}
	}
	l := newLiveStream(kr.Fingerprint, g.liveMax())
	remove, ok := g.live.add(kr.Key, l)
	if !ok {
		return nil, func() {}
	}
	return l, func() {
		remove()
		l.finish()
	}
}
