// Package proxy sends a request to its upstream chain and relays the
// answer: for each upstream, its circuit breaker decides whether to try at
// all, the one retry loop (package retry) decides how often, and each
// attempt sends the body exactly as the client wrote it. It relays JSON
// bodies and SSE streams byte for byte.
//
// It takes http.ResponseWriter and *http.Request, never echo types; it
// does not know of idempotency keys beyond forwarding one, nor of the store.
// How a request ends (commit, breaker, dead letter) is package outcome's to
// decide: Execute reports breaker results for upstreams it passed over, and
// leaves the final one to the caller's Settle.
package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/metrics"
	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/retry"
	"github.com/llmgate/llmgate/gateway/tracing"
)

// Options configure a Proxy. Router, Breakers, Budget and Metrics are
// required.
type Options struct {
	Config   config.Config
	Router   *Router
	Breakers *breaker.Registry
	Budget   *retry.Budget
	Metrics  *metrics.Metrics
	// Logger: if nil, logs are discarded.
	Logger *slog.Logger
	// Now is the clock. If nil, time.Now.
	Now func() time.Time
	// Shutdown, when closed, ends every retry wait.
	Shutdown <-chan struct{}
	// Tracer makes a span per attempt. If nil, tracing is off.
	Tracer *tracing.Tracer
}

// Proxy executes calls against upstream chains.
type Proxy struct {
	cfg      config.Config
	router   *Router
	breakers *breaker.Registry
	budget   *retry.Budget
	metrics  *metrics.Metrics
	log      *slog.Logger
	now      func() time.Time
	shutdown <-chan struct{}
	tracer   *tracing.Tracer
	// drainWait bounds the drain of a stream's end (LiveStream.drain);
	// tests lengthen it.
	drainWait time.Duration
}

// New returns a Proxy.
func New(o Options) *Proxy {
	p := &Proxy{cfg: o.Config, router: o.Router, breakers: o.Breakers, budget: o.Budget,
		metrics: o.Metrics, log: o.Logger, now: o.Now, shutdown: o.Shutdown, tracer: o.Tracer,
		drainWait: drainWait}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.now == nil {
		p.now = time.Now
	}
	return p
}

// Call is one client request on its way through the retry layer.
type Call struct {
	In *http.Request
	// Suffix is appended to an upstream's base_url ("/chat/completions"),
	// escaped as it is sent: a segment's "/" is "%2F".
	Suffix string
	// API is the provider API the endpoint speaks: how a 2xx body is
	// classified, how a stream ends. If nil, Plain.
	API  *API
	Body []byte
	// Source, when set, is the body instead of Body: spooled to a file, or
	// read once from the client (then the call makes one attempt, at the
	// primary upstream only).
	Source *Body
	// Query is the client's query string, forwarded (passthrough
	// endpoints); empty for the completion endpoints, which take none.
	Query string
	// RecordLimit bounds the 2xx body buffered (to classify and commit);
	// past it the body is relayed as it arrives. If <= 0,
	// idempotency.max_record_bytes.
	RecordLimit int64
	// Unbuffered relays a 2xx body as it arrives, from its first byte
	// (an unkeyed passthrough: audio, file contents).
	Unbuffered bool
	// Passthrough: the answer is no completion or embedding, and carries
	// no token usage to count.
	Passthrough bool
	// Model is the body's model, for logs, dead letters and its breaker.
	Model string
	// Lane is the route family ("files") of a request whose body names no
	// model: its breaker (breaker.Lane), so that such failures never open
	// the upstream's own breaker, which refuses every model.
	Lane   string
	Stream bool
	// IdemKey is forwarded to the upstream when set.
	IdemKey string
	// Lease is a keyed call's claim on its key (nil for other calls):
	// once its channel is closed another owner holds the key, so no answer
	// of this call can be committed, and no retry or fallback is made.
	Lease retry.Abandoner
	// Hops are the request's plan: the upstreams Execute may send it to,
	// in order, each with its credential and body (see Hop). The first is
	// the routed upstream (or the one holding the objects the request
	// names); the rest are the fallbacks the plan kept.
	Hops []Hop
	// Tenant, when set, is sent as X-Llmgate-Tenant: the opaque id of the
	// tenant the call is made for, by which a chained llmgate narrows its
	// scope (see request.TenantHeader).
	Tenant string
	// Client is the client the call is made for ("": none configured),
	// whose share of a bound shared by clients it counts against (the
	// models an upstream learns breakers for).
	Client string
	// Deadline: no attempt or fallback starts after it. ClientDeadline
	// says it is the client's own (X-Llmgate-Deadline), not the
	// operator's: a retry it stops says nothing about the upstream.
	Deadline       time.Time
	ClientDeadline bool
	// Tried lists the upstreams the call reached or was refused by, in
	// order, for its dead letter.
	Tried []string
	// Runs are the attempts a provider billed (it answered 2xx) that a
	// retry or a fallback then replaced: a 2xx with no usable answer, a
	// stream cut before its first event. The response Execute returns is
	// not among them (see Response.Billed).
	Runs []Run
	// backoff is the wait before the attempt about to start, for its span.
	backoff time.Duration
}

// Response is what an upstream produced for a call: a buffered body, a
// buffered prefix with the rest still to copy (too large to buffer), a live
// stream whose first event has arrived, or — Status 0 — no answer at all
// (Outcome says why).
type Response struct {
	Upstream *Upstream
	// Hop is the hop that produced it (Upstream is its upstream).
	Hop    Hop
	Status int
	Header http.Header
	Body   []byte
	// Rest, when set, is the remainder of a body too large to buffer.
	Rest io.ReadCloser
	// Stream, when set, is a live SSE stream.
	Stream *LiveStream
	// Abandoned: the call made no further attempt or fallback after this
	// failure because its key was taken over (Call.Lease).
	Abandoned bool
	// streamed: Stream was relayed (and is closed now).
	streamed bool
	Outcome  classify.Outcome
	Attempts int
	// reqCtx is the context Execute ran under; end is what ended it, if
	// anything did, when the answer was settled.
	reqCtx context.Context
	end    outcome.End
	// done reports the outcome to the upstream's breaker; Report calls it.
	done func(breaker.Result, string)
	// billed: the upstream answered 2xx, so the provider billed the run,
	// even if what followed was no answer (the attempt failed after).
	billed bool
	// connFailure: the attempt got no HTTP answer for a reason of the
	// connection's (see connectionLevel).
	connFailure bool
}

// Run is one billed provider run: its upstream and the usage it
// reported (Reported false: none).
type Run struct {
	Upstream string
	Usage    classify.Tokens
}

// Billed reports whether the provider billed the run that produced r: it
// answered 2xx, whatever came after.
func (r *Response) Billed() bool { return r != nil && r.billed }

// replaced adds r (nil: none) to c.Runs if it was billed, and discards
// it: a later answer, or none, takes its place.
func (c *Call) replaced(r *Response) {
	defer r.Discard()
	if !r.Billed() {
		return
	}
	u := r.Outcome.Usage
	if r.Status >= 200 && r.Status <= 299 && r.Stream == nil && r.Rest == nil {
		u = c.api().Usage(r.Body, r.Outcome)
	}
	c.Runs = append(c.Runs, Run{Upstream: r.Upstream.Cfg.Name, Usage: u})
}

// allow asks upstream's breakers to let c through: its model's, else its
// lane's, else the upstream's own.
func (c *Call) allow(b *breaker.Registry, upstream string) (func(breaker.Result, string), error) {
	if c.Model == "" && c.Lane != "" {
		return b.AllowLane(upstream, c.Lane)
	}
	return b.AllowFor(c.Client, upstream, c.Model)
}

// Result is the settle input for this response (after a stream's end).
func (r *Response) Result(tried []string) outcome.Result {
	res := outcome.Result{Outcome: r.Outcome, Upstream: r.Upstream.Cfg.Name, Status: r.Status, Unrecordable: r.Rest != nil,
		End: r.end, Streamed: r.Streamed(), Attempts: r.Attempts, Tried: tried}
	if r.Status >= 300 {
		// The client's error, if Settle replaces the answer, is made of
		// it, with the headers a relayed one would carry.
		res.Body, res.Header = r.Body, r.Header.Clone()
		if res.Header == nil {
			res.Header = http.Header{}
		}
		SetGatewayHeaders(res.Header, r.Upstream.Cfg.Name, r.Outcome)
	}
	return res
}

// api is c's API: Plain when the endpoint names none.
func (c *Call) api() *API {
	if c.API == nil {
		return Plain
	}
	return c.API
}

// StreamEvent is the one error event ending a stream of c's API early.
func (c *Call) StreamEvent(msg, code string) []byte { return c.api().StreamEvent(msg, code) }

// FingerprintedHeaders are the client's request headers the call's API
// fingerprints besides the body (anthropic-version, anthropic-beta), as
// sent; nil when there are none.
func (c *Call) FingerprintedHeaders() http.Header {
	var h http.Header
	for _, name := range c.api().Fingerprinted() {
		if v := c.In.Header.Values(name); len(v) > 0 {
			if h == nil {
				h = http.Header{}
			}
			h[name] = v
		}
	}
	return h
}

// WriteError writes err to w in the shape of the call's API.
func (c *Call) WriteError(w http.ResponseWriter, err error) *apierror.Error {
	return c.api().WriteError(w, err)
}

// Usage is the token usage resp reported: its stream's, or its body's as
// c's API reads it. A body too large to buffer was never read whole, and
// reports none.
func (c *Call) Usage(resp *Response) classify.Tokens {
	if resp.Streamed() || resp.Rest != nil {
		return resp.Outcome.Usage
	}
	return c.api().Usage(resp.Body, resp.Outcome)
}

// Streamed reports whether the response was a stream (now relayed).
func (r *Response) Streamed() bool { return r.Stream != nil || r.streamed }

// Report tells the upstream's breaker what the settled request says. Call
// it once, after Settle.
func (r *Response) Report(v outcome.Verdict) {
	if r.done != nil {
		r.done(r.breakerResult(v.Breaker), string(r.Outcome.Class))
		r.done = nil
	}
}

// breakerResult is res, a ConnectionFailure when the failure is one in
// which the upstream never answered (see connectionLevel): the breakers
// count it against the upstream as a whole, not its model.
func (r *Response) breakerResult(res breaker.Result) breaker.Result {
	if res == breaker.Failure && r.connFailure {
		return breaker.ConnectionFailure
	}
	return res
}

// Discard releases a response that will not be relayed.
func (r *Response) Discard() {
	if r == nil {
		return
	}
	if r.Rest != nil {
		r.Rest.Close()
		r.Rest = nil
	}
	if r.Stream != nil {
		r.Stream.close()
		r.Stream = nil
	}
}

// Execute walks c's hops in order. It returns the response to give the
// client, or a typed error (package apierror) when no upstream produced
// one. The last upstream's breaker learns the outcome when the caller
// calls Report.
func (p *Proxy) Execute(ctx context.Context, c *Call) (*Response, error) {
	// Live traffic for the retry budget: requests that reach an upstream
	// (replays and rejections do not).
	p.budget.Request()
	var last *Response
	var lastErr error
	for i, hop := range c.Hops {
		u := hop.Upstream
		if i > 0 {
			if !p.mayFallBack(c, last) {
				break
			}
			p.metrics.Fallback(c.Hops[0].Upstream.Cfg.Name, u.Cfg.Name)
			tracing.Fallback(ctx, c.Tried[len(c.Tried)-1], u.Cfg.Name)
		}
		c.Tried = append(c.Tried, u.Cfg.Name)
		done, err := c.allow(p.breakers, u.Cfg.Name)
		if err != nil {
			var oe *breaker.OpenError
			if errors.As(err, &oe) {
				p.metrics.BreakerRejected(u.Cfg.Name, oe.Model)
				tracing.BreakerRejected(ctx, u.Cfg.Name, oe.RetryAfter)
				lastErr = &apierror.BreakerOpen{Upstream: u.Cfg.Name, Model: oe.Model, RetryAfter: oe.RetryAfter, Err: err}
				continue
			}
			// No answer: the run before it, if any, is charged and its
			// body closed, as a run a later hop replaces is.
			c.replaced(last)
			return nil, err
		}
		resp, stop := p.runUpstream(ctx, c, hop)
		resp.done, resp.reqCtx, resp.Abandoned = done, ctx, stop == retry.StopAbandoned
		if resp.Stream != nil {
			// A billed run of an upstream before it (a stream cut before
			// its first event) is charged too.
			c.replaced(last)
			return resp, nil
		}
		resp.end = p.endOf(ctx, c, stop, resp.Outcome)
		if resp.Outcome.Class.Retryable() && resp.end == outcome.EndNone && stop != retry.StopDeadline && stop != retry.StopCanceled && stop != retry.StopAbandoned {
			// Retries ended transient: the next upstream in the chain, if
			// any, gets its turn; the deadline still bounds the whole. This
			// upstream's breaker learns now, by the same rule Settle uses.
			resp.done(resp.breakerResult(outcome.Breaker(resp.Outcome, outcome.EndNone, false)), string(resp.Outcome.Class))
			resp.done = nil
			c.replaced(last)
			last = resp
			lastErr = nil
			continue
		}
		c.replaced(last)
		return resp, nil
	}
	if last != nil {
		return last, nil
	}
	if lastErr == nil {
		lastErr = &apierror.DeadlineSpent{}
	}
	return nil, lastErr
}

// mayFallBack reports whether c may go on to its next hop after last (nil
// when no upstream answered): not when its body was sent once and is gone,
// when its key was taken over (no answer of it can be committed any more:
// last is marked Abandoned), or past its deadline.
func (p *Proxy) mayFallBack(c *Call, last *Response) bool {
	switch {
	case !c.resendable():
		return false
	case c.taken():
		if last != nil {
			last.Abandoned = true
		}
		return false
	}
	return c.Deadline.IsZero() || p.now().Before(c.Deadline)
}

// taken reports whether the call's key was taken over (Lease).
func (c *Call) taken() bool { return retry.Abandoned(c.Lease) }

// endOf says what, other than the upstream, ended a call: its context, or
// the retry loop stopping for the client's deadline (the next wait would
// pass it) or for shutdown (every wait ends). last is the last attempt's
// outcome: one that timed out on its own (the upstream's timeout, not the
// context's) is the upstream's, whatever the retry loop did next — a keyed
// call runs on past its client's deadline, and an upstream that hangs to
// its timeout there fails as it does with max_attempts 1; only a retry the
// client's deadline stopped after an answer says nothing about it.
func (p *Proxy) endOf(ctx context.Context, c *Call, stop retry.StopReason, last classify.Outcome) outcome.End {
	if end := outcome.EndOf(ctx); end != outcome.EndNone {
		return end
	}
	switch {
	case stop == retry.StopDeadline && c.ClientDeadline && !last.Timeout:
		return outcome.EndClient
	case stop == retry.StopCanceled && p.shuttingDown():
		return outcome.EndGateway
	}
	return outcome.EndNone
}

func (p *Proxy) shuttingDown() bool {
	select {
	case <-p.shutdown:
		return true
	default:
		return false
	}
}

// runUpstream is the one retry loop around attempts at u.
func (p *Proxy) runUpstream(ctx context.Context, c *Call, hop Hop) (*Response, retry.StopReason) {
	u := hop.Upstream
	var resp *Response
	c.backoff = 0
	loop := p.retryLoop(u.Cfg.Name, c)
	_, stats := loop.Run(ctx, c.Deadline, func(actx context.Context, n int) classify.Outcome {
		c.replaced(resp)
		actx, span := p.tracer.StartAttempt(actx, u.attemptSpan(c, n))
		resp = p.attempt(actx, c, hop)
		resp.traced(span)
		p.metrics.Attempt(u.Cfg.Name, resp.Outcome)
		return resp.Outcome
	})
	resp.Attempts = stats.Attempts
	if c := resp.Outcome.Class; c == classify.Unauthorized || c == classify.Auth {
		// The provider's message may describe its key: it is not logged.
		p.metrics.UpstreamAuthFailure(u.Cfg.Name, resp.Status)
		p.log.Error("upstream refused the gateway's credentials; check its api_key", "upstream", u.Cfg.Name,
			"status", resp.Status, "class", c, "reason", resp.Outcome.Reason)
	}
	if stats.Stop == retry.StopAbandoned {
		p.log.Warn("not retrying: the call's idempotency key is no longer its own (taken over, purged or lost in a failover)", "upstream", u.Cfg.Name,
			"attempts", stats.Attempts, "class", resp.Outcome.Class)
	}
	if stats.Stop == retry.StopBudget {
		p.metrics.BudgetRejected(u.Cfg.Name)
		tracing.RetryBudgetExhausted(ctx, u.Cfg.Name)
	}
	return resp, stats.Stop
}

// retryLoop is the retry loop for c at one upstream. It notes each wait in
// c, for the span of the attempt that follows. (In c, not in a variable the
// hook shares with the attempt: that would cost an allocation per request,
// tracing on or off.) It is returned by value, to stay on its caller's
// stack: a pointer escaped once this function grew past inlining (one
// allocation more per request, BenchmarkRequestPath).
func (p *Proxy) retryLoop(upstreamName string, c *Call) retry.Loop {
	policy := retry.Policy{
		MaxAttempts: p.cfg.Retry.MaxAttempts,
		BaseDelay:   p.cfg.Retry.BaseDelay.D(),
		MaxDelay:    p.cfg.Retry.MaxDelay.D(),
	}
	if !c.resendable() {
		policy.MaxAttempts = 1
	}
	return retry.Loop{
		Abandon:  c.Lease,
		Client:   c.Client,
		Policy:   policy,
		Budget:   p.budget,
		Shutdown: p.shutdown,
		OnRetry: func(n int, o classify.Outcome, wait time.Duration) {
			c.backoff = wait
			p.metrics.Retry(upstreamName, o)
			p.log.Debug("retrying", "upstream", upstreamName, "attempt", n, "class", o.Class, "reason", o.Reason, "wait", wait)
		},
	}
}
