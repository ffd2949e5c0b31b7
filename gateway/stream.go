package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/classify"
)

// CommittedTrailer ends a keyed stream: "true" when it was committed and a
// retry with its key will replay it, "false" when it was served but not
// committed (cut short, failed, or over the record limits).
const CommittedTrailer = "X-Llmgate-Committed"

// recorder keeps the exact bytes of each SSE event of a keyed stream, up to
// the configured limits. A stream over a limit is still relayed in full but
// is not committed.
type recorder struct {
	events    [][]byte
	size      int64
	maxBytes  int64
	maxEvents int
	over      bool
}

func (r *recorder) add(ev []byte) {
	if r == nil || r.over {
		return
	}
	if len(r.events)+1 > r.maxEvents || r.size+int64(len(ev)) > r.maxBytes {
		r.over = true
		r.events = nil
		return
	}
	r.size += int64(len(ev))
	r.events = append(r.events, append([]byte(nil), ev...))
}

// streamErrorEvent is the SSE event that ends a stream the upstream broke
// after its first byte reached the client: OpenAI's error shape, so SDKs
// raise an error instead of seeing a clean-looking end with no [DONE].
func streamErrorEvent(msg, code string) []byte {
	b := errorBody(&apiError{Type: "server_error", Code: code, Message: msg})
	out := make([]byte, 0, len(b)+8)
	out = append(out, "data: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// relayStream sends a live upstream stream to the client event by event,
// flushing each as it arrives, and records it when rec is non-nil. It reads
// the upstream to its end even when the client is gone if the stream is
// keyed (the work context is then detached from the client), so the result
// can still be committed. It reports the outcome to the breaker and returns
// it; the stream is closed on return.
func (g *Gateway) relayStream(c echo.Context, resp *response, rec *recorder, start time.Time) classify.Outcome {
	s := resp.stream
	defer s.close()
	w := c.Response()
	h := w.Header()
	for k, v := range resp.header {
		h[k] = v
	}
	h.Del("Content-Length")
	setGatewayHeaders(h, resp.upstream.cfg.Name, classify.Outcome{})
	if rec != nil {
		// Whether a keyed stream was committed is known only at its end:
		// it is sent as a trailer.
		h.Set("Trailer", CommittedTrailer)
	}
	w.WriteHeader(resp.status)

	var obs classify.StreamObserver
	clientGone := false
	send := func(ev []byte) {
		if clientGone {
			return
		}
		if _, err := w.Write(ev); err != nil {
			clientGone = true
			return
		}
		w.Flush()
	}
	obs.Observe(eventData(s.first))
	rec.add(s.first)
	send(s.first)
	g.metrics.streamTTFB(resp.upstream.cfg.Name, g.now().Sub(start))

	var outcome classify.Outcome
	for {
		ev, err := s.next()
		if err == nil {
			obs.Observe(eventData(ev))
			rec.add(ev)
			send(ev)
			if obs.SawDone() {
				// [DONE] is the end: what follows (a connection held open,
				// a reset) is not the stream's and must not fail it.
				outcome = obs.Outcome()
				break
			}
			continue
		}
		switch {
		case errors.Is(err, io.EOF):
			// A stream that ends without [DONE] was cut short.
			outcome = classify.Outcome{Class: classify.Transient, Reason: "stream ended without [DONE]", Status: resp.status}
		case errors.Is(err, errEventTooLarge):
			outcome = classify.Outcome{Class: classify.Transient, Reason: "stream event too large", Status: resp.status}
		default:
			outcome = classify.FromError(err)
		}
		if outcome.Class.BreakerFailure() {
			msg := "The upstream stream failed before it finished: " + outcome.Reason + "."
			if outcome.Timeout {
				msg = "The upstream stream stalled and was ended by the gateway."
			}
			send(streamErrorEvent(msg, "upstream_stream_error"))
		}
		break
	}
	if resp.done != nil {
		res := breakerResult(outcome)
		if errors.Is(context.Cause(s.ctx), context.DeadlineExceeded) || errors.Is(context.Cause(s.ctx), context.Canceled) && c.Request().Context().Err() != nil {
			// The request's own deadline, or an unkeyed client that left:
			// nothing the upstream did.
			res = breaker.Excluded
		}
		resp.done(res, string(outcome.Class))
	}
	resp.outcome = outcome
	if info := infoOf(c); info != nil {
		info.outcome = string(outcome.Class)
	}
	if outcome.Class.BreakerFailure() {
		g.log.Warn("stream ended early", "upstream", resp.upstream.cfg.Name, "class", outcome.Class, "reason", outcome.Reason)
	}
	return outcome
}

// replayRecord writes a committed record back to the client: the same
// status, headers and bytes; for a stream, the same events in order, each
// flushed.
func replayRecord(w *echo.Response, rec *cache.Record) {
	h := w.Header()
	for k, v := range rec.Header {
		h[k] = v
	}
	h.Set("X-Llmgate-Upstream", rec.Upstream)
	h.Set("Idempotent-Replayed", "true")
	if rec.Stream {
		h.Del("Content-Length")
		if h.Get("Content-Type") == "" {
			h.Set("Content-Type", "text/event-stream")
		}
		w.WriteHeader(rec.Status)
		for _, ev := range rec.Events {
			if _, err := w.Write(ev); err != nil {
				return
			}
			w.Flush()
		}
		return
	}
	h.Set("Content-Length", strconv.Itoa(len(rec.Body)))
	w.WriteHeader(rec.Status)
	_, _ = w.Write(rec.Body)
}

var _ http.Flusher = (*echo.Response)(nil)
