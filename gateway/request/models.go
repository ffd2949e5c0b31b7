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

// handleModels merges GET /models from every upstream; an upstream that
// fails is left out (and logged) unless all fail. Each item is relayed as
// the upstream wrote it (never decoded into a struct and re-encoded, which
// would drop vendor fields and add empty ones); a duplicate id is the first
// upstream's, in config order. Items are sorted by id.
func (g *Handler) handleModels(c echo.Context) error {
	type result struct {
		models []proxy.Model
		err    error
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), 30*time.Second)
	defer cancel()
	ups := g.router.Upstreams()
	results := make([]result, len(ups))
	var wg sync.WaitGroup
	for i, u := range ups {
		wg.Go(func() {
			results[i].models, results[i].err = u.ListModels(ctx, c.Request())
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
		return &apierror.Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unreachable",
			Message: "No upstream answered the models list.", Err: errors.Join(errs...)}
	}
	slices.SortStableFunc(out, func(a, b proxy.Model) int { return strings.Compare(a.ID, b.ID) })
	var body bytes.Buffer
	body.WriteString(`{"object":"list","data":[`)
	for i, m := range out {
		if i > 0 {
			body.WriteByte(',')
		}
		body.Write(m.Raw)
	}
	body.WriteString("]}")
	return c.JSONBlob(http.StatusOK, body.Bytes())
}

// handleModel serves GET /v1/models/{id} from the upstream that serves the
// model (ids may contain "/": the route takes the rest of the path), its
// answer relayed as it came, through the retry loop and breaker. A model
// no upstream serves is a 404 with no upstream call, and so is an id with
// an empty, "." or ".." segment, which an upstream (or a proxy before it)
// may resolve into another path: /v1/models/x/../../files is /v1/files.
// Each segment goes upstream escaped, so none is read as path syntax.
func (g *Handler) handleModel(c echo.Context) error {
	return g.post(func(w http.ResponseWriter, r *http.Request, s *summary) error {
		s.endpoint = "models"
		id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
		s.model = id
		u := g.router.Route(id)
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
		cl := &proxy.Call{In: r, Suffix: suffix, Model: id, Passthrough: true,
			Deadline: dl.first(), ClientDeadline: !dl.client.IsZero()}
		if err := g.plan(r, cl, u, sharedView{}); err != nil {
			return err
		}
		return g.serveUnkeyed(&exchange{w: w, req: r, call: cl, dl: dl, sum: s})
	})(c)
}

// modelPath is the upstream path of model id, each "/"-separated segment
// escaped; false when a segment is empty, "." or "..".
func modelPath(id string) (string, bool) {
	segs := strings.Split(id, "/")
	for i, s := range segs {
		if s == "" || s == "." || s == ".." {
			return "", false
		}
		segs[i] = url.PathEscape(s)
	}
	return "/models/" + strings.Join(segs, "/"), true
}
