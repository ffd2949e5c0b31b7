package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/headers"
	"github.com/llmgate/llmgate/gateway/tracing"
)

// Upstream is one configured provider with its own connection pool.
type Upstream struct {
	Cfg     config.Upstream
	base    *url.URL
	client  *http.Client
	timeout time.Duration
	// fallbacks are resolved at startup, in order.
	fallbacks []*Upstream
	// propagate: attempts carry a W3C traceparent (config PropagatesTrace).
	propagate bool
}

func newUpstream(cfg config.Upstream) (*Upstream, error) {
	cfg = cfg.WithDefaults()
	base, err := url.Parse(cfg.BaseURL)
	if err != nil {
		// Not the URL: its query may hold the upstream's credential.
		return nil, fmt.Errorf("upstream %s: base_url: %w", cfg.Name, errors.Unwrap(err))
	}
	// One transport per upstream, pooled and sized for many long-lived LLM
	// calls. It has no response-header timeout: a non-streaming completion
	// may think for minutes before its headers; the per-attempt context
	// bounds it instead. net/http re-sends a request only when a pooled
	// connection turns out dead before the request was written, which is
	// not a retry of work the upstream did.
	tr := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   10 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          cfg.MaxIdleConns,
		MaxIdleConnsPerHost:   cfg.MaxIdleConns,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &Upstream{
		Cfg:       cfg,
		base:      base,
		timeout:   cfg.Timeout.D(),
		propagate: cfg.PropagatesTrace(),
		client: &http.Client{
			Transport: tr,
			// Never follow redirects: the upstream is only ever base_url.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}, nil
}

// Router maps a model name to its upstream: the first configured upstream
// whose models match, exact names before wildcards.
type Router struct {
	upstreams []*Upstream
	byName    map[string]*Upstream
}

// NewRouter builds every configured upstream and resolves fallbacks.
func NewRouter(cfgs []config.Upstream) (*Router, error) {
	r := &Router{byName: map[string]*Upstream{}}
	for _, c := range cfgs {
		u, err := newUpstream(c)
		if err != nil {
			return nil, err
		}
		r.upstreams = append(r.upstreams, u)
		r.byName[c.Name] = u
	}
	for _, u := range r.upstreams {
		for _, f := range u.Cfg.Fallbacks {
			fu, ok := r.byName[f]
			if !ok {
				return nil, fmt.Errorf("upstream %s: fallback %q is not a configured upstream", u.Cfg.Name, f)
			}
			u.fallbacks = append(u.fallbacks, fu)
		}
	}
	return r, nil
}

// Route returns the upstream speaking api that serves model, or nil: an
// endpoint's request goes only to an upstream of its own API, since
// nothing is translated.
func (r *Router) Route(api *API, model string) *Upstream {
	return r.route(model, func(u *Upstream) bool { return u.Speaks(api) })
}

// Speaks reports whether u is an upstream of api's provider API.
func (u *Upstream) Speaks(api *API) bool { return u.Cfg.API == api.provider }

// PathFor is the path after u's base_url for p, a path of u's API as a
// client sends it ("/v1/files/x"): an OpenAI base_url includes /v1, as
// OpenAI documents it; an Anthropic one is the API's root
// (https://api.anthropic.com).
func (u *Upstream) PathFor(p string) string {
	if u.Cfg.API == config.APIAnthropic {
		return p
	}
	return strings.TrimPrefix(p, "/v1")
}

// First is the first configured upstream speaking api, or the first of
// all when none does.
func (r *Router) First(api *API) *Upstream {
	for _, u := range r.upstreams {
		if u.Speaks(api) {
			return u
		}
	}
	return r.upstreams[0]
}

// Elsewhere returns an upstream of another API than api that serves
// model, or nil: what a request routed nowhere is told to use instead.
func (r *Router) Elsewhere(api *API, model string) *Upstream {
	return r.route(model, func(u *Upstream) bool { return !u.Speaks(api) })
}

// route is the first upstream among those speaks allows whose models
// match model, exact names before wildcards.
func (r *Router) route(model string, speaks func(*Upstream) bool) *Upstream {
	for _, u := range r.upstreams {
		if speaks(u) && slices.Contains(u.Cfg.Models, model) {
			return u
		}
	}
	for _, u := range r.upstreams {
		if speaks(u) && u.Cfg.Serves(model) {
			return u
		}
	}
	return nil
}

// Upstreams returns every upstream in config order.
func (r *Router) Upstreams() []*Upstream { return r.upstreams }

// Close releases idle upstream connections.
func (r *Router) Close() {
	for _, u := range r.upstreams {
		u.client.CloseIdleConnections()
	}
}

// newUpstreamRequest builds the request for one attempt. The URL is always
// base_url + the path after /v1, with base_url's query string (Azure's
// api-version): nothing from the client chooses the host. The client's
// query string is forwarded only when the call carries one (query, for the
// passthrough endpoints: list pagination, file filters); a parameter
// base_url sets cannot be overridden by it. body is n bytes long (-1 when
// unknown).
func (u *Upstream) newUpstreamRequest(ctx context.Context, in *http.Request, o outgoing, body io.Reader, n int64) (*http.Request, error) {
	target := *u.base
	// suffix is escaped as it goes on the wire: a "%2F" in it stays one.
	target.RawPath = u.base.EscapedPath() + o.suffix
	p, err := url.PathUnescape(target.RawPath)
	if err != nil {
		return nil, fmt.Errorf("upstream path %q: %w", target.RawPath, err)
	}
	target.Path = p
	target.RawQuery = mergeQuery(u.base.RawQuery, o.query)
	req, err := http.NewRequestWithContext(ctx, in.Method, target.String(), nil)
	if err != nil {
		return nil, err
	}
	setBody(req, body, n)
	// net/http's Transport re-sends a request it deems replayable — one
	// with a GetBody and an Idempotency-Key header — when its pooled
	// connection breaks, even after the request was written: a hidden
	// second retry layer. Without GetBody it re-sends only what never left.
	req.GetBody = nil
	headers.CopyRequest(req.Header, in.Header, headers.Allow{Account: u.Cfg.ForwardAccountHeaders, Anthropic: u.Cfg.API == config.APIAnthropic})
	u.setCredential(req.Header, o.key)
	if u.Cfg.AnthropicVersion != "" && req.Header.Get("Anthropic-Version") == "" {
		// The client's own version, whatever it is, went as it was; one
		// that sent none gets the configured default, which Anthropic
		// requires.
		req.Header.Set("Anthropic-Version", u.Cfg.AnthropicVersion)
	}
	if o.idemKey != "" {
		// An upstream that honours Idempotency-Key (another llmgate, some
		// providers) deduplicates too. idemKey is derived from the scope
		// (see idempotency.ForwardKey), never the client's raw key.
		req.Header.Set("Idempotency-Key", o.idemKey)
	}
	if u.propagate {
		tracing.Inject(ctx, req.Header)
	}
	return req, nil
}

// setCredential sets the hop's key as the upstream's auth says: "x-api-key:
// <key>" (Anthropic's) or "Authorization: Bearer <key>". The client's own
// credentials never got here (headers.CopyRequest drops them).
func (u *Upstream) setCredential(h http.Header, key string) {
	if key == "" {
		return
	}
	if u.Cfg.Auth == config.AuthXAPIKey {
		h.Set("X-Api-Key", key)
		return
	}
	h.Set("Authorization", "Bearer "+key)
}

// outgoing is what an upstream request is made of besides its body: the
// path after base_url (escaped as it goes on the wire), the client's query
// string, the bearer key (a hop's), and the Idempotency-Key forwarded.
type outgoing struct{ suffix, query, key, idemKey string }

// attemptSpan describes attempt n of c at u, for its span.
func (u *Upstream) attemptSpan(c *Call, n int) tracing.AttemptStart {
	return tracing.AttemptStart{Upstream: u.Cfg.Name, Host: u.base.Host, HTTPS: u.base.Scheme == "https",
		Path: c.Suffix, Model: c.Model, Stream: c.Stream, N: n, Backoff: c.backoff}
}

// mergeQuery is base_url's query followed by the client's, without the
// client's values for a parameter base_url sets.
func mergeQuery(base, client string) string {
	if client == "" {
		return base
	}
	if base == "" {
		return client
	}
	bq, _ := url.ParseQuery(base)
	cq, err := url.ParseQuery(client)
	if err != nil {
		return base
	}
	for k := range bq {
		cq.Del(k)
	}
	if len(cq) == 0 {
		return base
	}
	return base + "&" + cq.Encode()
}

// Upstream returns the upstream named name, or nil.
func (r *Router) Upstream(name string) *Upstream { return r.byName[name] }
