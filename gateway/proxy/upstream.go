package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
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

// Route returns the upstream that serves model, or nil.
func (r *Router) Route(model string) *Upstream {
	for _, u := range r.upstreams {
		for _, m := range u.Cfg.Models {
			if m == model {
				return u
			}
		}
	}
	for _, u := range r.upstreams {
		if u.Cfg.Serves(model) {
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
	headers.CopyRequest(req.Header, in.Header, u.Cfg.ForwardAccountHeaders)
	if o.key != "" {
		req.Header.Set("Authorization", "Bearer "+o.key)
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
