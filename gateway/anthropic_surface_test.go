package gateway

import (
	"bytes"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// TestAnthropicHeadersOnlyToAnthropic: anthropic-version and
// anthropic-beta reach an Anthropic upstream as the client sent them,
// and never an OpenAI one (chat, embeddings), where they mean nothing
// and would tell the provider what else the client runs.
func TestAnthropicHeadersOnlyToAnthropic(t *testing.T) {
	h := newMessagesHarness(t, nil)
	hdr := map[string]string{"Authorization": "Bearer " + gwClientKey, "Anthropic-Version": "2023-06-01", "Anthropic-Beta": "files-api-2025-04-14"}
	if r := h.chat(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}]}`, hdr); r.status != http.StatusOK {
		t.Fatalf("chat: %d %s", r.status, r.body)
	}
	if r := h.do(http.MethodPost, "/v1/embeddings", `{"model":"gpt-4o-mini","input":"hi"}`, hdr); r.status != http.StatusOK {
		t.Fatalf("embeddings: %d %s", r.status, r.body)
	}
	if r := h.messages("/v1/messages", messagesBody, map[string]string{"Anthropic-Beta": "files-api-2025-04-14"}); r.status != http.StatusOK {
		t.Fatalf("messages: %d %s", r.status, r.body)
	}
	reqs := h.fake.Requests()
	if len(reqs) != 2 {
		t.Fatalf("the OpenAI upstream saw %d requests, want 2", len(reqs))
	}
	for _, rq := range reqs {
		for _, k := range []string{"Anthropic-Version", "Anthropic-Beta"} {
			if v := rq.Header.Get(k); v != "" {
				t.Errorf("the OpenAI upstream saw %s: %s on %s", k, v, rq.Path)
			}
		}
	}
	up := h.ant.Requests()[0]
	if up.Header.Get("Anthropic-Version") != "2023-06-01" || up.Header.Get("Anthropic-Beta") != "files-api-2025-04-14" {
		t.Errorf("the Anthropic upstream saw version %q beta %q", up.Header.Get("Anthropic-Version"), up.Header.Get("Anthropic-Beta"))
	}
}

// anthropicHdr is an Anthropic SDK's request as the team client.
var anthropicHdr = map[string]string{"X-Api-Key": gwClientKey, "Anthropic-Version": "2023-06-01"}

// withSecondAnthropic adds a second Anthropic upstream, "anthropic-b",
// serving claude-3-* models from ant.
func withSecondAnthropic(t *testing.T, ant *fakeprovider.Anthropic) func(*config.Config) {
	url := newTestServer(t, ant)
	return func(c *config.Config) {
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "anthropic-b", BaseURL: url, APIKey: anthropicKey,
			API: config.APIAnthropic, Models: []string{"claude-3-*"}, Timeout: config.Duration(5 * time.Second)})
	}
}

// anthropicList is Anthropic's list shape, every member required.
type anthropicList struct {
	Data    []json.RawMessage `json:"data"`
	HasMore *bool             `json:"has_more"`
	FirstID *string           `json:"first_id"`
	LastID  *string           `json:"last_id"`
}

func decodeAnthropicList(t *testing.T, r result) anthropicList {
	t.Helper()
	var l anthropicList
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if r.status != http.StatusOK || dec.Decode(&l) != nil || l.HasMore == nil || l.Data == nil {
		t.Fatalf("not Anthropic's list: %d %s", r.status, r.body)
	}
	return l
}

// wantPage checks a page holds exactly the fake's model objects for ids
// (byte for byte), and its has_more, first_id and last_id.
func wantPage(t *testing.T, l anthropicList, more bool, ids ...string) {
	t.Helper()
	var got []string
	for _, d := range l.Data {
		got = append(got, string(d))
	}
	var want []string
	for _, id := range ids {
		want = append(want, fakeprovider.AnthropicModel(id))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("page:\n%s\nwant, as the upstreams wrote them:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if *l.HasMore != more {
		t.Errorf("has_more = %v, want %v", *l.HasMore, more)
	}
	if len(ids) == 0 {
		if l.FirstID != nil || l.LastID != nil {
			t.Errorf("empty page: first_id %v last_id %v, want null", l.FirstID, l.LastID)
		}
		return
	}
	if l.FirstID == nil || *l.FirstID != ids[0] || l.LastID == nil || *l.LastID != ids[len(ids)-1] {
		t.Errorf("first_id %v last_id %v, want %s %s", l.FirstID, l.LastID, ids[0], ids[len(ids)-1])
	}
}

// TestAnthropicModelsList: GET /v1/models with anthropic-version is
// Anthropic's list, made as the OpenAI one is — every Anthropic
// upstream's list (all of its pages) merged in config order, a duplicate
// id once, items byte for byte, the client's lifecycle filter forwarded —
// and paged for the client by limit, after_id and before_id. No OpenAI
// upstream is asked; without the header the list is OpenAI's, as before.
func TestAnthropicModelsList(t *testing.T) {
	second := fakeprovider.NewAnthropic()
	second.SetModels(0, "claude-haiku-4-5", "claude-3-7-sonnet")
	h := newMessagesHarness(t, withSecondAnthropic(t, second))
	h.ant.SetModels(2, "claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1")

	first := decodeAnthropicList(t, h.do(http.MethodGet, "/v1/models?limit=2&lifecycle=active", "", anthropicHdr))
	wantPage(t, first, true, "claude-sonnet-4-5", "claude-haiku-4-5")
	wantPage(t, decodeAnthropicList(t, h.do(http.MethodGet, "/v1/models?after_id=claude-haiku-4-5", "", anthropicHdr)),
		false, "claude-opus-4-1", "claude-3-7-sonnet")
	wantPage(t, decodeAnthropicList(t, h.do(http.MethodGet, "/v1/models?before_id=claude-opus-4-1&limit=1", "", anthropicHdr)),
		true, "claude-haiku-4-5")
	wantPage(t, decodeAnthropicList(t, h.do(http.MethodGet, "/v1/models?after_id=claude-3-7-sonnet", "", anthropicHdr)), false)

	reqs := h.ant.Requests()
	if len(reqs) < 2 || reqs[0].Path != "/v1/models" || reqs[0].RawQuery != "lifecycle=active&limit=1000" ||
		reqs[1].RawQuery != "after_id=claude-haiku-4-5&lifecycle=active&limit=1000" {
		t.Fatalf("the first Anthropic upstream saw %+v, want its two pages asked for with the client's lifecycle", reqs)
	}
	if got := reqs[0].Header.Get("X-Api-Key"); got != anthropicKey || reqs[0].Header.Get("Anthropic-Version") != "2023-06-01" {
		t.Errorf("upstream saw x-api-key %q, anthropic-version %q", got, reqs[0].Header.Get("Anthropic-Version"))
	}
	if n := h.fake.Calls("/v1/models"); n != 0 {
		t.Errorf("the OpenAI upstream was asked %d times for an Anthropic list", n)
	}

	before := h.ant.Calls()
	openai := h.do(http.MethodGet, "/v1/models", "", map[string]string{"Authorization": "Bearer " + gwClientKey})
	if openai.status != 200 || !strings.Contains(string(openai.body), `"object":"list"`) || h.ant.Calls() != before {
		t.Errorf("without anthropic-version: %d %s (Anthropic calls %d -> %d)", openai.status, openai.body, before, h.ant.Calls())
	}
	wantAnthropicError(t, h.do(http.MethodGet, "/v1/models?limit=0", "", anthropicHdr), http.StatusBadRequest, "invalid_request_error")
	wantAnthropicError(t, h.do(http.MethodGet, "/v1/models", "", map[string]string{"Anthropic-Version": "2023-06-01"}),
		http.StatusUnauthorized, "authentication_error")
}

// TestAnthropicModelsNoUpstreamAnswers: when no Anthropic upstream
// answers, the list is a 502 in Anthropic's shape.
func TestAnthropicModelsNoUpstreamAnswers(t *testing.T) {
	h := newMessagesHarness(t, func(c *config.Config) { c.Upstreams[1].BaseURL = "http://127.0.0.1:1" })
	wantAnthropicError(t, h.do(http.MethodGet, "/v1/models", "", anthropicHdr), http.StatusBadGateway, "api_error")
}

// TestAnthropicModelRetrieve: GET /v1/models/{id} of a model an Anthropic
// upstream serves goes there (base_url + /v1/models/{id}), its object
// relayed as it came, with or without anthropic-version; on an Anthropic
// request a model no Anthropic upstream serves (an OpenAI one) is a 404
// not_found_error in Anthropic's shape, with no upstream call.
func TestAnthropicModelRetrieve(t *testing.T) {
	h := newMessagesHarness(t, nil)
	for _, hdr := range []map[string]string{anthropicHdr, {"Authorization": "Bearer " + gwClientKey}} {
		r := h.do(http.MethodGet, "/v1/models/claude-sonnet-4-5", "", hdr)
		if want := fakeprovider.AnthropicModel("claude-sonnet-4-5"); r.status != 200 || string(r.body) != want {
			t.Fatalf("%v: %d %s, want %s", hdr, r.status, r.body, want)
		}
	}
	if reqs := h.ant.Requests(); len(reqs) != 2 || reqs[0].Path != "/v1/models/claude-sonnet-4-5" || reqs[0].Method != http.MethodGet {
		t.Fatalf("the Anthropic upstream saw %+v", reqs)
	}
	calls := h.fake.Calls("")
	wantAnthropicError(t, h.do(http.MethodGet, "/v1/models/gpt-4o-mini", "", anthropicHdr), http.StatusNotFound, "not_found_error")
	wantAnthropicError(t, h.do(http.MethodGet, "/v1/models/mistral-large", "", anthropicHdr), http.StatusNotFound, "not_found_error")
	if h.ant.Calls() != 2 || h.fake.Calls("") != calls {
		t.Errorf("an unserved model reached an upstream")
	}
}

// anthropicTenants is the messages harness with alice and bob, who share
// both upstreams' keys, as Anthropic SDK clients.
func anthropicTenants(t *testing.T) *messagesHarness {
	t.Helper()
	return newMessagesHarness(t, func(c *config.Config) {
		c.Clients = []config.Client{{Name: "alice", Key: aliceKey}, {Name: "bob", Key: bobKey}}
	})
}

var (
	antAlice = map[string]string{"X-Api-Key": aliceKey, "Anthropic-Version": "2023-06-01", "Anthropic-Beta": "files-api-2025-04-14"}
	antBob   = map[string]string{"X-Api-Key": bobKey, "Anthropic-Version": "2023-06-01", "Anthropic-Beta": "files-api-2025-04-14"}
)

// wantAnthropicNotFound checks r is a 404 not_found_error in Anthropic's
// shape and that no upstream was called since calls.
func wantAnthropicNotFound(t *testing.T, h *messagesHarness, r result, calls int) {
	t.Helper()
	wantAnthropicError(t, r, http.StatusNotFound, "not_found_error")
	if n := h.ant.Calls() + h.fake.Calls(""); n != calls {
		t.Fatalf("the refused request reached an upstream (%d calls, want %d)", n, calls)
	}
}

func upstreamCalls(h *messagesHarness) int { return h.ant.Calls() + h.fake.Calls("") }

// TestAnthropicFilesOwned: /v1/files with anthropic-version is Anthropic's
// Files API, on the Anthropic upstream (its path, its key, the beta
// header as sent), and its file ids are the uploader's as OpenAI's are:
// bob can neither read, download nor delete alice's file, nor list
// everyone's (403); alice can. Without anthropic-version the same path is
// OpenAI's, and alice's Anthropic file is no object there.
func TestAnthropicFilesOwned(t *testing.T) {
	h := anthropicTenants(t)
	r := uploadAnthropic(h, antAlice, "alice's notes")
	if r.status != http.StatusOK {
		t.Fatalf("upload: %d %s", r.status, r.body)
	}
	file := decodeID(t, r.body)
	up := h.ant.Requests()
	if len(up) != 1 || up[0].Method != http.MethodPost || up[0].Path != "/v1/files" || up[0].Header.Get("X-Api-Key") != anthropicKey ||
		up[0].Header.Get("Anthropic-Beta") != "files-api-2025-04-14" || !strings.Contains(string(up[0].Body), "alice's notes") {
		t.Fatalf("the Anthropic upstream saw %+v", up)
	}
	if n := h.fake.Calls(""); n != 0 {
		t.Fatalf("the OpenAI upstream saw %d calls", n)
	}
	calls := upstreamCalls(h)
	for _, rq := range []struct{ method, path string }{
		{http.MethodGet, "/v1/files/" + file}, {http.MethodGet, "/v1/files/" + file + "/content"}, {http.MethodDelete, "/v1/files/" + file},
		{http.MethodGet, "/v1/files/file_never_handed_out"},
	} {
		wantAnthropicNotFound(t, h, h.do(rq.method, rq.path, "", antBob), calls)
	}
	wantAnthropicError(t, h.do(http.MethodGet, "/v1/files", "", antBob), http.StatusForbidden, "permission_error")
	// On OpenAI's Files API (no anthropic-version) alice's Anthropic file
	// is not hers to name: a 404 in OpenAI's shape, no upstream call.
	if e := wantOpenAIError(t, h.do(http.MethodGet, "/v1/files/"+file, "", map[string]string{"Authorization": "Bearer " + aliceKey}),
		http.StatusNotFound); e["code"] != "file_not_found" || upstreamCalls(h) != calls {
		t.Errorf("without anthropic-version: %v, %d upstream calls, want %d", e, upstreamCalls(h), calls)
	}

	if r := h.do(http.MethodGet, "/v1/files/"+file, "", antAlice); r.status != 200 || decodeID(t, r.body) != file {
		t.Fatalf("alice reads her file: %d %s", r.status, r.body)
	}
	if r := h.do(http.MethodGet, "/v1/files/"+file+"/content", "", antAlice); r.status != 200 || string(r.body) != "alice's notes" {
		t.Fatalf("alice downloads her file: %d %s", r.status, r.body)
	}
	if r := h.do(http.MethodDelete, "/v1/files/"+file, "", antAlice); r.status != 200 || !strings.Contains(string(r.body), `"file_deleted"`) {
		t.Fatalf("alice deletes her file: %d %s", r.status, r.body)
	}
	if up := h.ant.Requests(); up[len(up)-1].Method != http.MethodDelete || up[len(up)-1].Path != "/v1/files/"+file {
		t.Fatalf("the delete reached %+v", up[len(up)-1])
	}
}

// documentBody is a Messages body that names file in a document source,
// an image source inside a tool_result, or a container_upload block.
func documentBody(where, file string) string {
	src := `{"type":"file","file_id":"` + file + `"}`
	var content string
	switch where {
	case "document":
		content = `[{"type":"document","source":` + src + `},{"type":"text","text":"Sum it up."}]`
	case "tool_result image":
		content = `[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"image","source":` + src + `}]}]`
	case "container_upload":
		content = `[{"type":"container_upload","file_id":"` + file + `"}]`
	}
	return `{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":` + content + `}]}`
}

// TestMessagesFileIDsOwned: under a shared key a Messages (or
// count_tokens) body naming a file in a document or image source — also
// inside a tool_result — or a container_upload block is a 404
// not_found_error in Anthropic's shape before any upstream call unless
// the file is the client's on an Anthropic upstream: bob's request naming
// alice's file, and alice's naming a file she holds on the OpenAI
// upstream, never leave the gateway; alice's own goes as it is. A
// tool_use block's input (the model's arguments for the client's own
// tool) names no provider object.
func TestMessagesFileIDsOwned(t *testing.T) {
	h := anthropicTenants(t)
	r := uploadAnthropic(h, antAlice, "report")
	if r.status != http.StatusOK {
		t.Fatalf("upload: %d %s", r.status, r.body)
	}
	file := decodeID(t, r.body)
	if err := h.store.PutOwner(t.Context(), "alice", "file-openai", cache.Owner{Upstream: "primary", Kind: "file"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, where := range []string{"document", "tool_result image", "container_upload"} {
		t.Run(where, func(t *testing.T) {
			calls := upstreamCalls(h)
			for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
				wantAnthropicNotFound(t, h, h.do(http.MethodPost, path, documentBody(where, file), antBob), calls)
				wantAnthropicNotFound(t, h, h.do(http.MethodPost, path, documentBody(where, "file-openai"), antAlice), calls)
			}
			body := documentBody(where, file)
			if r := h.do(http.MethodPost, "/v1/messages", body, antAlice); r.status != http.StatusOK {
				t.Fatalf("alice names her file: %d %s", r.status, r.body)
			}
			up := h.ant.Requests()
			if last := up[len(up)-1]; last.Path != "/v1/messages" || string(last.Body) != body {
				t.Fatalf("the upstream saw %s %s", last.Path, last.Body)
			}
		})
	}
	// The arguments the model wrote for bob's own tool, passed back in
	// the history, are no file of the provider's: not checked.
	history := `{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"open my doc"},` +
		`{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"drive_open","input":{"file_id":"doc-123"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"opened"}]}]}`
	if r := h.do(http.MethodPost, "/v1/messages", history, antBob); r.status != http.StatusOK {
		t.Fatalf("a tool_use input naming a file_id: %d %s", r.status, r.body)
	}
}

// messageWith is a message answer with extra top-level members and
// content blocks.
func messageWith(top, content string) string {
	return `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":` + content + `,` + top +
		`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}`
}

// TestMessagesContainerOwned: the container a message's code ran in
// (the answer's top-level container.id, of a JSON answer or a stream's
// message_start) becomes its client's; under a shared key a Messages or
// count_tokens body naming a container (a string, or an object's id) that
// is not the client's is a 404 not_found_error in Anthropic's shape with
// no upstream call. Ids bob gets echoed in text, a tool's input, a code
// execution result or a content block's own "container" never become
// his.
func TestMessagesContainerOwned(t *testing.T) {
	h := anthropicTenants(t)
	h.ant.Enqueue(fakeprovider.AnthropicStep{Body: messageWith(`"container":{"id":"container_alice1","expires_at":"2026-12-02T05:00:00Z"},`,
		`[{"type":"text","text":"ran"}]`)})
	tools := `"tools":[{"type":"code_execution_20250825","name":"code_execution"}]`
	create := `{"model":"claude-sonnet-4-5","max_tokens":64,` + tools + `,"messages":[{"role":"user","content":"run 1+1"}]}`
	if r := h.do(http.MethodPost, "/v1/messages", create, antAlice); r.status != http.StatusOK {
		t.Fatalf("alice's container: %d %s", r.status, r.body)
	}
	start := fakeprovider.AnthropicStart("claude-sonnet-4-5")
	start[0] = strings.Replace(start[0], `"content":[]`, `"content":[],"container":{"id":"container_alice2","expires_at":"2026-12-02T05:00:00Z"}`, 1)
	h.ant.Enqueue(fakeprovider.AnthropicStep{Events: append(start, append([]string{fakeprovider.AnthropicTextDelta("ok")}, fakeprovider.AnthropicEnd("end_turn")...)...)})
	if r := h.do(http.MethodPost, "/v1/messages", strings.Replace(create, `"max_tokens"`, `"stream":true,"max_tokens"`, 1), antAlice); r.status != http.StatusOK {
		t.Fatalf("alice's streamed container: %d %s", r.status, r.body)
	}
	planted := `{"container":{"id":"container_planted"},"container_id":"container_planted"}`
	quoted, _ := json.Marshal(planted)
	h.ant.Enqueue(fakeprovider.AnthropicStep{Body: messageWith(`"metadata":`+planted+`,`, `[{"type":"text","text":`+string(quoted)+`},`+
		`{"type":"tool_use","id":"toolu_1","name":"t","input":`+planted+`},`+
		`{"type":"code_execution_tool_result","tool_use_id":"srvtoolu_1","content":{"type":"code_execution_result","stdout":`+string(quoted)+`,"container":{"id":"container_planted"}}}]`)})
	h.ant.Enqueue(fakeprovider.AnthropicStep{Body: `{"type":"message_batch","id":"msgbatch_1","container":{"id":"container_planted"}}`})
	for range 2 {
		if r := h.do(http.MethodPost, "/v1/messages", messagesBody, antBob); r.status != http.StatusOK {
			t.Fatalf("bob's plant: %d %s", r.status, r.body)
		}
	}

	named := func(c string) string {
		return `{"model":"claude-sonnet-4-5","max_tokens":64,"container":` + c + `,` + tools + `,"messages":[{"role":"user","content":"go on"}]}`
	}
	calls := upstreamCalls(h)
	for _, c := range []string{`"container_alice1"`, `{"id":"container_alice2"}`, `"container_planted"`, `{"id":"container_planted","skills":[]}`} {
		for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
			wantAnthropicNotFound(t, h, h.do(http.MethodPost, path, named(c), antBob), calls)
		}
	}
	for _, c := range []string{`"container_alice1"`, `{"id":"container_alice1"}`, `"container_alice2"`} {
		if r := h.do(http.MethodPost, "/v1/messages", named(c), antAlice); r.status != http.StatusOK {
			t.Fatalf("alice names her container %s: %d %s", c, r.status, r.body)
		}
	}
	// An object with no id asks for a new container: nothing to check.
	if r := h.do(http.MethodPost, "/v1/messages", named(`{"skills":[]}`), antBob); r.status != http.StatusOK {
		t.Fatalf("a new container: %d %s", r.status, r.body)
	}
}

// TestAnthropicSurfaceWithoutAnthropicUpstream: with no Anthropic
// upstream, an Anthropic request for the models is an empty list and for
// the Files API a 404 in Anthropic's shape; neither reaches the OpenAI
// upstream.
func TestAnthropicSurfaceWithoutAnthropicUpstream(t *testing.T) {
	h := newHarness(t, nil)
	hdr := map[string]string{"Anthropic-Version": "2023-06-01"}
	wantPage(t, decodeAnthropicList(t, h.do(http.MethodGet, "/v1/models", "", hdr)), false)
	wantAnthropicError(t, h.do(http.MethodGet, "/v1/files", "", hdr), http.StatusNotFound, "not_found_error")
	if n := h.fake.Calls(""); n != 0 {
		t.Errorf("the OpenAI upstream saw %d calls", n)
	}
}

// TestAnthropicUploadKeyed: a keyed upload to Anthropic's Files API is
// run once and replayed byte for byte (the file stays its uploader's);
// the same key with another anthropic-beta is a 422 in Anthropic's shape,
// since the headers choose the answer as the body does.
func TestAnthropicUploadKeyed(t *testing.T) {
	h := anthropicTenants(t)
	keyed := map[string]string{"Idempotency-Key": "upload-1"}
	for k, v := range antAlice {
		keyed[k] = v
	}
	first := uploadAnthropic(h, keyed, "same")
	second := uploadAnthropic(h, keyed, "same")
	if first.status != 200 || second.status != 200 || string(first.body) != string(second.body) || second.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %s / %d %s %v", first.status, first.body, second.status, second.body, second.header)
	}
	if n := h.ant.Calls(); n != 1 {
		t.Fatalf("upstream calls %d, want 1", n)
	}
	if r := h.do(http.MethodGet, "/v1/files/"+decodeID(t, first.body), "", antAlice); r.status != 200 {
		t.Fatalf("alice's replayed file: %d %s", r.status, r.body)
	}
	keyed["Anthropic-Beta"] = "files-api-2025-04-14,other-beta"
	wantAnthropicError(t, uploadAnthropic(h, keyed, "same"), http.StatusUnprocessableEntity, "invalid_request_error")
}

// uploadAnthropicBoundary is uploadAnthropic with a fixed multipart
// boundary, so that the same content is the same body.
func uploadAnthropic(h *messagesHarness, who map[string]string, content string) result {
	h.t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	mw.SetBoundary("llmgate-test-boundary")
	fw, _ := mw.CreateFormFile("file", "notes.txt")
	fw.Write([]byte(content))
	mw.Close()
	hdr := map[string]string{"Content-Type": mw.FormDataContentType()}
	for k, v := range who {
		hdr[k] = v
	}
	return h.do(http.MethodPost, "/v1/files", buf.String(), hdr)
}

// TestMessageBatchNamesContainer: under a shared key, a Message Batches
// create is checked as each of its requests' params would be on
// /v1/messages: bob's batch naming alice's container (the params'
// "container", which the body-wide scan does not read; also under a
// member named in another case) is a 404 that never reaches the provider,
// while alice's batch naming hers is sent. So is a body the check could
// not decode before, whose container went upstream unchecked (found by
// the hostile-tenant run): a request list with a member that is not an
// object, a second "requests" member, a single request in place of the
// list, params as an array, a key spelled with an escape.
func TestMessageBatchNamesContainer(t *testing.T) {
	h := anthropicTenants(t)
	h.ant.Enqueue(fakeprovider.AnthropicStep{Body: messageWith(`"container":{"id":"container_alice9","expires_at":"2026-12-02T05:00:00Z"},`,
		`[{"type":"text","text":"ran"}]`)})
	tools := `"tools":[{"type":"code_execution_20250825","name":"code_execution"}]`
	if r := h.do(http.MethodPost, "/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":64,`+tools+`,"messages":[{"role":"user","content":"run"}]}`, antAlice); r.status != http.StatusOK {
		t.Fatalf("alice's container: %d %s", r.status, r.body)
	}
	batch := func(requests, params, container string) string {
		return `{"` + requests + `":[{"custom_id":"x","` + params + `":{"model":"claude-sonnet-4-5","max_tokens":64,"container":` + container +
			`,` + tools + `,"messages":[{"role":"user","content":"cat /tmp/*"}]}}]}`
	}
	// ending replaces the batch's last "}]}" (its one request's end, the
	// list's, the body's) with end.
	ending := func(b, end string) string { return strings.TrimSuffix(b, "}]}") + end }
	calls := upstreamCalls(h)
	for _, b := range []string{batch("requests", "params", `"container_alice9"`), batch("requests", "params", `{"id":"container_alice9"}`),
		batch("requests", "Params", `"container_alice9"`), batch(`r\u0065quests`, "params", `"container_alice9"`),
		ending(batch("requests", "params", `"container_alice9"`), "},5]}"),
		ending(batch("requests", "params", `"container_alice9"`), `}],"requests":[]}`),
		ending(strings.Replace(batch("requests", "params", `"container_alice9"`), ":[{", ":{", 1), "}}"),
		`{"requests":[{"custom_id":"a","params":[{"model":"claude-x","max_tokens":5,"container":"container_alice9"}]}]}`,
	} {
		wantAnthropicNotFound(t, h, h.do(http.MethodPost, "/v1/messages/batches", b, antBob), calls)
	}
	if r := h.do(http.MethodPost, "/v1/messages/batches", batch("requests", "params", `"container_alice9"`), antAlice); r.status != http.StatusOK {
		t.Fatalf("alice's batch naming her container: %d %s", r.status, r.body)
	}
}

// TestAnthropicRoutesErrorShapeEveryMethod: a method a route does not
// serve is refused in the route's API's shape whatever the method: on
// /v1/messages (and its sub-paths) Anthropic's always, on a route both
// APIs have (/v1/models, /v1/files) Anthropic's when the request sends
// anthropic-version. Before, OPTIONS and TRACE on /v1/messages, and POST,
// PUT, PATCH, DELETE or OPTIONS on /v1/models, were answered in OpenAI's
// shape, which the Anthropic SDKs do not parse.
func TestAnthropicRoutesErrorShapeEveryMethod(t *testing.T) {
	h := newMessagesHarness(t, nil)
	for _, tc := range []struct{ method, path string }{
		{http.MethodOptions, "/v1/messages"}, {http.MethodTrace, "/v1/messages"}, {http.MethodGet, "/v1/messages"},
		{http.MethodOptions, "/v1/messages/batches"}, {http.MethodPut, "/v1/messages/count_tokens"},
		{http.MethodPost, "/v1/models"}, {http.MethodPut, "/v1/models"}, {http.MethodPatch, "/v1/models"},
		{http.MethodDelete, "/v1/models"}, {http.MethodOptions, "/v1/models"}, {http.MethodPost, "/v1/models/claude-sonnet-4-5"},
		{http.MethodOptions, "/v1/files"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r := h.do(tc.method, tc.path, "", anthropicHdr)
			if r.status != http.StatusNotFound && r.status != http.StatusMethodNotAllowed {
				t.Fatalf("status %d %s, want 404 or 405", r.status, r.body)
			}
			wantAnthropicError(t, r, r.status, map[int]string{http.StatusNotFound: "not_found_error", http.StatusMethodNotAllowed: "invalid_request_error"}[r.status])
			if strings.Contains(string(r.body), "openai.com") {
				t.Fatalf("an Anthropic error pointing at OpenAI's docs: %s", r.body)
			}
		})
	}
	// An unclean path on an Anthropic route: Anthropic's shape, and docs.
	r := h.do(http.MethodGet, "/v1/files/file_1%2F..%2Fx", "", anthropicHdr)
	wantAnthropicError(t, r, http.StatusNotFound, "not_found_error")
	if strings.Contains(string(r.body), "openai.com") {
		t.Fatalf("an Anthropic error pointing at OpenAI's docs: %s", r.body)
	}
	// Without anthropic-version a shared route is OpenAI's, as before.
	wantOpenAIError(t, h.do(http.MethodPost, "/v1/models", "", map[string]string{"Authorization": "Bearer " + gwClientKey}), http.StatusNotFound)
}
