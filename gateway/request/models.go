package request

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/proxy"
)

// handleModels merges GET /models from every upstream of OpenAI's API
// (an Anthropic upstream's models are listed on Anthropic's requests
// only: handleAnthropicModels); an upstream that
// fails is left out (and logged) unless all fail. Each item is relayed as
// the upstream wrote it (never decoded into a struct and re-encoded, which
// would drop vendor fields and add empty ones); a duplicate id is the first
// upstream's, in config order. Items are sorted by id.
func (g *Handler) handleModels(c echo.Context) error {
	r := c.Request()
	if APIOf(r) == proxy.AnthropicPlain {
		return g.handleAnthropicModels(c)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	out, err := g.collectModels(ctx, proxy.Plain, func(ctx context.Context, u *proxy.Upstream) ([]proxy.Model, error) {
		l, err := u.ListModels(ctx, r, "")
		return l.Models, err
	})
	if err != nil {
		return err
	}
	slices.SortStableFunc(out, func(a, b proxy.Model) int { return strings.Compare(a.ID, b.ID) })
	var body bytes.Buffer
	body.WriteString(`{"object":"list","data":[`)
	writeItems(&body, out)
	body.WriteString("]}")
	return c.JSONBlob(http.StatusOK, body.Bytes())
}

// collectModels asks every upstream speaking api for its models at once
// (list is one upstream's whole list) and merges them in config order, a
// duplicate id the first upstream's. An upstream that fails is left out
// (and logged) unless all fail: then the answer is a 502.
func (g *Handler) collectModels(ctx context.Context, api *proxy.API,
	list func(context.Context, *proxy.Upstream) ([]proxy.Model, error)) ([]proxy.Model, error) {
	type result struct {
		models []proxy.Model
		err    error
	}
	ups := slices.DeleteFunc(slices.Clone(g.router.Upstreams()), func(u *proxy.Upstream) bool { return !u.Speaks(api) })
	results := make([]result, len(ups))
	var wg sync.WaitGroup
	for i, u := range ups {
		wg.Go(func() {
			results[i].models, results[i].err = list(ctx, u)
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	out := []proxy.Model{}
	var errs []error
	for i, r := range results {
		if r.err != nil {
			// Redacted here, once: the joined errors reach the request's
			// log line too.
			err := redactURL(r.err)
			g.log.Warn("listing models failed", "upstream", ups[i].Cfg.Name, "err", err)
			errs = append(errs, err)
			continue
		}
		for _, m := range r.models {
			if !seen[m.ID] {
				seen[m.ID] = true
				out = append(out, m)
			}
		}
	}
	if len(errs) == len(results) && len(results) > 0 {
		return nil, &apierror.Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unreachable",
			Message: "No upstream answered the models list.", Err: errors.Join(errs...)}
	}
	return out, nil
}

// writeItems writes the models' items, comma-separated, as they came.
func writeItems(b *bytes.Buffer, models []proxy.Model) {
	for i, m := range models {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(m.Raw)
	}
}

// handleModel serves GET /v1/models/{id} from the upstream that serves the
// model (ids may contain "/": the route takes the rest of the path), its
// answer relayed as it came, through the retry loop and breaker: in
// Anthropic's format when that upstream is an Anthropic one
// (modelUpstream). A model
// no upstream serves is a 404 with no upstream call, and so is an id with
// an empty, "." or ".." segment, which an upstream (or a proxy before it)
// may resolve into another path: /v1/models/x/../../files is /v1/files,
// or other path syntax (modelPath).
// Each segment goes upstream escaped, so none is read as path syntax.
func (g *Handler) handleModel(c echo.Context) error {
	return g.post(func(w http.ResponseWriter, r *http.Request, s *summary) error {
		s.endpoint = "models"
		id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
		if e := badModel(id); e != nil {
			return g.routingError(e)
		}
		s.model = id
		u := g.modelUpstream(r, id)
		suffix, ok := modelPath(id)
		if !ok || u == nil {
			return apierror.NotFound("model_not_found", "model",
				fmt.Sprintf("The model `%s` does not exist or is not served by this gateway.", id))
		}
		s.routed, s.upstream = true, u.Cfg.Name
		dl, err := g.deadlines(r, g.now())
		if err != nil {
			return err
		}
		cl := &proxy.Call{In: r, Suffix: u.PathFor(suffix), API: APIOf(r), Model: id, Passthrough: true,
			Deadline: dl.first(), ClientDeadline: !dl.client.IsZero()}
		if err := g.plan(r, cl, u, sharedView{}); err != nil {
			return err
		}
		return g.serveUnkeyed(&exchange{w: w, req: r, call: cl, dl: dl, sum: s})
	})(c)
}

// modelUpstream is the upstream that serves model id for r: on an
// Anthropic request (anthropic-version sent) an Anthropic upstream only;
// on any other, an OpenAI upstream, else an Anthropic one (a model only
// Anthropic serves is still described, as Anthropic describes it). nil
// when none serves it.
func (g *Handler) modelUpstream(r *http.Request, id string) *proxy.Upstream {
	if APIOf(r) == proxy.AnthropicPlain {
		return g.router.Route(proxy.AnthropicPlain, id)
	}
	if u := g.router.Route(proxy.Plain, id); u != nil {
		return u
	}
	return g.router.Route(proxy.AnthropicPlain, id)
}

// modelPath is the API path of model id (/v1/models/...), each
// "/"-separated segment escaped; false when a segment is empty, "." or
// "..", starts or ends with a space, or the id has a space next to a dot
// or holds syntax another server reads as a path, as a passthrough path
// may not (otherPathSyntax, but for a space inside a segment): escaped, a
// backslash still reads as "/" to an IIS-style upstream, and "%2F" as "/"
// to one that decodes twice. No model id holds any of it.
func modelPath(id string) (string, bool) {
	// A space inside a segment is an id's own (GPT4All names models
	// "Llama 3 8B Instruct"); at a segment's edge or next to a dot, a
	// server that trims or splits reads " .." as "..".
	if otherPathSyntax("/"+strings.ReplaceAll(id, " ", "-")) || strings.Contains(id, " .") || strings.Contains(id, ". ") {
		return "", false
	}
	segs := strings.Split(id, "/")
	for i, s := range segs {
		if s == "" || s == "." || s == ".." || s[0] == ' ' || s[len(s)-1] == ' ' {
			return "", false
		}
		segs[i] = url.PathEscape(s)
	}
	return "/v1/models/" + strings.Join(segs, "/"), true
}
