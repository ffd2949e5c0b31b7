package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/retry"
)

// call is one client request on its way through the retry layer.
type call struct {
	in       *http.Request
	ep       endpoint
	body     []byte
	rt       routing
	idemKey  string // forwarded to the upstream when set
	deadline time.Time
	// tried lists the upstreams the call reached or was refused by, in
	// order, for its dead letter.
	tried []string
}

// response is what an upstream produced for a call: a buffered body, a
// buffered prefix with the rest still to copy (too large to buffer), or a
// live stream whose first event has arrived.
type response struct {
	upstream *upstream
	status   int
	header   http.Header
	body     []byte
	rest     io.ReadCloser
	stream   *liveStream
	outcome  classify.Outcome
	attempts int
	// done reports the request's outcome to the upstream's breaker. For a
	// stream it is called when the stream ends; otherwise execute has
	// already called it and it is nil.
	done func(breaker.Result, string)
}

func (r *response) discard() {
	if r == nil {
		return
	}
	if r.rest != nil {
		r.rest.Close()
		r.rest = nil
	}
	if r.stream != nil {
		r.stream.close()
		r.stream = nil
	}
}

// liveStream is an upstream SSE response being relayed.
type liveStream struct {
	body   io.ReadCloser
	rd     *sseReader
	first  []byte
	timer  *time.Timer
	cancel context.CancelCauseFunc
	ctx    context.Context
	idle   time.Duration
}

func (s *liveStream) close() {
	s.timer.Stop()
	s.cancel(context.Canceled)
	s.body.Close()
	s.rd.release()
}

// next returns the next event, resetting the idle timer.
func (s *liveStream) next() ([]byte, error) {
	s.timer.Reset(s.idle)
	ev, err := s.rd.next()
	// Time spent writing to a slow client is not upstream idleness.
	s.timer.Stop()
	if err != nil {
		if c := context.Cause(s.ctx); c == errIdleTimeout || c == errAttemptTimeout {
			err = c
		}
	}
	return ev, err
}

var (
	errAttemptTimeout = timeoutError("upstream timed out")
	errIdleTimeout    = timeoutError("upstream stream idle timeout")
)

// timeoutError is a net.Error-shaped timeout, so classify sees a timeout.
type timeoutError string

func (e timeoutError) Error() string   { return string(e) }
func (e timeoutError) Timeout() bool   { return true }
func (e timeoutError) Temporary() bool { return true }

// breakerResult maps an outcome to what the breaker learns: the provider
// answered (success, permanent, filtered, empty), it failed transiently, or
// the client went away and the request says nothing about the provider.
func breakerResult(o classify.Outcome) breaker.Result {
	switch {
	case o.Class.Excluded():
		return breaker.Excluded
	case o.Class.BreakerFailure():
		return breaker.Failure
	default:
		return breaker.Success
	}
}

// execute runs c against the upstream chain: for each upstream, its breaker
// decides whether to try at all, and the one retry loop decides how often.
// It returns the response to give the client, or an *apiError when no
// upstream produced one.
func (g *Gateway) execute(ctx context.Context, c *call, primary *upstream) (*response, error) {
	// Live traffic for the retry budget: requests that reach an upstream
	// (replays and rejections do not).
	g.budget.Request()
	var last *response
	var lastErr error
	for i, u := range primary.chain() {
		if i > 0 {
			if !c.deadline.IsZero() && !g.now().Before(c.deadline) {
				break
			}
			g.metrics.fallback(primary.cfg.Name, u.cfg.Name)
		}
		c.tried = append(c.tried, u.cfg.Name)
		done, err := g.breakers.Allow(u.cfg.Name)
		if err != nil {
			var oe *breaker.OpenError
			if errors.As(err, &oe) {
				g.metrics.breakerRejected(u.cfg.Name)
				lastErr = &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "upstream_unavailable",
					Message:    fmt.Sprintf("Upstream %s is unavailable: its circuit breaker is open. Retry after the Retry-After interval.", u.cfg.Name),
					RetryAfter: oe.RetryAfter, Err: err}
				continue
			}
			return nil, err
		}
		var resp *response
		loop := g.retryLoop(u.cfg.Name)
		outcome, stats := loop.Run(ctx, c.deadline, func(actx context.Context, n int) classify.Outcome {
			resp.discard()
			resp = g.attempt(actx, c, u)
			g.metrics.attempt(u.cfg.Name, resp.outcome)
			return resp.outcome
		})
		resp.attempts = stats.Attempts
		if stats.Stop == retry.StopBudget {
			g.metrics.budgetRejected(u.cfg.Name)
		}
		if resp.stream != nil {
			resp.done = done
			return resp, nil
		}
		res := breakerResult(outcome)
		if ctx.Err() != nil {
			// The request's own deadline or client, not the upstream: a
			// client with a short X-Llmgate-Deadline must not be able to
			// open the breaker for everyone.
			res = breaker.Excluded
		}
		done(res, string(outcome.Class))
		if outcome.Class.Retryable() && ctx.Err() == nil && stats.Stop != retry.StopDeadline && stats.Stop != retry.StopCanceled {
			// Retries ended transient: the next upstream in the chain, if
			// any, gets its turn; the deadline still bounds the whole.
			last.discard()
			last = resp
			lastErr = nil
			continue
		}
		last.discard()
		return resp, nil
	}
	if last != nil {
		return last, nil
	}
	if lastErr == nil {
		lastErr = &apiError{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "deadline_exceeded",
			Message: "The request's deadline passed before an upstream could be tried."}
	}
	return nil, lastErr
}

// attempt sends one request to u. It never retries.
func (g *Gateway) attempt(ctx context.Context, c *call, u *upstream) *response {
	resp := &response{upstream: u}
	actx, cancel := context.WithCancelCause(ctx)
	// One timer bounds the attempt until its response (for a stream, its
	// first event) and then, for a stream, the gap between events.
	timer := time.AfterFunc(u.timeout, func() { cancel(errAttemptTimeout) })
	fail := func(err error) *response {
		timer.Stop()
		cancel(context.Canceled)
		// Whatever status came before the failure is not the answer.
		resp.status, resp.header, resp.body = 0, nil, nil
		if cause := context.Cause(actx); cause == errAttemptTimeout || cause == errIdleTimeout {
			err = cause
		}
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		resp.outcome = classify.FromError(err)
		return resp
	}
	req, err := u.newUpstreamRequest(actx, c.in, c.ep.suffix, c.body, c.idemKey)
	if err != nil {
		return fail(err)
	}
	res, err := u.client.Do(req)
	if err != nil {
		return fail(err)
	}
	resp.status = res.StatusCode
	resp.header = responseHeaders(res.Header)
	if res.StatusCode < 200 || res.StatusCode > 299 {
		body, err := io.ReadAll(io.LimitReader(res.Body, maxErrorBody))
		res.Body.Close()
		if err != nil && len(body) == 0 {
			return fail(err)
		}
		timer.Stop()
		cancel(context.Canceled)
		resp.body = body
		resp.outcome = classify.FromResponse(res.StatusCode, res.Header, body, g.now())
		return resp
	}
	if c.rt.Stream && strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		rd := newSSEReader(res.Body, g.cfg.maxEventBytes())
		first, err := rd.next()
		if err != nil {
			res.Body.Close()
			rd.release()
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fail(err)
		}
		resp.stream = &liveStream{body: res.Body, rd: rd, first: append([]byte(nil), first...),
			timer: timer, cancel: cancel, ctx: actx, idle: g.cfg.Limits.StreamIdleTimeout.D()}
		resp.outcome = classify.Outcome{Class: classify.Success, Status: res.StatusCode}
		return resp
	}
	limit := g.cfg.Idempotency.MaxRecordBytes
	body, err := io.ReadAll(io.LimitReader(res.Body, limit+1))
	if err != nil {
		res.Body.Close()
		return fail(err)
	}
	if int64(len(body)) > limit {
		// Too large to buffer: relay the prefix and copy the rest as it
		// comes. It is not classified from its content, nor committed.
		resp.body = body
		resp.rest = &cancelOnClose{ReadCloser: res.Body, cancel: func() { timer.Stop(); cancel(context.Canceled) }}
		resp.outcome = classify.Outcome{Class: classify.Success, Status: res.StatusCode}
		return resp
	}
	res.Body.Close()
	timer.Stop()
	cancel(context.Canceled)
	resp.body = body
	if c.ep.completion {
		resp.outcome = classify.FromCompletion(body)
		resp.outcome.Status = res.StatusCode
	} else {
		resp.outcome = classify.Outcome{Class: classify.Success, Status: res.StatusCode}
	}
	return resp
}

// maxErrorBody bounds what is read of an upstream error response.
const maxErrorBody = 1 << 20

type cancelOnClose struct {
	io.ReadCloser
	cancel func()
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

func (g *Gateway) retryLoop(upstreamName string) *retry.Loop {
	return &retry.Loop{
		Policy: retry.Policy{
			MaxAttempts: g.cfg.Retry.MaxAttempts,
			BaseDelay:   g.cfg.Retry.BaseDelay.D(),
			MaxDelay:    g.cfg.Retry.MaxDelay.D(),
		},
		Budget:   g.budget,
		Shutdown: g.shutdown,
		OnRetry: func(n int, o classify.Outcome, wait time.Duration) {
			g.metrics.retry(upstreamName, o)
			g.log.Debug("retrying", "upstream", upstreamName, "attempt", n, "class", o.Class, "reason", o.Reason, "wait", wait)
		},
	}
}
