package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// Requests that name no model (files, uploads, vector stores…) count on a
// breaker of their route family, not on the upstream's own: a tenant whose
// file downloads fail until their breaker opens does not refuse every
// model of the upstream to every tenant.
func TestModelLessFailuresOpenTheirLaneOnly(t *testing.T) {
	fake := fakeprovider.New(fakeprovider.Options{})
	t.Cleanup(fake.Close)
	var files atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/files") {
			files.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte(`{"error":{"message":"files are down","type":"server_error","code":null}}`))
			return
		}
		fake.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = up.URL + "/v1"
		c.Retry.MaxAttempts = 1
		c.Breaker.ConsecutiveFailures = 3
	})
	for i := range 3 {
		if r := h.do(http.MethodGet, "/v1/files/file-abc/content", "", nil); r.status != 500 {
			t.Fatalf("file download %d: %d %s", i, r.status, r.body)
		}
	}
	r := h.do(http.MethodGet, "/v1/files/file-abc", "", nil)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "files") {
		t.Fatalf("files after 3 failures: %d %s, want 503 naming files", r.status, r.body)
	}
	if files.Load() != 3 {
		t.Errorf("upstream saw %d files requests, want 3 (the 4th refused by the open breaker)", files.Load())
	}
	if r := h.chat(modelBody("gpt-4o-mini", false), nil); r.status != 200 {
		t.Fatalf("a model of the same upstream after the files lane opened: %d %s", r.status, r.body)
	}
	bs := breakers(t, h)
	if own := findBreaker(bs, "primary", ""); own == nil || own.State != "closed" {
		t.Errorf("upstream's own breaker = %+v, want closed", own)
	}
	if lane := findBreaker(bs, "primary", "(files)"); lane == nil || lane.State != "open" || lane.Covers != "lane" {
		t.Errorf("files lane = %+v, want open, covers lane", lane)
	}
}
