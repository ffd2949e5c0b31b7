package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
)

// Tenants and the provider objects they create (issue 14, "Stateful
// objects belong to the tenant that created them"). Two clients, alice and
// bob, share the upstream's key unless a test gives one its own.

const (
	aliceKey = "sk-gw-alice-0123456789"
	bobKey   = "sk-gw-bob-0123456789"
	aliceOwn = "sk-alice-own-project-key"
)

var (
	asAlice = map[string]string{"Authorization": "Bearer " + aliceKey}
	asBob   = map[string]string{"Authorization": "Bearer " + bobKey}
)

// objectUpstream is a fake OpenAI upstream that records every request it
// sees (method, path, Authorization, body) and answers like OpenAI's
// object endpoints: each create hands out a new id.
type objectUpstream struct {
	mu   sync.Mutex
	seen []objectSeen
	n    int
}

type objectSeen struct {
	Method, Path, Auth, Body string
}

func (o *objectUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	o.mu.Lock()
	o.seen = append(o.seen, objectSeen{r.Method, r.URL.Path, r.Header.Get("Authorization"), string(body)})
	o.n++
	n := o.n
	o.mu.Unlock()
	path := strings.TrimPrefix(r.URL.Path, "/v1")
	w.Header().Set("Content-Type", "application/json")
	switch {
	case path == "/chat/completions":
		fmt.Fprintf(w, `{"id":"chatcmpl-%d","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`, n)
	case path == "/responses" && strings.Contains(string(body), `"stream":true`):
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_s%d\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n", n)
		fmt.Fprint(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"hi\"}\n\n")
		fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_s%d\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"hi\"}]}]}}\n\n", n)
	case path == "/responses":
		fmt.Fprintf(w, `{"id":"resp_%d","object":"response","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}]}`, n)
	case strings.HasPrefix(path, "/responses/") && r.Method == http.MethodDelete:
		id := strings.TrimPrefix(path, "/responses/")
		fmt.Fprintf(w, `{"id":%q,"object":"response","deleted":true}`, id)
	case strings.HasSuffix(path, "/input_items"):
		fmt.Fprint(w, `{"object":"list","data":[],"has_more":false}`)
	case strings.HasPrefix(path, "/responses/"):
		id, _, _ := strings.Cut(strings.TrimPrefix(path, "/responses/"), "/")
		fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}]}`, id)
	case path == "/files" && r.Method == http.MethodGet:
		fmt.Fprint(w, `{"object":"list","data":[{"id":"file-everyone","object":"file"}]}`)
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"error":{"message":"not found","type":"invalid_request_error","param":null,"code":null}}`)
	}
}

// requests returns what the upstream saw since the last call.
func (o *objectUpstream) requests() []objectSeen {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.seen
	o.seen = nil
	return s
}

// ownersHarness is a gateway with alice and bob in front of an
// objectUpstream; mutate may change the config further.
func ownersHarness(t *testing.T, mutate func(*config.Config)) (*harness, *objectUpstream) {
	t.Helper()
	up := &objectUpstream{}
	s := httptest.NewServer(up)
	t.Cleanup(s.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = s.URL + "/v1"
		c.Clients = []config.Client{{Name: "alice", Key: aliceKey}, {Name: "bob", Key: bobKey}}
		if mutate != nil {
			mutate(c)
		}
	})
	return h, up
}

// wantNotFound checks r is the ownership 404 with code, and that the
// upstream saw nothing.
func wantNotFound(t *testing.T, r result, up *objectUpstream, code string) {
	t.Helper()
	e := wantOpenAIError(t, r, http.StatusNotFound)
	if e["type"] != "invalid_request_error" || e["code"] != code {
		t.Fatalf("404 error = %v, want invalid_request_error %s", e, code)
	}
	if seen := up.requests(); len(seen) != 0 {
		t.Fatalf("the upstream was called: %+v", seen)
	}
}

// TestClientOwnUpstreamKey: a client's own key for an upstream is what the
// upstream sees from it; the other client's requests carry the shared key;
// neither key reaches a log.
func TestClientOwnUpstreamKey(t *testing.T) {
	h, up := ownersHarness(t, func(c *config.Config) {
		c.Clients[0].UpstreamAPIKeys = map[string]string{"primary": aliceOwn}
	})
	for _, tc := range []struct {
		as   map[string]string
		want string
	}{{asAlice, "Bearer " + aliceOwn}, {asBob, "Bearer " + upstreamKey}} {
		if r := h.chat(chatBody, tc.as); r.status != http.StatusOK {
			t.Fatalf("chat: %d %s", r.status, r.body)
		}
		seen := up.requests()
		if len(seen) != 1 || seen[0].Auth != tc.want {
			t.Fatalf("upstream saw %+v, want Authorization %q", seen, tc.want)
		}
	}
	if logs := h.logs.String(); strings.Contains(logs, aliceOwn) || strings.Contains(logs, upstreamKey) {
		t.Fatalf("a key reached the log:\n%s", logs)
	}
}

// TestNestedFileIDsOfOthersRefused: a chat request naming a file that is
// another client's, or one llmgate never handed out, is a 404 before any
// upstream call; the owner's own file passes, to the upstream holding it.
func TestNestedFileIDsOfOthersRefused(t *testing.T) {
	h, up := ownersHarness(t, nil)
	ctx := t.Context()
	if err := h.store.PutOwner(ctx, "alice", "file-a", cache.Owner{Upstream: "primary", Kind: "file"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	body := func(id string) string {
		return `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"sum up"},{"type":"file","file":{"file_id":"` + id + `"}}]}]}`
	}
	wantNotFound(t, h.chat(body("file-a"), asBob), up, "file_not_found")
	wantNotFound(t, h.chat(body("file-never"), asAlice), up, "file_not_found")
	if r := h.chat(body("file-a"), asAlice); r.status != http.StatusOK {
		t.Fatalf("owner: %d %s", r.status, r.body)
	}
	if seen := up.requests(); len(seen) != 1 || seen[0].Body != body("file-a") {
		t.Fatalf("upstream saw %+v, want alice's body unchanged", seen)
	}
	// With her own key the provider keeps tenants apart: nothing checked.
	h2, up2 := ownersHarness(t, func(c *config.Config) {
		c.Clients[1].UpstreamAPIKeys = map[string]string{"primary": "sk-bob-own"}
	})
	if r := h2.chat(body("file-a"), asBob); r.status != http.StatusOK || len(up2.requests()) != 1 {
		t.Fatalf("own key: %d %s", r.status, r.body)
	}
}

// TestOwnershipStoreDownFailsClosed: when the store cannot say whose an id
// is, the request is not sent.
func TestOwnershipStoreDownFailsClosed(t *testing.T) {
	h, up := ownersHarness(t, nil)
	h.store.Close()
	r := h.chat(`{"model":"gpt-4o","messages":[],"tools":[{"type":"file_search","vector_store_ids":["vs_1"]}]}`, asAlice)
	e := wantOpenAIError(t, r, http.StatusServiceUnavailable)
	if e["code"] != "ownership_store_unavailable" || r.header.Get("Retry-After") == "" {
		t.Fatalf("store down: %s", r.body)
	}
	if len(up.requests()) != 0 {
		t.Fatal("the upstream was called")
	}
}

// decodeID reads an answer's id.
func decodeID(t *testing.T, b []byte) string {
	t.Helper()
	var v struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &v); err != nil || v.ID == "" {
		t.Fatalf("no id in %s", b)
	}
	return v.ID
}
