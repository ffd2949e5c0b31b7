package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/sse"
	"github.com/llmgate/llmgate/gateway/tracing"
)

// LiveStream is an upstream SSE response being relayed.
type LiveStream struct {
	body io.ReadCloser
	rd   *sse.Reader
	// up is what rd reads the body through: while the stream is relayed
	// it flushes what was written to the client before an event's first
	// read of the upstream, and times the event against the idle limit.
	up *upstreamReads
	// first is the first event, or for an API with a preamble (Responses,
	// Messages) the events up to and including its first that is more
	// than an announcement.
	first  [][]byte
	api    *API
	timer  *time.Timer
	cancel context.CancelCauseFunc
	ctx    context.Context
	// span is the attempt's, ended when the stream ends.
	span tracing.Attempt
	// ended: the relay saw the stream's terminal event ([DONE], a
	// terminal Responses or Messages event); close then drains the rest.
	ended     bool
	drainWait time.Duration
	// key is the credential the attempt sent: no event relays it
	// (redactKey).
	key secret
}

// First is the events that have arrived and not yet been relayed: the
// first, or a Responses stream's up to its first that is more than an
// announcement (response.created, which carries the id, is among them).
// Valid until the stream is relayed.
func (s *LiveStream) First() [][]byte { return s.first }

func (s *LiveStream) close() {
	s.span.End(0, classify.Outcome{}, nil) // a stream not relayed; a relayed one's span has ended
	if s.ended && !s.up.eof {
		s.drain()
	}
	s.timer.Stop()
	s.cancel(context.Canceled)
	s.body.Close()
	s.rd.Release()
}

// drain reads what is left of a stream that ended with its terminal
// event: normally just the chunked body's last chunk, a few bytes in
// flight behind the event, which the read that brought the event did not
// bring. A body closed before its end closes its connection, and the
// next call dials a new one: at 16 clients on loopback that was ~6% of
// streams, ~10 µs of CPU per stream on average, where the floor proxy,
// which copies to the end, dialled none. The drain waits at most
// drainWait (2 ms: the last chunk is sent as the upstream's handler
// returns) and reads at most drainMax bytes; an upstream that holds its
// connection open after the end, or sends more, loses the connection as
// before. What it reads is not the stream's and is discarded.
func (s *LiveStream) drain() {
	s.timer.Reset(s.drainWait) // cancels the attempt: the read returns
	_, _ = io.CopyN(io.Discard, s.body, drainMax)
}

// The bounds of drain.
const (
	drainWait = 2 * time.Millisecond
	drainMax  = 4 << 10
)

// upstreamReads is the body of a stream as its sse.Reader reads it. Once
// relaying (before set), the first read of the upstream for an event
// flushes what the relay has written to the client — so each event
// reaches the client before the relay waits for the next, with one flush
// for all the events one read brought, not one per event — and starts the
// idle timer, which runs until the event is whole (next stops it): the
// idle limit bounds the wait for an event, not for a byte, so an upstream
// that trickles an event a byte at a time is still ended as stalled.
// Nothing is written to the client while an event is read, so time spent
// writing to a slow client is not upstream idleness.
type upstreamReads struct {
	r      io.Reader
	before func()
	timer  *time.Timer
	idle   time.Duration
	// armed: the idle timer runs for the event being read (set by the
	// event's first read, cleared by next).
	armed bool
	// eof: the body has been read to its end.
	eof bool
}

func (u *upstreamReads) Read(p []byte) (int, error) {
	if u.before != nil && !u.armed {
		u.before()
		u.timer.Reset(u.idle)
		u.armed = true
	}
	n, err := u.r.Read(p)
	if err == io.EOF {
		u.eof = true
	}
	return n, err
}

// next returns the next event; the reads of the upstream it needs are
// timed together, against the idle limit, by upstreamReads.
func (s *LiveStream) next() ([]byte, error) {
	ev, err := s.rd.Next()
	ev = redactKey(ev, s.key)
	if s.up.armed {
		s.timer.Stop()
		s.up.armed = false
	}
	if err != nil {
		if c := context.Cause(s.ctx); c == errIdleTimeout || c == errAttemptTimeout {
			err = c
		}
	}
	return ev, err
}

// SetGatewayHeaders adds the headers llmgate itself contributes to an
// answer.
func SetGatewayHeaders(h http.Header, upstream string, o classify.Outcome) {
	h.Set("X-Llmgate-Upstream", upstream)
	if v := o.Header(); v != "" {
		h.Set("X-Llmgate-Outcome", v)
	}
}

// WriteJSON sends a buffered (or prefix-buffered) response as v settled it,
// or returns the error the client gets instead: the transport failure when
// no upstream answered, or v.Replace. For a body too large to buffer,
// beforeEnd (when non-nil) runs after the last byte is written, with the
// body's size, and before the response ends; if it fails, the response is
// aborted, so the client sees a cut answer rather than a complete one.
func WriteJSON(w http.ResponseWriter, resp *Response, v outcome.Verdict, beforeEnd func(size int64) error) error {
	if v.Replace != nil {
		return v.Replace
	}
	h := w.Header()
	for k, vv := range resp.Header {
		h[k] = vv
	}
	SetGatewayHeaders(h, resp.Upstream.Cfg.Name, resp.Outcome)
	if v.NoRetry {
		apierror.SetRetry(h, false, 0)
	}
	if resp.Rest == nil {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
		if ww, ok := w.(WholeWriter); ok {
			ww.WriteWhole(resp.Status, resp.Body)
			return nil
		}
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
	if resp.Rest != nil {
		defer resp.Rest.Close()
		n, err := copyRest(w, resp.Rest)
		switch {
		case errors.Is(err, ErrClientWrite):
			return err
		case err != nil:
			// The upstream broke off, headers are sent: abort, so the
			// client sees a cut response rather than a short one that
			// looks complete.
			panic(http.ErrAbortHandler)
		}
		if beforeEnd != nil && beforeEnd(int64(len(resp.Body))+n) != nil {
			panic(http.ErrAbortHandler)
		}
	}
	return nil
}

// WholeWriter is a ResponseWriter that takes an answer's status line and
// its whole body in one step, so that nothing can come between them (a
// keyed call's handoff, which the client's deadline may end: an answer
// written whole by then goes out; one whose status line alone was out
// would be cut).
type WholeWriter interface {
	WriteWhole(status int, body []byte)
}

// ErrClientWrite: a write to the client failed (it left, or its deadline
// ended the handler's wait): it did not get the answer whole.
var ErrClientWrite = errors.New("writing to the client failed")

// copyRest copies an upstream body to the client, telling the upstream
// breaking off (its error) from the client failing (ErrClientWrite).
func copyRest(w http.ResponseWriter, rest io.Reader) (int64, error) {
	buf := make([]byte, 32<<10)
	var n int64
	for {
		m, rerr := rest.Read(buf)
		if m > 0 {
			if _, werr := w.Write(buf[:m]); werr != nil {
				return n, fmt.Errorf("%w: %w", ErrClientWrite, werr)
			}
			n += int64(m)
		}
		switch {
		case errors.Is(rerr, io.EOF):
			return n, nil
		case rerr != nil:
			return n, rerr
		}
	}
}

// RelayStream sends a live upstream stream to the client event by event as
// it arrives — what one read of the upstream brought is flushed before the
// next read (upstreamReads) — and records it with how.Recorder. It reads
// the upstream to its end even when the client is gone (a keyed stream's
// context is detached from the client, so the result can still be
// committed).
//
// With how.Hold, the stream's ending is held back in the returned Tail: SDKs
// take a stream that stops after it as complete, so a keyed stream's
// ending must wait for its commit. For a chat stream that is everything
// from the first chunk that carries a finish_reason on (the usage chunk
// and [DONE] included); for a Responses stream, its terminal
// response.completed or response.incomplete event; for a Messages stream,
// everything from the message_delta that carries the stop_reason on
// (message_stop included). It sets resp.Outcome to how the stream ended
// and closes the stream.
func (p *Proxy) RelayStream(w http.ResponseWriter, resp *Response, how Relay) *Tail {
	rec, start, trailer, hold := how.Recorder, how.Start, how.Trailer, how.Hold
	s := resp.Stream
	defer func() {
		s.close()
		resp.Stream, resp.streamed = nil, true
	}()
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	h.Del("Content-Length")
	SetGatewayHeaders(h, resp.Upstream.Cfg.Name, classify.Outcome{})
	if trailer != "" {
		h.Set("Trailer", trailer)
	}
	w.WriteHeader(resp.Status)
	r := newRelay(newClientOut(w), rec, hold, &s.span, s.api)
	s.up.before = r.out.flush
	defer r.out.flush()
	for _, ev := range s.first {
		r.event(ev)
	}
	p.metrics.StreamTTFB(resp.Upstream.Cfg.Name, p.now().Sub(start))

	var o classify.Outcome
	if r.obs.Ended() {
		o = r.done() // a stream whose first event is its end
	} else {
		o = r.rest(s, resp.Status)
	}
	s.ended = r.obs.Ended()
	resp.end = outcome.EndOf(resp.reqCtx)
	resp.Outcome = o
	s.span.End(resp.Status, o, nil)
	if o.Class.BreakerFailure() {
		p.log.Warn("stream ended early", "upstream", resp.Upstream.Cfg.Name, "class", o.Class, "reason", o.Reason)
	}
	return &r.tail
}

// Relay is how RelayStream relays a stream.
type Relay struct {
	// Recorder, when set, records the events as the client receives them.
	Recorder *sse.Recorder
	// Start is when the request began, for the time-to-first-byte metric.
	Start time.Time
	// Trailer, when set, is announced as a trailer.
	Trailer string
	// Hold holds the stream's ending back in the returned Tail.
	Hold bool
}

// relay is one stream on its way to the client.
type relay struct {
	out  *clientOut
	rec  *sse.Recorder
	obs  observer
	api  *API
	hold bool
	tail Tail
	span *tracing.Attempt
	// The observers, one of which obs points at (kept here, so that
	// choosing one allocates nothing).
	observers observers
}

func newRelay(out *clientOut, rec *sse.Recorder, hold bool, span *tracing.Attempt, api *API) *relay {
	r := &relay{out: out, rec: rec, hold: hold, span: span, api: api}
	r.obs = r.observers.of(api.stream.observer)
	r.tail.out, r.tail.api = out, api
	return r
}

// event observes, records and sends (or holds back) one event.
func (r *relay) event(ev []byte) {
	data := sse.Data(ev)
	r.obs.Observe(data)
	r.span.Observe(data)
	kept := r.rec.Add(ev)
	if r.hold && r.obs.tailStarted() {
		if !r.rec.Over() {
			if kept == nil { // not recorded (no recorder)
				kept = append([]byte(nil), ev...)
			}
			// The recorder's copy is never written again: the tail shares it.
			r.tail.events = append(r.tail.events, kept)
			return
		}
		// Too large to record: the stream is not committed, so nothing
		// need wait for a commit (its marker is committed once all of it
		// is out). What was held goes out, and the rest as it comes; held,
		// it grew with the upstream's output, past any record limit (a
		// chat stream's n > 1 choices after the first finished).
		r.tail.Release()
		r.tail.events = nil
	}
	// Flushed before the next read of the upstream. The recorder's copy,
	// when there is one, is never written again: a writer that keeps what
	// it is sent (KeptWriter) holds it rather than a copy of its own.
	if kept != nil {
		r.out.writeKept(kept)
	} else {
		r.out.write(ev)
	}
}

// rest relays the events after the first until the stream ends, and
// classifies its end.
func (r *relay) rest(s *LiveStream, status int) classify.Outcome {
	// The attempt's timeout ends with its first events: from here on only
	// reads of the upstream are timed (upstreamReads), never the writes
	// of events the upstream has sent already (those startStream's reads
	// brought past the first, which rd.Next returns without a read).
	s.timer.Stop()
	for {
		ev, err := s.next()
		if err == nil {
			r.event(ev)
			if r.obs.Ended() {
				// [DONE] (a terminal event) is the end: what follows (a
				// connection held open, a reset) is not the stream's and
				// must not fail it.
				return r.done()
			}
			continue
		}
		if _, chat := r.obs.(*chatObserver); chat && errors.Is(err, io.ErrUnexpectedEOF) && string(sse.Data(ev)) == "[DONE]" {
			// A chat stream's "data: [DONE]" whose blank line never came
			// (the upstream closed first): its end all the same, as the
			// SDKs read it; relayed as it came. (Other APIs end on an
			// event of their own: for them it is a cut, and its bytes are
			// not relayed, so the error event that follows stays whole.)
			r.event(ev)
			return r.done()
		}
		var o classify.Outcome
		switch {
		case errors.Is(err, io.EOF) && r.obs.SawError():
			// The upstream said why it ended: its error event decides.
			o = r.obs.Outcome()
		case errors.Is(err, io.EOF):
			// A stream that ends without [DONE] (a terminal event) was
			// cut short.
			o = classify.Outcome{Class: classify.Transient, Reason: r.api.stream.cutReason, Status: status}
		case errors.Is(err, sse.ErrEventTooLarge):
			o = classify.Outcome{Class: classify.Transient, Reason: "stream event too large", Status: status}
		default:
			o = classify.FromError(err)
		}
		if !outcome.Committable(o) {
			msg := "The upstream stream failed before it finished: " + o.Reason + "."
			if o.Timeout {
				msg = "The upstream stream stalled and was ended by the gateway."
			}
			r.failed(r.api.StreamEvent(msg, "upstream_stream_error"))
		}
		return o
	}
}

// done classifies a stream that reached [DONE]. One that is no answer (an
// error event, a malformed event) and whose tail is held back gets an
// error event to replace the tail: the client must not see a clean end.
func (r *relay) done() classify.Outcome {
	o := r.obs.Outcome()
	if !outcome.Committable(o) && len(r.tail.events) > 0 {
		r.tail.failure = r.api.StreamEvent("The upstream stream failed before it finished: "+o.Reason+".", "upstream_stream_error")
	}
	return o
}

// failed ends a broken stream with exactly one error event: none when the
// upstream already sent one the client saw; held back with the tail when
// there is one (it replaces the tail).
func (r *relay) failed(ev []byte) {
	switch {
	case len(r.tail.events) > 0:
		r.tail.failure = ev
	case !r.obs.SawError():
		r.out.send(ev)
	}
}

// Tail is the held-back end of a keyed stream: released after the commit,
// or replaced by one error event when the stream failed or its commit did.
type Tail struct {
	out     *clientOut
	api     *API
	events  [][]byte
	failure []byte
}

// Held reports whether anything is held back.
func (t *Tail) Held() bool { return len(t.events) > 0 }

// Release sends the held events. They are not flushed here: they are
// the stream's last bytes, flushed with the response's end (the final
// chunk and trailers, one write) or by a delivery check that flushes.
func (t *Tail) Release() {
	for _, ev := range t.events {
		t.out.writeKept(ev) // the recorder's copies, or the relay's own
	}
	t.events = nil
}

// Fail drops the held events and sends ev in their place; with ev nil, the
// stream's own failure event, if it had one.
func (t *Tail) Fail(ev []byte) {
	if ev == nil {
		ev = t.failure
	}
	if ev == nil {
		// Never drop a held tail silently: the client would see a clean end.
		ev = t.api.StreamEvent("The upstream stream did not end with an answer.", "upstream_stream_error")
	}
	if t.events != nil {
		t.out.send(ev)
	}
	t.events = nil
}

// clientOut writes events to the client; after a failed write or flush
// (the client left) it writes nothing more.
type clientOut struct {
	w http.ResponseWriter
	// kept is w as a KeptWriter, when it is one.
	kept KeptWriter
	gone bool
	// unflushed: written since the last flush.
	unflushed bool
}

func newClientOut(w http.ResponseWriter) *clientOut {
	kw, _ := w.(KeptWriter)
	return &clientOut{w: w, kept: kw}
}

// KeptWriter is a client's writer that may keep the bytes WriteKept is
// given rather than copy them (a keyed stream's, which keeps what it sent
// for duplicates that join it): their writer never changes them again.
type KeptWriter interface {
	http.ResponseWriter
	WriteKept(b []byte) (int, error)
}

// send writes ev and flushes it.
func (c *clientOut) send(ev []byte) {
	c.write(ev)
	c.flush()
}

// write writes ev, to be flushed by the next flush.
func (c *clientOut) write(ev []byte) {
	if c.gone {
		return
	}
	if _, err := c.w.Write(ev); err != nil {
		c.gone = true
		return
	}
	c.unflushed = true
}

// writeKept writes ev, which is never changed again, as write does.
func (c *clientOut) writeKept(ev []byte) {
	if c.kept == nil || c.gone {
		c.write(ev)
		return
	}
	if _, err := c.kept.WriteKept(ev); err != nil {
		c.gone = true
		return
	}
	c.unflushed = true
}

// flush flushes what was written since the last flush, if anything.
func (c *clientOut) flush() {
	if c.gone || !c.unflushed {
		return
	}
	c.unflushed = false
	if err := FlushClient(c.w); err != nil && !errors.Is(err, http.ErrNotSupported) {
		c.gone = true
	}
}

// FlushClient flushes w to the client and reports whether that failed (the
// client left): http.ErrNotSupported when nothing below w can flush. Unlike
// http.ResponseController it looks below a writer that only forwards
// Flush (echo's Response has Flush, which drops the error, and Unwrap):
// the error is what tells a client that left from one that got the bytes.
func FlushClient(w http.ResponseWriter) error {
	for {
		switch t := w.(type) {
		case interface{ FlushError() error }:
			return t.FlushError()
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		case http.Flusher:
			t.Flush()
			return nil
		default:
			return http.ErrNotSupported
		}
	}
}
