package gateway

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/llmgate/llmgate/e2e/fakeprovider"
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
	// down answers 503 to everything.
	down bool
	// holdsNone answers 404 to a response that continues another
	// (previous_response_id), as a provider that holds none does.
	holdsNone bool
}

type objectSeen struct {
	Method, Path, Auth, Body string
}

func (o *objectUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	o.mu.Lock()
	o.seen = append(o.seen, objectSeen{r.Method, r.URL.Path, r.Header.Get("Authorization"), string(body)})
	o.n++
	n, down, holdsNone := o.n, o.down, o.holdsNone
	o.mu.Unlock()
	if down {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if holdsNone && strings.Contains(string(body), `"previous_response_id"`) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"error":{"message":"Previous response not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`)
		return
	}
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
	case path == "/responses" && strings.Contains(string(body), `"code_interpreter"`):
		fmt.Fprintf(w, `{"id":"resp_%d","object":"response","status":"completed","output":[{"type":"code_interpreter_call","id":"ci_%d","container_id":"cntr_%d","code":"1+1"}]}`, n, n, n)
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
	case path == "/files" && r.Method == http.MethodPost:
		fmt.Fprintf(w, `{"id":"file-%d","object":"file","bytes":5,"purpose":"batch"}`, n)
	case path == "/batches" && r.Method == http.MethodPost:
		fmt.Fprintf(w, `{"id":"batch_%d","object":"batch","status":"validating","output_file_id":null}`, n)
	case strings.HasPrefix(path, "/batches/"):
		id := strings.TrimPrefix(path, "/batches/")
		fmt.Fprintf(w, `{"id":%q,"object":"batch","status":"completed","output_file_id":"file-out-%s","error_file_id":null}`, id, id)
	case strings.HasSuffix(path, "/content"):
		w.Header().Set("Content-Type", "application/octet-stream")
		fmt.Fprint(w, "{\"custom_id\":\"1\"}\n")
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
	return ownersHarnessStore(t, mutate, nil)
}

// ownersHarnessStore is ownersHarness with the store wrapped by wrap.
func ownersHarnessStore(t *testing.T, mutate func(*config.Config), wrap func(Store) Store) (*harness, *objectUpstream) {
	t.Helper()
	up := &objectUpstream{}
	s := httptest.NewServer(up)
	t.Cleanup(s.Close)
	h := newHarnessStore(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = s.URL + "/v1"
		c.Clients = []config.Client{{Name: "alice", Key: aliceKey}, {Name: "bob", Key: bobKey}}
		if mutate != nil {
			mutate(c)
		}
	}, wrap, fakeprovider.Options{})
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

const responseBody = `{"model":"gpt-4o","input":"hello","store":true}`

// create makes a response as who and returns its id and the answer.
func create(t *testing.T, h *harness, up *objectUpstream, body string, who map[string]string) (string, result) {
	t.Helper()
	r := h.do(http.MethodPost, "/v1/responses", body, who)
	if r.status != http.StatusOK {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	up.requests()
	if strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
		i := strings.Index(string(r.body), `"id":"`)
		if i < 0 {
			t.Fatalf("no id in the stream: %s", r.body)
		}
		id, _, _ := strings.Cut(string(r.body[i+6:]), `"`)
		return id, r
	}
	return decodeID(t, r.body), r
}

// objectRequests are the ways a client reaches a stored response by its id.
func objectRequests(id string) []struct{ method, path, body, code string } {
	return []struct{ method, path, body, code string }{
		{http.MethodGet, "/v1/responses/" + id, "", "response_not_found"},
		{http.MethodGet, "/v1/responses/" + id + "/input_items", "", "response_not_found"},
		{http.MethodPost, "/v1/responses/" + id + "/cancel", "", "response_not_found"},
		{http.MethodPost, "/v1/responses", `{"model":"gpt-4o","input":"go on","previous_response_id":"` + id + `"}`, "previous_response_not_found"},
		{http.MethodDelete, "/v1/responses/" + id, "", "response_not_found"},
	}
}

// TestTenantCannotReachAnothersResponse: bob cannot read, list the input
// items of, cancel, continue or delete alice's stored response — each is a
// 404 with no upstream call — nor one llmgate never handed out; alice can,
// each reaching the upstream once.
func TestTenantCannotReachAnothersResponse(t *testing.T) {
	h, up := ownersHarness(t, nil)
	id, _ := create(t, h, up, responseBody, asAlice)
	for _, rq := range objectRequests(id) {
		t.Run("bob "+rq.method+" "+rq.path, func(t *testing.T) {
			wantNotFound(t, h.do(rq.method, rq.path, rq.body, asBob), up, rq.code)
		})
	}
	for _, rq := range objectRequests("resp_never_seen") {
		t.Run("unknown "+rq.method+" "+rq.path, func(t *testing.T) {
			wantNotFound(t, h.do(rq.method, rq.path, rq.body, asAlice), up, rq.code)
		})
	}
	for _, rq := range objectRequests(id) {
		t.Run("alice "+rq.method+" "+rq.path, func(t *testing.T) {
			r := h.do(rq.method, rq.path, rq.body, asAlice)
			if r.status != http.StatusOK {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if seen := up.requests(); len(seen) != 1 || seen[0].Method != rq.method || seen[0].Path != rq.path || seen[0].Body != rq.body {
				t.Fatalf("upstream saw %+v", seen)
			}
		})
	}
	// What alice continued from is hers too.
	r := h.do(http.MethodPost, "/v1/responses", `{"model":"gpt-4o","input":"more","previous_response_id":"`+id+`"}`, asAlice)
	next := decodeID(t, r.body)
	up.requests()
	wantNotFound(t, h.do(http.MethodGet, "/v1/responses/"+next, "", asBob), up, "response_not_found")
}

// TestStreamedResponseIsRecorded: a streamed create's id, in its
// response.created event, is alice's before the event reaches her.
func TestStreamedResponseIsRecorded(t *testing.T) {
	h, up := ownersHarness(t, nil)
	id, r := create(t, h, up, `{"model":"gpt-4o","input":"hello","stream":true}`, asAlice)
	if !strings.Contains(string(r.body), "response.completed") {
		t.Fatalf("stream: %s", r.body)
	}
	wantNotFound(t, h.do(http.MethodGet, "/v1/responses/"+id, "", asBob), up, "response_not_found")
	if r := h.do(http.MethodGet, "/v1/responses/"+id, "", asAlice); r.status != http.StatusOK {
		t.Fatalf("alice: %d %s", r.status, r.body)
	}
}

// TestKeyedCreateReplayStaysOwned: a keyed create is recorded before its
// commit; its replay hands out the same id, still alice's, with one
// upstream call in all.
func TestKeyedCreateReplayStaysOwned(t *testing.T) {
	h, up := ownersHarness(t, nil)
	keyed := map[string]string{"Authorization": asAlice["Authorization"], "Idempotency-Key": "order-1"}
	first := h.do(http.MethodPost, "/v1/responses", responseBody, keyed)
	again := h.do(http.MethodPost, "/v1/responses", responseBody, keyed)
	if first.status != http.StatusOK || string(again.body) != string(first.body) {
		t.Fatalf("replay: %d %s / %s", first.status, first.body, again.body)
	}
	if seen := up.requests(); len(seen) != 1 {
		t.Fatalf("upstream saw %d creates, want 1", len(seen))
	}
	id := decodeID(t, again.body)
	if r := h.do(http.MethodGet, "/v1/responses/"+id, "", asAlice); r.status != http.StatusOK {
		t.Fatalf("alice after replay: %d %s", r.status, r.body)
	}
	up.requests()
	wantNotFound(t, h.do(http.MethodGet, "/v1/responses/"+id, "", asBob), up, "response_not_found")
}

// failPutOwner is a store whose ownership writes fail.
type failPutOwner struct{ Store }

func (failPutOwner) PutOwner(context.Context, string, string, cache.Owner, time.Duration) error {
	return errors.New("disk full")
}

// TestUnrecordedIDIsNotHandedOut: when the owner cannot be recorded, the
// created object's id does not reach the client (503), keyed or not.
func TestUnrecordedIDIsNotHandedOut(t *testing.T) {
	h, up := ownersHarnessStore(t, nil, func(s Store) Store { return failPutOwner{s} })
	for _, hdr := range []map[string]string{asAlice, {"Authorization": asAlice["Authorization"], "Idempotency-Key": "k-1"}} {
		for _, body := range []string{responseBody, `{"model":"gpt-4o","input":"hello","stream":true}`} {
			r := h.do(http.MethodPost, "/v1/responses", body, hdr)
			e := wantOpenAIError(t, r, http.StatusServiceUnavailable)
			if e["code"] != "ownership_store_unavailable" || strings.Contains(string(r.body), "resp_") {
				t.Fatalf("answer: %s", r.body)
			}
			if len(up.requests()) != 1 {
				t.Fatal("no upstream call")
			}
		}
	}
	// The keyed one was released: its retry runs again.
	if r := h.do(http.MethodPost, "/v1/responses", responseBody, map[string]string{"Authorization": asAlice["Authorization"], "Idempotency-Key": "k-1"}); r.status != http.StatusServiceUnavailable {
		t.Fatalf("retry: %d %s", r.status, r.body)
	}
	if len(up.requests()) != 1 {
		t.Fatal("the retry was not run again")
	}
}

// TestTenantListsRefusedUnderSharedKey: listing files under a shared key
// would show every tenant's: 403, no upstream call. With her own key
// alice lists her provider project's, with her key.
func TestTenantListsRefusedUnderSharedKey(t *testing.T) {
	h, up := ownersHarness(t, func(c *config.Config) {
		c.Clients[0].UpstreamAPIKeys = map[string]string{"primary": aliceOwn}
	})
	for _, p := range []string{"/v1/files", "/v1/batches", "/v1/vector_stores", "/v1/uploads", "/v1/conversations"} {
		e := wantOpenAIError(t, h.do(http.MethodGet, p, "", asBob), http.StatusForbidden)
		if e["code"] != "list_not_allowed" {
			t.Fatalf("%s: %v", p, e)
		}
	}
	if len(up.requests()) != 0 {
		t.Fatal("the upstream was called")
	}
	r := h.do(http.MethodGet, "/v1/files", "", asAlice)
	if r.status != http.StatusOK {
		t.Fatalf("alice: %d %s", r.status, r.body)
	}
	if seen := up.requests(); len(seen) != 1 || seen[0].Auth != "Bearer "+aliceOwn {
		t.Fatalf("upstream saw %+v", seen)
	}
}

// TestForceStoreFalse: an upstream with force_store_false gets "store":false
// in a Responses body, every other byte as the client wrote it; a chat body
// is untouched.
func TestForceStoreFalse(t *testing.T) {
	h, up := ownersHarness(t, func(c *config.Config) { c.Upstreams[0].ForceStoreFalse = true })
	for _, tc := range []struct{ body, want string }{
		{`{"model":"gpt-4o", "store": true ,"input":"hi"}`, `{"model":"gpt-4o", "store": false ,"input":"hi"}`},
		{`{"model":"gpt-4o","input":"hi"}`, `{"store":false,"model":"gpt-4o","input":"hi"}`},
	} {
		if r := h.do(http.MethodPost, "/v1/responses", tc.body, asAlice); r.status != http.StatusOK {
			t.Fatalf("%d %s", r.status, r.body)
		}
		if seen := up.requests(); len(seen) != 1 || seen[0].Body != tc.want {
			t.Fatalf("upstream saw %+v, want body %s", seen, tc.want)
		}
	}
	// Nothing stored upstream, nothing recorded: its id names nothing.
	id, _ := create(t, h, up, responseBody, asAlice)
	wantNotFound(t, h.do(http.MethodGet, "/v1/responses/"+id, "", asAlice), up, "response_not_found")
	if _, err := h.store.GetOwner(t.Context(), "alice", id); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("a response not stored upstream was recorded: %v", err)
	}
	chat := `{"model":"gpt-4o","store":true,"messages":[]}`
	h.chat(chat, asAlice)
	if seen := up.requests(); len(seen) != 1 || seen[0].Body != chat {
		t.Fatalf("chat body changed: %+v", seen)
	}
}

// TestFilesAndBatchesOwned: a file alice uploads, the batch she runs on it
// and the output file the batch writes are hers: bob can neither start a
// batch on her file nor read the batch or its output.
func TestFilesAndBatchesOwned(t *testing.T) {
	h, up := ownersHarness(t, nil)
	r := uploadAs(h, asAlice)
	if r.status != http.StatusOK {
		t.Fatalf("upload: %d %s", r.status, r.body)
	}
	file := decodeID(t, r.body)
	up.requests()
	batchBody := `{"input_file_id":"` + file + `","endpoint":"/v1/chat/completions","completion_window":"24h"}`
	wantNotFound(t, h.do(http.MethodPost, "/v1/batches", batchBody, asBob), up, "file_not_found")
	wantNotFound(t, h.do(http.MethodGet, "/v1/files/"+file, "", asBob), up, "file_not_found")
	r = h.do(http.MethodPost, "/v1/batches", batchBody, asAlice)
	if r.status != http.StatusOK {
		t.Fatalf("batch: %d %s", r.status, r.body)
	}
	batch := decodeID(t, r.body)
	up.requests()
	wantNotFound(t, h.do(http.MethodGet, "/v1/batches/"+batch, "", asBob), up, "batch_not_found")
	if r := h.do(http.MethodGet, "/v1/batches/"+batch, "", asAlice); r.status != http.StatusOK {
		t.Fatalf("alice's batch: %d %s", r.status, r.body)
	}
	out := "file-out-" + batch
	up.requests()
	wantNotFound(t, h.do(http.MethodGet, "/v1/files/"+out+"/content", "", asBob), up, "file_not_found")
	if r := h.do(http.MethodGet, "/v1/files/"+out+"/content", "", asAlice); r.status != http.StatusOK || !strings.Contains(string(r.body), "custom_id") {
		t.Fatalf("alice's batch output: %d %s", r.status, r.body)
	}
}

// TestNamedObjectPinsItsUpstream: a request naming an object goes to the
// upstream that holds it, whatever its model routes to, and never to a
// fallback.
func TestNamedObjectPinsItsUpstream(t *testing.T) {
	other := &objectUpstream{}
	s := httptest.NewServer(other)
	t.Cleanup(s.Close)
	h, up := ownersHarness(t, func(c *config.Config) {
		c.Upstreams[0].Models = []string{"gpt-4o"}
		c.Upstreams[0].Fallbacks = []string{"second"}
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "second", BaseURL: s.URL + "/v1", Models: []string{"*"},
			Timeout: config.Duration(5 * time.Second)})
	})
	id, _ := create(t, h, up, responseBody, asAlice)
	cont := `{"model":"other-model","input":"more","previous_response_id":"` + id + `"}`
	if r := h.do(http.MethodPost, "/v1/responses", cont, asAlice); r.status != http.StatusOK || r.header.Get("X-Llmgate-Upstream") != "primary" {
		t.Fatalf("continue: %d %v %s", r.status, r.header, r.body)
	}
	if len(up.requests()) != 1 || len(other.requests()) != 0 {
		t.Fatal("the continuation did not go to the response's upstream")
	}
	up.mu.Lock()
	up.down = true
	up.mu.Unlock()
	if r := h.do(http.MethodGet, "/v1/responses/"+id, "", asAlice); r.status < 500 {
		t.Fatalf("holder down: %d %s", r.status, r.body)
	}
	if seen := other.requests(); len(seen) != 0 {
		t.Fatalf("fell back to another upstream: %+v", seen)
	}
}
