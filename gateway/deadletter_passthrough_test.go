package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/llmgate/llmgate/config"
)

// A dead-lettered multipart or binary passthrough request is stored without
// its body (only JSON bodies are held whole). The operator's replay refuses
// such a letter, saying the body was not kept and the client must resend,
// sends nothing upstream, and keeps the letter; a JSON passthrough letter
// still replays.
func TestDeadLetterWithoutBodyIsNotReplayed(t *testing.T) {
	mpType, mp := multipartBody(t, "dlqb0undary", [][2]string{{"purpose", "batch"}}, []byte(`{"custom_id":"1"}`+"\n"))
	cases := []struct {
		name, path, contentType string
		body                    []byte
	}{
		{"multipart", "/v1/files", mpType, mp},
		{"binary", "/v1/files", "application/octet-stream", []byte("\x00\x01binary bytes\xff")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var failing atomic.Bool
			failing.Store(true)
			rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if failing.Load() {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"object":"file"}`))
			})
			h := passHarness(t, rec, func(c *config.Config) { c.Retry.MaxAttempts = 1 })
			key := map[string]string{"Idempotency-Key": "upload-" + tc.name}
			if r := h.sendRaw(http.MethodPost, tc.path, tc.contentType, tc.body, key); r.status != http.StatusServiceUnavailable {
				t.Fatalf("failing upload: %d %s", r.status, r.body)
			}
			l := listDLQ(t, h, "")
			if l.Total != 1 {
				t.Fatalf("dead letters %d, want 1", l.Total)
			}
			d := l.DeadLetters[0]
			if !d.BodyNotKept || d.BodySize != len(tc.body) {
				t.Fatalf("letter: body_not_kept %v body_size %d, want true and %d", d.BodyNotKept, d.BodySize, len(tc.body))
			}
			sent := len(rec.seen())

			failing.Store(false)
			r := h.admin(http.MethodPost, "/admin/deadletters/"+d.ID+"/replay")
			var res struct {
				Status int
				Error  string
			}
			if err := json.Unmarshal(r.body, &res); err != nil {
				t.Fatalf("replay answer %d %s: %v", r.status, r.body, err)
			}
			if n := len(rec.seen()); n != sent {
				for _, s := range rec.seen()[sent:] {
					t.Logf("sent upstream: %s %s %q body %d bytes", s.method, s.path, s.contentType, len(s.body))
				}
				t.Fatalf("replay sent %d request(s) upstream, want none", n-sent)
			}
			if res.Status != 0 || !strings.Contains(res.Error, "not kept") || !strings.Contains(res.Error, "resend") {
				t.Fatalf("replay: %d %s; want it refused (body not kept, the client must resend)", r.status, r.body)
			}
			if l := listDLQ(t, h, ""); l.Total != 1 || l.DeadLetters[0].ID != d.ID {
				t.Fatalf("after the refused replay: %+v, want the letter kept", l)
			}
			// The group replay refuses it the same way.
			r = h.admin(http.MethodPost, "/admin/deadletters/replay?upstream="+d.Upstreams[0])
			if r.status != http.StatusOK || !strings.Contains(string(r.body), `"succeeded":0`) || !strings.Contains(string(r.body), "not kept") {
				t.Fatalf("group replay: %d %s", r.status, r.body)
			}
			if n := len(rec.seen()); n != sent {
				t.Fatalf("group replay sent %d request(s) upstream, want none", n-sent)
			}
			if l := listDLQ(t, h, ""); l.Total != 1 {
				t.Fatalf("after the group replay: %+v, want the letter kept", l)
			}
		})
	}
}

// A JSON passthrough body is kept whole, and its letter replays.
func TestDeadLetterJSONPassthroughReplays(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"list","data":[]}`))
	})
	h := passHarness(t, rec, func(c *config.Config) { c.Retry.MaxAttempts = 1 })
	body := []byte(`{"model":"gpt-image-1","prompt":"a lighthouse"}`)
	key := map[string]string{"Idempotency-Key": "image-1"}
	if r := h.sendRaw(http.MethodPost, "/v1/images/generations", "application/json", body, key); r.status != http.StatusServiceUnavailable {
		t.Fatalf("failing request: %d %s", r.status, r.body)
	}
	l := listDLQ(t, h, "")
	if l.Total != 1 || l.DeadLetters[0].BodyNotKept || l.DeadLetters[0].BodySize != len(body) {
		t.Fatalf("letters: %+v", l)
	}
	failing.Store(false)
	r := h.admin(http.MethodPost, "/admin/deadletters/"+l.DeadLetters[0].ID+"/replay")
	if r.status != http.StatusOK || !strings.Contains(string(r.body), `"status":200`) {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	seen := rec.seen()
	if last := seen[len(seen)-1]; string(last.body) != string(body) {
		t.Fatalf("replay sent %q, want %q", last.body, body)
	}
	if l := listDLQ(t, h, ""); l.Total != 0 {
		t.Fatalf("replayed letter not resolved: %+v", l)
	}
}

// A keyed passthrough POST's query is part of what its key stands for: its
// dead letter keeps the query and the operator's replay sends it, so the
// answer committed under the key is the one the client's retry asked for
// and replays (not a 422 for a different request).
func TestDeadLetterPassthroughReplayKeepsTheQuery(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"created":1,"data":[]}`))
	})
	h := passHarness(t, rec, func(c *config.Config) { c.Retry.MaxAttempts = 1 })
	const path = "/v1/images/generations?api-version=2024-10-21"
	body := []byte(`{"model":"gpt-image-1","prompt":"a lighthouse"}`)
	key := map[string]string{"Idempotency-Key": "image-q"}
	if r := h.sendRaw(http.MethodPost, path, "application/json", body, key); r.status != http.StatusServiceUnavailable {
		t.Fatalf("failing request: %d %s", r.status, r.body)
	}
	l := listDLQ(t, h, "")
	if l.Total != 1 {
		t.Fatalf("letters: %+v", l)
	}
	failing.Store(false)
	r := h.admin(http.MethodPost, "/admin/deadletters/"+l.DeadLetters[0].ID+"/replay")
	if r.status != http.StatusOK || !strings.Contains(string(r.body), `"status":200`) {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	seen := rec.seen()
	if last := seen[len(seen)-1]; last.query != "api-version=2024-10-21" {
		t.Fatalf("replay sent query %q upstream, want the client's", last.query)
	}
	calls := len(seen)
	again := h.sendRaw(http.MethodPost, path, "application/json", body, key)
	if again.status != http.StatusOK || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("client retry: %d %s, want the replayed answer", again.status, again.body)
	}
	if len(rec.seen()) != calls {
		t.Fatal("client retry called upstream")
	}
}
