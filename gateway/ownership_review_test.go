package gateway

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
)

// Regression tests for a review of the ownership checks: bodies the
// gateway did not read as JSON, dot segments in a model id, encoded
// slashes in an object id, and Responses bodies naming items and
// containers.

// TestReviewNonJSONContentTypeBypassesBodyCheck: a JSON body sent as
// text/plain, form-urlencoded or with no Content-Type is checked like an
// application/json one under a shared key: bob's batch over alice's file
// never reaches the upstream.
func TestReviewNonJSONContentTypeBypassesBodyCheck(t *testing.T) {
	h, up := ownersHarness(t, nil)
	h.store.PutOwner(t.Context(), "alice", "file-a", cache.Owner{Upstream: "primary", Kind: "file"}, time.Hour)
	body := `{"input_file_id":"file-a","endpoint":"/v1/chat/completions","completion_window":"24h"}`
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", ""} {
		r := h.do(http.MethodPost, "/v1/batches", body, map[string]string{"Authorization": asBob["Authorization"], "Content-Type": ct})
		for _, s := range up.requests() {
			if strings.Contains(s.Body, "file-a") {
				t.Errorf("Content-Type %q: bob's batch over alice's file reached the upstream (%d %s)", ct, r.status, r.body)
			}
		}
		// Alice's own file passes, checked, whatever the Content-Type.
		r = h.do(http.MethodPost, "/v1/batches", body, map[string]string{"Authorization": asAlice["Authorization"], "Content-Type": ct})
		if r.status != http.StatusOK || len(up.requests()) != 1 {
			t.Errorf("Content-Type %q: alice's batch: %d %s", ct, r.status, r.body)
		}
	}
}

// TestReviewUncheckableBodyRefusedUnderSharedKey: a body the gateway
// cannot scan for ids — not JSON, or streamed once past
// passthrough.spool_max_bytes — is refused under a shared key (415, 413)
// and
// forwarded under a client's own key.
func TestReviewUncheckableBodyRefusedUnderSharedKey(t *testing.T) {
	h, up := ownersHarness(t, func(c *config.Config) {
		c.Passthrough.SpoolMaxBytes = 128
		c.Clients[0].UpstreamAPIKeys = map[string]string{"primary": aliceOwn}
	})
	h.store.PutOwner(t.Context(), "alice", "file-a", cache.Owner{Upstream: "primary", Kind: "file"}, time.Hour)
	big := `{"input_file_id":"file-a","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":{"note":"well over 128 bytes long"}}`
	for _, tc := range []struct {
		body, ct string
		status   int
		code     string
	}{
		{"input_file_id=file-a", "application/x-www-form-urlencoded", http.StatusUnsupportedMediaType, "unsupported_media_type"},
		{"--x\r\nContent-Disposition: form-data; name=\"input_file_id\"\r\n\r\nfile-a\r\n--x--\r\n", "multipart/form-data; boundary=x",
			http.StatusUnsupportedMediaType, "unsupported_media_type"},
		{big, "application/json", http.StatusRequestEntityTooLarge, "request_too_large"},
		{big, "text/plain", http.StatusRequestEntityTooLarge, "request_too_large"},
	} {
		r := h.do(http.MethodPost, "/v1/batches", tc.body, map[string]string{"Authorization": asBob["Authorization"], "Content-Type": tc.ct})
		if e := wantOpenAIError(t, r, tc.status); e["code"] != tc.code {
			t.Errorf("%s %s: %v", tc.ct, tc.body, e)
		}
		if seen := up.requests(); len(seen) != 0 {
			t.Errorf("%s %s: the upstream was called: %+v", tc.ct, tc.body, seen)
		}
		if r := h.do(http.MethodPost, "/v1/batches", tc.body, map[string]string{"Authorization": asAlice["Authorization"], "Content-Type": tc.ct}); r.status != http.StatusOK {
			t.Errorf("own key, %s: %d %s", tc.ct, r.status, r.body)
		}
		up.requests()
	}
}
