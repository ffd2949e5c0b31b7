package request

import (
	"encoding/json"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/classify/jsonscan"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/proxy"
)

// Anthropic's Message Batches API, relayed as a passthrough to the
// Anthropic upstreams: the request's bytes and query forwarded, the
// answer's relayed, the batches a client creates under a shared key
// recorded as its own (package ownership) like OpenAI's objects. One
// field is the gateway's: every batch object's results_url points at the
// gateway's own route for the batch's results, since the TypeScript SDK's
// batches.results() fetches that URL with the client's credentials — the
// provider's would get the client's gateway key.

// batchesPath is where the Message Batches API lives.
const batchesPath = "/v1/messages/batches"

// batchRoutes registers the Message Batches API's routes, and a 404 in
// Anthropic's shape for any other path under /v1/messages.
func (g *Handler) batchRoutes(v1 *echo.Group) {
	h := g.handlePassthrough
	passRoutes(v1, "/messages/batches", h, http.MethodGet, http.MethodPost)
	passRoutes(v1, "/messages/batches/:id", h, http.MethodGet, http.MethodDelete)
	passRoutes(v1, "/messages/batches/:id/results", h, http.MethodGet)
	passRoutes(v1, "/messages/batches/:id/cancel", h, http.MethodPost)
	v1.RouteNotFound("/messages/*", func(echo.Context) error { return unknownAnthropicURL() })
	// /v1/messages and its count_tokens take POST only; another method
	// is Anthropic's 405 (the route's API gives the shape), not a 404.
	for _, p := range []string{"/messages", "/messages/count_tokens"} {
		v1.Match(slices.DeleteFunc(slices.Clone(httpMethods), func(m string) bool { return m == http.MethodPost }), p,
			func(c echo.Context) error {
				c.Response().Header().Set(echo.HeaderAllow, http.MethodPost)
				return echo.ErrMethodNotAllowed
			})
	}
}

// unknownAnthropicURL is the 404 for a path under /v1/messages that is
// none of the Messages API's.
func unknownAnthropicURL() error {
	return apierror.NotFound("unknown_url", "",
		"Unknown request URL. Please check the URL for typos, or see the docs at https://docs.anthropic.com/en/api/.")
}

// batchRoute is a Message Batches path's route: the first Anthropic
// upstream, limits.max_body_bytes for a batch's body (JSON, held in
// memory as chat's is), idempotency.max_record_bytes for its answer. A
// path that is not clean is a 404, as routeFor's are.
func (g *Handler) batchRoute(p string) (passRoute, error) {
	if path.Clean(p) != p {
		return passRoute{}, unknownAnthropicURL()
	}
	u := g.router.First(proxy.MessageBatches)
	if !u.Speaks(proxy.MessageBatches) {
		return passRoute{}, apierror.NotFound("", "",
			"This gateway has no Anthropic upstream (upstreams[].api: anthropic), so it serves no message batches.")
	}
	return passRoute{label: "message_batches", api: proxy.MessageBatches, upstream: u,
		maxBody: g.cfg.Limits.MaxBodyBytes, maxRecord: g.cfg.Idempotency.MaxRecordBytes}, nil
}

// isBatchObjects reports whether answers on p are batch objects (or a
// list of them) whose results_url the gateway rewrites: every Message
// Batches path but a batch's results, which are relayed as they come.
func isBatchObjects(p string) bool {
	return under(p, batchesPath) && !strings.HasSuffix(p, "/results")
}

// pointResults makes a successful batch answer's results_url values point
// at the gateway (rewriteResultsURLs), in resp.Body, before the answer is
// committed or sent. An answer too large to hold (over the route's record
// limit, a list of many batches) cannot be rewritten, and must not reach
// the client with the provider's URLs: it is dropped for a 502.
func (g *Handler) pointResults(cl *proxy.Call, resp *proxy.Response) error {
	if resp.Status < 200 || resp.Status > 299 || resp.Stream != nil || cl.API != proxy.MessageBatches || !isBatchObjects(cl.In.URL.Path) {
		return nil
	}
	if resp.Rest != nil {
		resp.Report(outcome.Dropped())
		resp.Discard()
		return &apierror.Error{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_answer_too_large",
			Message: "The upstream's answer is larger than the gateway holds (idempotency.max_record_bytes), so its results_url values " +
				"could not be pointed at the gateway. List fewer batches at a time (limit)."}
	}
	resp.Body = rewriteResultsURLs(resp.Body, g.resultsURL(cl.In))
	return nil
}

// resultsURL is the gateway's URL of a batch's results, as r's client
// reached the gateway: its Host, and https when TLS ended here or a
// trusted proxy (server.trusted_proxies) says so in X-Forwarded-Proto.
// X-Forwarded-Host is not read: nothing else in the gateway trusts it. A
// request with no Host (an operator's in-process dead-letter replay,
// whose answer the client's retry gets) gets the path alone, which the
// SDKs resolve against their base URL, the gateway.
func (g *Handler) resultsURL(r *http.Request) func(id string) string {
	u := url.URL{Scheme: "http", Host: r.Host}
	if g.proxies.HTTPS(r) {
		u.Scheme = "https"
	}
	if r.Host == "" {
		u.Scheme = ""
	}
	return func(id string) string {
		v := u
		v.Path, v.RawPath = batchesPath+"/"+id+"/results", batchesPath+"/"+url.PathEscape(id)+"/results"
		return v.String()
	}
}

var batchKeys = jsonscan.NewKeys("id", "results_url", "data")

// edit replaces body[start:end] with value.
type edit struct {
	start, end int
	value      []byte
}

// rewriteResultsURLs returns body with the value of every results_url
// that is a string — in the top-level object, and in each object of its
// "data" array (a list of batches) — replaced by urlOf(id), the object's
// own "id" (its last, as a JSON decoder keeps it), or null when it has
// none: a URL that is not the gateway's must not stay (urlOf escapes the
// id as a path segment). Keys are matched
// as a Go decoder matches them (folded; an exact-case reader sees a
// subset). A null results_url stays null, and every other byte stays as
// it is.
func rewriteResultsURLs(body []byte, urlOf func(id string) string) []byte {
	edits := objectEdits(jsonscan.New(body, 0), urlOf, true, nil)
	if len(edits) == 0 {
		return body
	}
	slices.SortFunc(edits, func(a, b edit) int { return a.start - b.start })
	out := make([]byte, 0, len(body)+len(edits)*32)
	at := 0
	for _, e := range edits {
		out = append(append(out, body[at:e.start]...), e.value...)
		at = e.end
	}
	return append(out, body[at:]...)
}

// objectEdits appends the edits of the object at s (and, when top, of
// the objects in its "data" array).
func objectEdits(s *jsonscan.Scanner, urlOf func(id string) string, top bool, edits []edit) []edit {
	var id string
	hasID := false
	var spots [][2]int
	for key := range s.Fields(batchKeys) {
		switch key {
		case "id":
			if v := s.Value(); len(v) > 0 && v[0] == '"' {
				id, hasID = jsonscan.Unquote(v), true
			}
		case "results_url":
			s.Peek()
			start := s.Pos()
			if v := s.Value(); len(v) > 0 && v[0] == '"' {
				spots = append(spots, [2]int{start, s.Pos()})
			}
		case "data":
			if top {
				for range s.Elements() {
					edits = objectEdits(s, urlOf, false, edits)
				}
			}
		}
	}
	value := []byte("null")
	if hasID && id != "" {
		value, _ = json.Marshal(urlOf(id))
	}
	for _, sp := range spots {
		edits = append(edits, edit{start: sp[0], end: sp[1], value: value})
	}
	return edits
}
