package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/sse"
)

// LiveStream is an upstream SSE response being relayed.
type LiveStream struct {
	body   io.ReadCloser
	rd     *sse.Reader
	first  []byte
	timer  *time.Timer
	cancel context.CancelCauseFunc
	ctx    context.Context
	idle   time.Duration
}

func (s *LiveStream) close() {
	s.timer.Stop()
	s.cancel(context.Canceled)
	s.body.Close()
	s.rd.Release()
}

// next returns the next event, resetting the idle timer.
func (s *LiveStream) next() ([]byte, error) {
	s.timer.Reset(s.idle)
	ev, err := s.rd.Next()
	// Time spent writing to a slow client is not upstream idleness.
	s.timer.Stop()
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
	if o.Class != classify.Success && o.Class != "" {
		h.Set("X-Llmgate-Outcome", string(o.Class))
	}
}

// WriteJSON sends a buffered (or prefix-buffered) response as v settled it,
// or, when no upstream produced one, the transport failure's error.
func WriteJSON(w http.ResponseWriter, resp *Response, v outcome.Verdict) error {
	if resp.Status == 0 {
		return &apierror.Transport{Upstream: resp.Upstream.Cfg.Name, Reason: resp.Outcome.Reason, Timeout: resp.Outcome.Timeout}
	}
	h := w.Header()
	for k, vv := range resp.Header {
		h[k] = vv
	}
	SetGatewayHeaders(h, resp.Upstream.Cfg.Name, resp.Outcome)
	if v.NoRetry {
		h.Set("X-Should-Retry", "false")
	}
	if resp.Rest == nil {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
	if resp.Rest != nil {
		defer resp.Rest.Close()
		if _, err := io.Copy(w, resp.Rest); err != nil {
			// Headers are sent: abort, so the client sees a cut response
			// rather than a short one that looks complete.
			panic(http.ErrAbortHandler)
		}
	}
	return nil
}

// RelayStream sends a live upstream stream to the client event by event,
// flushing each as it arrives, and records it when rec is non-nil. It reads
// the upstream to its end even when the client is gone (a keyed stream's
// context is detached from the client, so the result can still be
// committed). trailer, when non-empty, is announced as a trailer. It sets
// resp.Outcome to how the stream ended and closes the stream.
func (p *Proxy) RelayStream(w http.ResponseWriter, clientCtx context.Context, resp *Response, rec *sse.Recorder, start time.Time, trailer string) classify.Outcome {
	s := resp.Stream
	defer s.close()
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
	out := &clientOut{w: w}
	var obs classify.StreamObserver
	obs.Observe(sse.Data(s.first))
	rec.Add(s.first)
	out.send(s.first)
	p.metrics.StreamTTFB(resp.Upstream.Cfg.Name, p.now().Sub(start))

	o := p.relayEvents(s, &obs, rec, out, resp.Status)
	cause := context.Cause(s.ctx)
	// The request's own deadline, or a client that left (unkeyed): nothing
	// the upstream did.
	resp.ctxEnded = errors.Is(cause, context.DeadlineExceeded) || errors.Is(cause, context.Canceled) && clientCtx.Err() != nil
	resp.Outcome = o
	if o.Class.BreakerFailure() {
		p.log.Warn("stream ended early", "upstream", resp.Upstream.Cfg.Name, "class", o.Class, "reason", o.Reason)
	}
	return o
}

// relayEvents relays the events after the first until the stream ends, and
// classifies its end.
func (p *Proxy) relayEvents(s *LiveStream, obs *classify.StreamObserver, rec *sse.Recorder, out *clientOut, status int) classify.Outcome {
	for {
		ev, err := s.next()
		if err == nil {
			obs.Observe(sse.Data(ev))
			rec.Add(ev)
			out.send(ev)
			if obs.SawDone() {
				// [DONE] is the end: what follows (a connection held open,
				// a reset) is not the stream's and must not fail it.
				return obs.Outcome()
			}
			continue
		}
		var o classify.Outcome
		switch {
		case errors.Is(err, io.EOF):
			// A stream that ends without [DONE] was cut short.
			o = classify.Outcome{Class: classify.Transient, Reason: "stream ended without [DONE]", Status: status}
		case errors.Is(err, sse.ErrEventTooLarge):
			o = classify.Outcome{Class: classify.Transient, Reason: "stream event too large", Status: status}
		default:
			o = classify.FromError(err)
		}
		if o.Class.BreakerFailure() {
			msg := "The upstream stream failed before it finished: " + o.Reason + "."
			if o.Timeout {
				msg = "The upstream stream stalled and was ended by the gateway."
			}
			out.send(apierror.StreamEvent(msg, "upstream_stream_error"))
		}
		return o
	}
}

// clientOut writes events to the client, flushing each; after a failed
// write (the client left) it writes nothing more.
type clientOut struct {
	w    http.ResponseWriter
	gone bool
}

func (c *clientOut) send(ev []byte) {
	if c.gone {
		return
	}
	if _, err := c.w.Write(ev); err != nil {
		c.gone = true
		return
	}
	if f, ok := c.w.(http.Flusher); ok {
		f.Flush()
	}
}
