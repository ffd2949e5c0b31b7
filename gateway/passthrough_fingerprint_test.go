package gateway

import (
	"fmt"
	"net/http"
	"testing"
)

// A passthrough body's fingerprint tells its kinds apart: a JSON body and
// a text/plain body holding its canonical bytes, or the same bytes under
// two media types, are different requests, so the second under the first's
// Idempotency-Key is a 422, not the first's answer (found by review).
func TestPassthroughFingerprintKindsApart(t *testing.T) {
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"modr-%d","results":[]}`, n)
	})
	h := passHarness(t, rec, nil)
	key := map[string]string{"Idempotency-Key": "moderate-1"}
	if r := h.sendRaw(http.MethodPost, "/v1/moderations", "application/json", []byte(`{ "model" : "omni-moderation-latest", "input" : "x" }`), key); r.status != 200 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	canonical := []byte(`{"input":"x","model":"omni-moderation-latest"}`)
	if r := h.sendRaw(http.MethodPost, "/v1/moderations", "text/plain", canonical, key); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("the JSON body's key with a text/plain body of its canonical bytes: %d %s, want 422", r.status, r.body)
	}
	key = map[string]string{"Idempotency-Key": "moderate-2"}
	if r := h.sendRaw(http.MethodPost, "/v1/moderations", "text/plain", canonical, key); r.status != 200 {
		t.Fatalf("text/plain: %d %s", r.status, r.body)
	}
	if r := h.sendRaw(http.MethodPost, "/v1/moderations", "application/x-ndjson", canonical, key); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("the same bytes under another media type: %d %s, want 422", r.status, r.body)
	}
	if r := h.sendRaw(http.MethodPost, "/v1/moderations", "text/plain; charset=utf-8", canonical, key); r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the same bytes and media type: %d %v, want the replay", r.status, r.header)
	}
}
