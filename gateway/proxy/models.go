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

// ListModels asks u for its models (GET /models), bounded by 30 s.
func (u *Upstream) ListModels(ctx context.Context, in *http.Request) ([]Model, error) {
	ctx, cancel := context.WithTimeout(ctx, min(u.timeout, 30*time.Second))
	defer cancel()
	req, err := u.newUpstreamRequest(ctx, in, outgoing{suffix: "/models", key: u.Cfg.APIKey}, nil, 0)
	if err != nil {
		return nil, err
	}
	res, err := u.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("upstream %s: GET /models: status %d", u.Cfg.Name, res.StatusCode)
	}
	// json.RawMessage keeps each item's bytes exactly; only the id is
	// decoded from them.
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 16<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("upstream %s: GET /models: %w", u.Cfg.Name, err)
	}
	out := make([]Model, 0, len(list.Data))
	for i, raw := range list.Data {
		var m struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(raw, &m); err != nil || m.ID == "" {
			return nil, fmt.Errorf("upstream %s: GET /models: data[%d] has no string id", u.Cfg.Name, i)
		}
		out = append(out, Model{ID: m.ID, Raw: raw})
	}
	return out, nil
}
