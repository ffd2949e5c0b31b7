package request

import (
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/admission"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/idempotency"
	"github.com/llmgate/llmgate/gateway/proxy"
)

// passthroughRoutes registers the rest of the OpenAI surface, relayed as a
// passthrough: the request's bytes and allowed headers forwarded, the
// answer's bytes relayed unchanged, through the one retry loop and breaker.
// The methods are the ones the OpenAI API uses under each path; any other
// is a 405, and a path under /v1 not listed stays a 404.
func (g *Handler) passthroughRoutes(v1 *echo.Group) {
	h := g.handlePassthrough
	for _, p := range []string{"/moderations", "/images/*", "/audio/*"} {
		passRoutes(v1, p, h, http.MethodPost)
	}
	for _, p := range []string{"/files", "/uploads", "/batches", "/vector_stores", "/conversations"} {
		for _, q := range []string{p, p + "/*"} {
			passRoutes(v1, q, h, http.MethodGet, http.MethodPost, http.MethodDelete)
		}
	}
	// POST /v1/responses itself is the Responses API's own handler.
	passRoutes(v1, "/responses/:id", h, http.MethodGet, http.MethodDelete)
	passRoutes(v1, "/responses/:id/input_items", h, http.MethodGet)
	passRoutes(v1, "/responses/:id/cancel", h, http.MethodPost)
}

// httpMethods are the methods a passthrough path answers: its own, and a
// 405 for the rest. (Left to echo, a path with a static route would fall
// through to /v1's 404 instead.)
var httpMethods = []string{http.MethodConnect, http.MethodDelete, http.MethodGet, http.MethodHead,
	http.MethodOptions, http.MethodPatch, http.MethodPost, http.MethodPut, http.MethodTrace}

// passRoutes registers h for methods on p, and for every other method a
// 405 method_not_allowed whose Allow header names them.
func passRoutes(v1 *echo.Group, p string, h echo.HandlerFunc, methods ...string) {
	v1.Match(methods, p, h)
	var others []string
	for _, m := range httpMethods {
		if !slices.Contains(methods, m) {
			others = append(others, m)
		}
	}
	allow := strings.Join(methods, ", ")
	v1.Match(others, p, func(c echo.Context) error {
		c.Response().Header().Set(echo.HeaderAllow, allow)
		return echo.ErrMethodNotAllowed
	})
}

// passRoute is where a passthrough request goes when its body names no
// model, and its limits.
type passRoute struct {
	label string // metrics label: the path family ("files")
	// api is the API the request speaks: OpenAI's (Plain), Anthropic's
	// batches (MessageBatches), or on /v1/files and /v1/models with
	// anthropic-version Anthropic's (AnthropicPlain).
	api       *proxy.API
	upstream  *proxy.Upstream
	maxBody   int64
	maxRecord int64
}

// otherPathSyntax reports a path another server could read as naming
// another path than Go does, past the id the ownership check reads: a
// ";" (Tomcat and Jetty take /..;/ for /../), a backslash (IIS and
// Windows servers take it for "/"), a "%" left after decoding (a proxy
// that decodes again reads %2e%2e as ".."), a "?" or "#", a space, a
// control byte or a byte outside ASCII (a server that trims or
// normalises reads " .." or a fullwidth dot as ".."), or a segment
// starting with "." (".;", "..;x"). No object id or sub-path holds any
// of them.
func otherPathSyntax(p string) bool {
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(";\\%?#", c) >= 0 {
			return true
		}
	}
	return strings.Contains(p, "/.")
}

// routeFor is a passthrough path's route: the longest configured prefix
// that matches it, else the defaults. A path that is not clean ("..",
// "//"), has a "/" escaped in a segment ("%2F", which no object id
// holds) or syntax another server reads (otherPathSyntax) is a 404: it
// would reach another upstream path than it names, or name another id
// upstream than the ownership check (right after it) saw. Its upstream speaks the request's API: a configured route naming
// an upstream of the other API keeps its limits but not that upstream,
// and with no upstream of the request's API at all the path is a 404.
func (g *Handler) routeFor(r *http.Request) (passRoute, error) {
	rt := passRoute{api: APIOf(r)}
	u := r.URL
	p := u.Path
	if strings.Count(u.EscapedPath(), "/") != strings.Count(p, "/") || otherPathSyntax(p) {
		return rt, echo.ErrNotFound
	}
	if under(p, batchesPath) {
		return g.batchRoute(p)
	}
	for _, pre := range config.PassthroughPrefixes {
		if under(p, pre) {
			rt.label = strings.TrimPrefix(pre, "/v1/")
		}
	}
	if rt.label == "" || path.Clean(p) != p {
		return rt, echo.ErrNotFound
	}
	// The first upstream speaking the request's API: OpenAI's, or on
	// /v1/files with anthropic-version Anthropic's.
	rt.upstream = g.router.First(rt.api)
	if rt.api == proxy.AnthropicPlain && !rt.upstream.Speaks(rt.api) {
		return rt, apierror.NotFound("unknown_url", "", "No upstream of this gateway speaks Anthropic's API, so its Files API is not served here.")
	}
	rt.maxBody = g.cfg.Limits.MaxBodyBytes
	if under(p, "/v1/files") || under(p, "/v1/uploads") {
		rt.maxBody = config.DefaultUploadBodyBytes
	}
	rt.maxRecord = g.cfg.Idempotency.MaxRecordBytes
	best := -1
	for _, pr := range g.cfg.Passthrough.Routes {
		if !under(p, pr.Prefix) || len(pr.Prefix) <= best {
			continue
		}
		best = len(pr.Prefix)
		if ru := g.router.Upstream(pr.Upstream); ru != nil && ru.Speaks(rt.api) {
			rt.upstream = ru
		}
		if pr.MaxBodyBytes > 0 {
			rt.maxBody = pr.MaxBodyBytes
		}
		if pr.MaxRecordBytes > 0 {
			rt.maxRecord = pr.MaxRecordBytes
		}
	}
	return rt, nil
}

// under reports whether p is prefix or a path below it.
func under(p, prefix string) bool {
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

// handlePassthrough serves one passthrough request: route it, read its
// body (spooled to disk when large), pick the upstream (the body's model,
// else the route's), then run it keyed (a POST with an Idempotency-Key) or
// not. An unkeyed answer is relayed as it arrives, never buffered whole.
func (g *Handler) handlePassthrough(c echo.Context) error {
	return g.post(func(w http.ResponseWriter, r *http.Request, s *summary) error {
		rt, err := g.routeFor(r)
		if err != nil {
			return err
		}
		s.endpoint = rt.label
		// Before its body is read or it takes a slot: a call whose spend
		// no budget would see is refused to a budgeted client outright.
		if err := g.budgets.Unmetered(ClientOf(r), r.Method, r.URL.Path); err != nil {
			s.class = unmeteredClass
			return err
		}
		slot, err := g.admitClient(r, s)
		if err != nil {
			return err
		}
		defer slot.Release()
		start := g.now()
		key, err := g.passKey(r)
		if err != nil {
			return err
		}
		// A JSON body's bytes count against limits.max_inflight_bytes
		// until the request ends (or its detached keyed call does), as
		// chat's do.
		held := admission.Reservation{Client: ClientOf(r)}
		defer held.Release()
		body, err := g.readPassBody(r, rt, key != "", &held)
		if err != nil {
			return err
		}
		defer body.src.Close()
		u, err := g.passUpstream(rt, body.model, s)
		if err != nil {
			return err
		}
		dl, err := g.deadlines(r, start)
		if err != nil {
			return err
		}
		cl := &proxy.Call{In: r, Suffix: u.PathFor(r.URL.EscapedPath()), API: rt.api, Query: r.URL.RawQuery,
			Source: body.src, Model: body.model, Lane: rt.label, Passthrough: true, RecordLimit: rt.maxRecord,
			Unbuffered: key == "" && !isBatchObjects(r.URL.Path), Deadline: dl.first(), ClientDeadline: !dl.client.IsZero()}
		cl.Tenant = g.forwardTenant(r)
		if err := g.plan(r, cl, u, g.passView(r, body)); err != nil {
			return err
		}
		s.upstream = cl.Hops[0].Upstream.Cfg.Name
		cl.Unbuffered = cl.Unbuffered && !buffersObjects(r, cl.Hops)
		if key == "" {
			if err := g.createCheck(r, cl, nil, s); err != nil {
				return err
			}
			return g.serveUnkeyed(&exchange{w: flushWriter{w}, req: r, call: cl, dl: dl, sum: s})
		}
		cl.Body = body.json // a dead letter keeps a JSON body (and replays it)
		kr, err := g.passKeyed(r, rt, key, body)
		if err != nil {
			return err
		}
		return g.serveKeyed(&exchange{w: w, req: r, call: cl, dl: dl, sum: s, held: hold{slot, &held}}, kr)
	})(c)
}

// passKeyed is the keyed request of a passthrough request with key: its
// fingerprint covers the body, the query and the headers its API names.
func (g *Handler) passKeyed(r *http.Request, rt passRoute, key string, body passBody) (*idempotency.Request, error) {
	fp, err := body.keyFingerprint()
	if err != nil {
		return nil, err
	}
	return &idempotency.Request{
		Key: cache.Key{Scope: ClientOf(r), Endpoint: r.URL.EscapedPath(), ID: key},
		Raw: key, TTL: g.cfg.Idempotency.TTL.D(), ErrorBody: rt.api.ErrorBody,
		Fingerprint: idempotency.WithHeaders(idempotency.WithQuery(fp, r.URL.RawQuery), r.Header, rt.api.Fingerprinted()),
	}, nil
}

// passUpstream is the upstream for a passthrough request: the one of the
// route's API serving the body's model, else the route's.
func (g *Handler) passUpstream(rt passRoute, model string, s *summary) (*proxy.Upstream, error) {
	if e := badModel(model); e != nil {
		return nil, g.routingError(e)
	}
	s.model = model
	u := rt.upstream
	if model != "" {
		if u = g.router.Route(rt.api, model); u == nil {
			return nil, apierror.NotFound("model_not_found", "model",
				fmt.Sprintf("The model `%s` is not served by this gateway: no configured upstream lists it.", model))
		}
	}
	s.routed, s.upstream = true, u.Cfg.Name
	return u, nil
}

// passKey is a passthrough POST's Idempotency-Key, or "". On GET and
// DELETE the header is ignored: they are idempotent by HTTP's definition,
// and recording a GET would replay a stale object (a batch's status, a
// file list) instead of reading it — the rule Stripe's API follows too.
// idempotency.require_key applies to these POSTs as to chat's.
func (g *Handler) passKey(r *http.Request) (string, error) {
	if r.Method != http.MethodPost {
		return "", nil
	}
	hv, ok := r.Header["Idempotency-Key"]
	if !ok {
		if g.cfg.Idempotency.RequireKey {
			return "", apierror.InvalidCode("idempotency_key_required", "",
				"This gateway requires an Idempotency-Key header on every POST. Name the business operation, e.g. order-4711/upload.", nil)
		}
		return "", nil
	}
	if len(hv) != 1 {
		return "", apierror.Invalid("", "Send exactly one Idempotency-Key header.")
	}
	key, err := idempotency.ParseKey(hv[0])
	if err != nil {
		return "", apierror.InvalidCode("invalid_idempotency_key", "", err.Error()+".", err)
	}
	return key, nil
}

// flushWriter flushes every write: a passthrough answer relayed as it
// arrives (speech audio, a file's content) reaches the client chunk by
// chunk instead of waiting in the server's buffer.
type flushWriter struct{ http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.ResponseWriter.Write(p)
	if err == nil {
		if fl, ok := f.ResponseWriter.(http.Flusher); ok {
			fl.Flush()
		}
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the writer below.
func (f flushWriter) Unwrap() http.ResponseWriter { return f.ResponseWriter }
