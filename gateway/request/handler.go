package request

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/gateway/admission"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/budget"
	"github.com/llmgate/llmgate/gateway/deadletter"
	"github.com/llmgate/llmgate/gateway/limits"
	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/proxy"
)

// handlePost serves a POST under /v1: parse and route the body, then run
// it keyed (under an idempotency record) or not.
func (g *Handler) handlePost(ep endpoint) echo.HandlerFunc {
	return g.post(func(w http.ResponseWriter, r *http.Request, s *summary) error {
		s.endpoint = ep.label
		slot, err := g.admitClient(r, s)
		if err != nil {
			return err
		}
		defer slot.Release()
		// The body's bytes count against limits.max_inflight_bytes until
		// the request ends — a keyed call that runs on past its client's
		// deadline takes them along (hold.take).
		var held admission.Reservation
		defer held.Release()
		start := g.now()
		body, rt, u, err := g.parseRequest(r, ep, &held)
		s.model = rt.Model
		if err != nil {
			return err
		}
		s.routed = true
		s.upstream = u.Cfg.Name
		dl, err := g.deadlines(r, start)
		if err != nil {
			return err
		}
		cl := &proxy.Call{In: r, Suffix: ep.suffix, API: ep.api, Body: body, Model: rt.Model,
			Stream: rt.Stream, Deadline: dl.first(), ClientDeadline: !dl.client.IsZero()}
		cl.Tenant = g.forwardTenant(r)
		if ep.query {
			cl.Query = r.URL.RawQuery
		}
		view := sharedView{path: r.URL.Path, body: body, storeFalse: g.storeFalseBody(ep.suffix, body)}
		if err := g.plan(r, cl, u, view); err != nil {
			return err
		}
		u = cl.Hops[0].Upstream
		s.upstream = u.Cfg.Name
		kr, err := g.keyFor(r, ep, u, body)
		if err != nil {
			return err
		}
		if kr != nil {
			return g.serveKeyed(&exchange{w: w, req: r, call: cl, dl: dl, sum: s, held: hold{slot, &held}, out: ep.output(rt)}, kr)
		}
		if err := g.createCheck(r, cl, body, s); err != nil {
			return err
		}
		return g.serveUnkeyed(&exchange{w: w, req: r, call: cl, dl: dl, sum: s, out: ep.output(rt)})
	})
}

// exchange is one client request on its way through the handler: its
// response writer and request, the call its plan made (the hops are on
// it), its deadlines, its log line's summary, what it holds (its
// client's concurrency slot and its body's reservation, which a keyed call
// takes along when it outlives its handler), and the output it allows
// (its budget reservation's).
type exchange struct {
	w    http.ResponseWriter
	req  *http.Request
	call *proxy.Call
	dl   deadlines
	sum  *summary
	held hold
	out  budget.Output
	// live is a keyed stream's registration for duplicates to join, made
	// before its claim (goLive); unlive ends it.
	live   *liveStream
	unlive func()
}

// admitClient applies the client's concurrency and rate limits, before anything
// else; an operator's dead-letter replay is paced by its own rate.
func (g *Handler) admitClient(r *http.Request, s *summary) (*limits.Slot, error) {
	if _, replay := deadletter.ReplayClient(r.Context()); replay {
		return nil, nil
	}
	slot, err := g.limits.Admit(ClientOf(r))
	if err != nil {
		s.class = "client_limited"
		return nil, err
	}
	return slot, nil
}

// serveUnkeyed serves a request with no idempotency record: the answer is
// relayed as it comes, and the call ends with the client — its departure
// or its deadline.
func (g *Handler) serveUnkeyed(x *exchange) error {
	w, r, cl, dl, s := x.w, x.req, x.call, x.dl, x.sum
	ctx := r.Context()
	if !dl.operator.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadlineCause(ctx, dl.operator, outcome.ErrOperatorDeadline)
		defer cancel()
	}
	if !dl.client.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadlineCause(ctx, dl.client, outcome.ErrClientDeadline)
		defer cancel()
	}
	hold, err := g.reserve(ctx, cl, x.out)
	if err != nil {
		s.class = refusedClass(err)
		return err
	}
	var resp *proxy.Response
	defer func() { g.settleBudget(ctx, hold, cl, resp) }()
	start := g.now()
	resp, err = g.proxy.Execute(ctx, cl)
	if err != nil {
		return err
	}
	s.note(resp)
	if err := g.handOut(ctx, ClientOf(r), cl, resp); err != nil {
		return err
	}
	if resp.Stream != nil {
		g.proxy.RelayStream(w, resp, proxy.Relay{Start: start})
	}
	v := outcome.Settle(resp.Result(cl.Tried))
	resp.Report(v)
	g.countUsage(s.endpoint, cl, resp)
	s.class = v.Class
	if resp.Streamed() {
		return nil
	}
	return proxy.WriteJSON(w, resp, v, nil)
}

// note records a response's upstream and outcome for the log line.
func (s *summary) note(resp *proxy.Response) {
	s.upstream = resp.Upstream.Cfg.Name
	s.class = resp.Outcome.Class
	s.attempts = resp.Attempts
}

// parseRequest reads, validates and routes a POST body to an upstream
// speaking ep's API.
func (g *Handler) parseRequest(r *http.Request, ep endpoint, held *admission.Reservation) ([]byte, routing, *proxy.Upstream, error) {
	body, err := g.readBody(r, held)
	if err != nil {
		return nil, routing{}, nil, err
	}
	rt, err := parseRouting(body, g.cfg.Limits.MaxJSONDepth)
	if err == nil {
		err = ep.typed(rt)
	}
	if err != nil {
		return nil, rt, nil, g.routingError(err)
	}
	if rt.Model == "" {
		return nil, rt, nil, apierror.Invalid("model", "You must provide a model parameter.")
	}
	u := g.router.Route(ep.api, rt.Model)
	if u == nil {
		return nil, rt, nil, notServed(r, ep.api, rt.Model, g.router.Elsewhere(ep.api, rt.Model))
	}
	return body, rt, u, nil
}

// notServed is the 404 for a model no upstream of the endpoint's API
// serves; elsewhere, when not nil, serves it in another API, which the
// gateway does not translate to.
func notServed(r *http.Request, api *proxy.API, model string, elsewhere *proxy.Upstream) error {
	msg := fmt.Sprintf("The model `%s` is not served by this gateway: no configured upstream lists it.", model)
	if elsewhere != nil {
		msg = fmt.Sprintf("The model `%s` is served by upstream %q, which speaks the %s API, not the one of %s; "+
			"this gateway does not translate between APIs: call the %s API's endpoint.",
			model, elsewhere.Cfg.Name, elsewhere.Cfg.API, r.URL.Path, elsewhere.Cfg.API)
	}
	return apierror.NotFound("model_not_found", "model", msg)
}

// routingError is the client's error for a body parseRouting refused.
func (g *Handler) routingError(err error) error {
	var fe *fieldError
	if errors.As(err, &fe) {
		e := apierror.Invalid(fe.Param, fe.Msg+".")
		e.Code = fe.Code
		return e
	}
	if errors.Is(err, errDepth) {
		return apierror.Invalid("", fmt.Sprintf("The request body is nested more than %d levels deep.", g.cfg.Limits.MaxJSONDepth))
	}
	return apierror.InvalidCode("invalid_json", "", "We could not parse the JSON body of your request: "+err.Error()+".", err)
}

// readBody reads the request body up to limits.max_body_bytes, holding
// its bytes in held (see package admission).
func (g *Handler) readBody(r *http.Request, held *admission.Reservation) ([]byte, error) {
	if err := encodedBody(r); err != nil {
		return nil, err
	}
	return g.readBodyUpTo(r, held, g.cfg.Limits.MaxBodyBytes)
}

// readBodyUpTo is readBody with another limit (a passthrough route's,
// whose body readPassBody has checked for an encoding).
func (g *Handler) readBodyUpTo(r *http.Request, held *admission.Reservation, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &apierror.TooLarge{Limit: limit}
	}
	held.Client = ClientOf(r)
	body, err := held.Body(r.Context(), g.admit, r.Body, r.ContentLength, limit)
	var ae *apierror.Error
	switch {
	case errors.As(err, &ae): // no room under limits.max_inflight_bytes
		return nil, err
	case errors.Is(err, context.Canceled): // the client left while it waited
		return nil, apierror.ClientGone
	case errors.Is(err, admission.ErrOverLimit):
		return nil, &apierror.TooLarge{Limit: limit}
	}
	if err != nil {
		return nil, apierror.InvalidCode("", "", "Could not read the request body.", err)
	}
	return body, nil
}

// encodedBody refuses a request body sent with a Content-Encoding (gzip,
// br...): the gateway reads a body as it is sent, to parse, fingerprint
// and check it, and does not relay that header, so an encoded body was
// refused as malformed JSON, or reached the upstream as compressed bytes
// that no longer said so (an upload stored compressed). A 415 says what
// to do instead.
func encodedBody(r *http.Request) error {
	for _, v := range r.Header.Values("Content-Encoding") {
		for e := range strings.SplitSeq(v, ",") {
			if e = strings.TrimSpace(e); e != "" && !strings.EqualFold(e, "identity") {
				return &apierror.Error{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error",
					Code: "unsupported_content_encoding", Param: "Content-Encoding",
					Message: fmt.Sprintf("The request body is sent with Content-Encoding %q, which this gateway does not take: send it uncompressed.", cut(e, 32))}
			}
		}
	}
	return nil
}

// refusal is the client's error for a failed admission reservation: the
// client left while it waited (ClientGone); any other error (the 503 when
// there was no room) is returned as it is.
func refusal(err error) error {
	if errors.Is(err, context.Canceled) {
		return apierror.ClientGone
	}
	return err
}

// DeadlineHeader lets a client shorten the configured total deadline for
// one request: a Go duration ("30s") or a number of seconds ("30").
const DeadlineHeader = "X-Llmgate-Deadline"

// deadlines are a request's two deadlines: the operator's (retry.deadline)
// bounds the call; the client's (X-Llmgate-Deadline) bounds its wait —
// for an unkeyed request, the call too. Zero means none.
type deadlines struct{ operator, client time.Time }

// first is the earlier of the two: no new attempt starts after it.
func (d deadlines) first() time.Time {
	if d.client.IsZero() || (!d.operator.IsZero() && d.operator.Before(d.client)) {
		return d.operator
	}
	return d.client
}

func (g *Handler) deadlines(r *http.Request, start time.Time) (deadlines, error) {
	var dl deadlines
	if d := g.cfg.Retry.Deadline.D(); d > 0 {
		dl.operator = start.Add(d)
	}
	if vs := r.Header.Values(DeadlineHeader); len(vs) > 1 {
		// A proxy between may keep either: which bound was meant is unknown.
		return dl, apierror.Invalid("", DeadlineHeader+" appears more than once; send it once.")
	}
	h := r.Header.Get(DeadlineHeader)
	if h == "" {
		return dl, nil
	}
	v, err := time.ParseDuration(h)
	if err != nil {
		secs, err2 := strconv.ParseFloat(h, 64)
		if err2 != nil || secs <= 0 || secs > 1e6 {
			return dl, apierror.Invalid("", DeadlineHeader+" must be a duration such as 30s or a number of seconds.")
		}
		v = time.Duration(secs * float64(time.Second))
	}
	if v <= 0 {
		return dl, apierror.Invalid("", DeadlineHeader+" must be positive.")
	}
	if dl.operator.IsZero() || start.Add(v).Before(dl.operator) {
		dl.client = start.Add(v)
	}
	return dl, nil
}

// redactURL drops the URL from a net/http client error: base_url's query
// string may carry a provider key (Azure's api-key).
func redactURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}
