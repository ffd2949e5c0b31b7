package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Model is one item of an upstream's model list, its bytes as the upstream
// sent them: vendor fields (vLLM's max_model_len) pass, and nothing is
// added.
type Model struct {
	ID  string
	Raw json.RawMessage
}

// ModelList is one page of an upstream's model list: its items, and
// (Anthropic's lists are paged) whether more follow the last.
type ModelList struct {
	Models  []Model
	HasMore bool
	LastID  string
}

// ListModels asks u for a page of its models (GET /v1/models, with query
// forwarded: Anthropic's pagination and lifecycle filter), bounded by
// 30 s.
func (u *Upstream) ListModels(ctx context.Context, in *http.Request, query string) (ModelList, error) {
	ctx, cancel := context.WithTimeout(ctx, min(u.timeout, 30*time.Second))
	defer cancel()
	o := outgoing{suffix: u.PathFor("/v1/models"), query: query, key: u.Cfg.APIKey}
	req, err := u.newUpstreamRequest(ctx, in, o, nil, 0)
	if err != nil {
		return ModelList{}, err
	}
	res, err := u.client.Do(req)
	if err != nil {
		return ModelList{}, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return ModelList{}, fmt.Errorf("upstream %s: GET /models: status %d", u.Cfg.Name, res.StatusCode)
	}
	// json.RawMessage keeps each item's bytes exactly; only the id is
	// decoded from them.
	var list struct {
		Data    []json.RawMessage `json:"data"`
		HasMore bool              `json:"has_more"`
		LastID  *string           `json:"last_id"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 16<<20)).Decode(&list); err != nil {
		return ModelList{}, fmt.Errorf("upstream %s: GET /models: %w", u.Cfg.Name, err)
	}
	out := ModelList{Models: make([]Model, 0, len(list.Data)), HasMore: list.HasMore}
	if list.LastID != nil {
		out.LastID = *list.LastID
	}
	for i, raw := range list.Data {
		var m struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(raw, &m); err != nil || m.ID == "" {
			return ModelList{}, fmt.Errorf("upstream %s: GET /models: data[%d] has no string id", u.Cfg.Name, i)
		}
		out.Models = append(out.Models, Model{ID: m.ID, Raw: raw})
	}
	return out, nil
}
