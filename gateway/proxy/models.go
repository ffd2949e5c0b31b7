package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	openai "github.com/sashabaranov/go-openai"
)

// ListModels asks u for its models (GET /models), bounded by 30 s.
func (u *Upstream) ListModels(ctx context.Context, in *http.Request) ([]openai.Model, error) {
	ctx, cancel := context.WithTimeout(ctx, min(u.timeout, 30*time.Second))
	defer cancel()
	req, err := u.newUpstreamRequest(ctx, in, "/models", nil, "")
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
	var list struct {
		Data []openai.Model `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 16<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("upstream %s: GET /models: %w", u.Cfg.Name, err)
	}
	return list.Data, nil
}
