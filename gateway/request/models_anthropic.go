package request

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/proxy"
)

// handleAnthropicModels serves GET /v1/models on an Anthropic request
// (anthropic-version sent) in Anthropic's format,
// {"data":[...],"has_more":..,"first_id":..,"last_id":..}, as the OpenAI
// listing is made: from every Anthropic upstream's own list, asked at
// once, each item relayed as the upstream wrote it, a duplicate id the
// first upstream's in config order, an upstream that fails left out
// unless all fail. Each upstream's list is read whole (every page of
// it, with the client's other parameters, such as lifecycle, forwarded)
// and the client's page — limit (1 to 1000, default 20), after_id or
// before_id — is cut from the merged list, which keeps Anthropic's order
// (newest first, upstream after upstream) rather than sorting by id.
func (g *Handler) handleAnthropicModels(c echo.Context) error {
	r := c.Request()
	q := r.URL.Query()
	page, err := parseModelsPage(q)
	if err != nil {
		return err
	}
	for _, p := range []string{"limit", "after_id", "before_id"} {
		q.Del(p)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	all, err := g.collectModels(ctx, proxy.AnthropicPlain, func(ctx context.Context, u *proxy.Upstream) ([]proxy.Model, error) {
		return anthropicModels(ctx, r, u, q)
	})
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, page.render(all))
}

// maxModelPages bounds the pages of one upstream's model list read for
// one request (of 1000 models each).
const maxModelPages = 10

// anthropicModels is u's whole model list: its pages of 1000, each
// after the last one's last_id, while has_more says more follow.
func anthropicModels(ctx context.Context, in *http.Request, u *proxy.Upstream, q url.Values) ([]proxy.Model, error) {
	var all []proxy.Model
	after := ""
	for range maxModelPages {
		pq := url.Values{}
		for k, v := range q {
			pq[k] = v
		}
		pq.Set("limit", "1000")
		if after != "" {
			pq.Set("after_id", after)
		}
		l, err := u.ListModels(ctx, in, pq.Encode())
		if err != nil {
			return nil, err
		}
		all = append(all, l.Models...)
		if !l.HasMore || l.LastID == "" || l.LastID == after {
			return all, nil
		}
		after = l.LastID
	}
	return nil, fmt.Errorf("upstream %s: GET /v1/models: more than %d pages", u.Cfg.Name, maxModelPages)
}

// modelsPage is the page of a model list a client asked for.
type modelsPage struct {
	limit             int
	afterID, beforeID string
}

// parseModelsPage reads limit, after_id and before_id as Anthropic's API
// takes them.
func parseModelsPage(q url.Values) (modelsPage, error) {
	p := modelsPage{limit: 20, afterID: q.Get("after_id"), beforeID: q.Get("before_id")}
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > 1000 {
			return p, apierror.Invalid("limit", "limit: Input should be an integer from 1 to 1000.")
		}
		p.limit = n
	}
	if p.afterID != "" && p.beforeID != "" {
		return p, apierror.Invalid("", "Send after_id or before_id, not both.")
	}
	return p, nil
}

// cut is the page of all the client asked for, and whether more items
// follow in its direction. A cursor that is no id of the list is an
// empty page.
func (p modelsPage) cut(all []proxy.Model) ([]proxy.Model, bool) {
	at := func(id string) int {
		for i, m := range all {
			if m.ID == id {
				return i
			}
		}
		return -1
	}
	switch {
	case p.afterID != "":
		i := at(p.afterID)
		if i < 0 {
			return nil, false
		}
		end := min(i+1+p.limit, len(all))
		return all[i+1 : end], end < len(all)
	case p.beforeID != "":
		i := at(p.beforeID)
		if i < 0 {
			return nil, false
		}
		start := max(0, i-p.limit)
		return all[start:i], start > 0
	}
	end := min(p.limit, len(all))
	return all[:end], end < len(all)
}

// render is the page in Anthropic's list shape, first_id and last_id null
// when it is empty.
func (p modelsPage) render(all []proxy.Model) []byte {
	items, more := p.cut(all)
	var b bytes.Buffer
	b.WriteString(`{"data":[`)
	writeItems(&b, items)
	first, last := []byte("null"), []byte("null")
	if len(items) > 0 {
		first, _ = json.Marshal(items[0].ID)
		last, _ = json.Marshal(items[len(items)-1].ID)
	}
	fmt.Fprintf(&b, `],"has_more":%t,"first_id":%s,"last_id":%s}`, more, first, last)
	return b.Bytes()
}
