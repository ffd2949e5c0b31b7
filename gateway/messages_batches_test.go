package gateway

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

const (
	aliceBatchKey     = "sk-gw-alice-batches-0123456789"
	bobBatchKey       = "sk-gw-bob-batches-0123456789"
	carolBatchKey     = "sk-gw-carol-batches-0123456789"
	carolAnthropicKey = "sk-ant-carol-own-key-0123456789"
)

// newBatchesHarness is newMessagesHarness with three clients: alice and
// bob share the Anthropic upstream's key, carol has her own.
func newBatchesHarness(t *testing.T) *messagesHarness {
	t.Helper()
	return newMessagesHarness(t, func(c *config.Config) {
		c.Clients = []config.Client{{Name: "alice", Key: aliceBatchKey}, {Name: "bob", Key: bobBatchKey},
			{Name: "carol", Key: carolBatchKey, UpstreamAPIKeys: map[string]string{"anthropic": carolAnthropicKey}}}
	})
}

// batch sends a Message Batches request as the client with the gateway
// key gwKey (in x-api-key), with anthropic-version and hdr.
func (h *messagesHarness) batch(gwKey, method, path, body string, hdr map[string]string) result {
	h.t.Helper()
	all := map[string]string{"X-Api-Key": gwKey, "Anthropic-Version": "2023-06-01"}
	for k, v := range hdr {
		all[k] = v
	}
	return h.do(method, path, body, all)
}

// fakeURL is the Anthropic fake's own address, which its results_url
// values name.
func (h *messagesHarness) fakeURL() string { return h.cfg.Upstreams[1].BaseURL }

// gatewayResults is the gateway's URL of batch id's results.
func (h *messagesHarness) gatewayResults(id string) string {
	return h.srv.URL + "/v1/messages/batches/" + id + "/results"
}

const batchBody = `{"requests":[{"custom_id":"first","params":{"model":"claude-sonnet-4-5","max_tokens":64,"temperature":0,` +
	`"messages":[{"role":"user","content":"Hello"}]}},{"custom_id":"second","params":{"model":"claude-sonnet-4-5",` +
	`"max_tokens":64,"x_unknown":[1,2.50],"messages":[{"role":"user","content":"Hi"}]}}]}`

// TestMessageBatchesForwarded: create, get, results, cancel and delete
// reach the Anthropic upstream at base_url + the client's path, with the
// client's query, body byte for byte, anthropic-version and
// anthropic-beta as sent, and the upstream's key as x-api-key (never the
// client's gateway key); each answer comes back byte for byte but for
// results_url, which names the gateway's own URL of the batch's results —
// the fake's own address never reaches the client.
func TestMessageBatchesForwarded(t *testing.T) {
	h := newBatchesHarness(t)
	beta := map[string]string{"Anthropic-Version": "2026-10-21", "Anthropic-Beta": "message-batches-2024-09-24"}
	const id = "msgbatch_fake001"
	steps := []struct {
		method, path, body string
		want               string
	}{
		{http.MethodPost, "/v1/messages/batches?beta=true", batchBody, fakeprovider.AnthropicBatch(id, 2, "ended", h.gatewayResults(id))},
		{http.MethodGet, "/v1/messages/batches/" + id + "?beta=true", "", fakeprovider.AnthropicBatch(id, 2, "ended", h.gatewayResults(id))},
		{http.MethodGet, "/v1/messages/batches/" + id + "/results?beta=true", "",
			fakeprovider.AnthropicBatchResult("first", "claude-sonnet-4-5") + "\n" + fakeprovider.AnthropicBatchResult("second", "claude-sonnet-4-5") + "\n"},
		{http.MethodPost, "/v1/messages/batches/" + id + "/cancel?beta=true", "", fakeprovider.AnthropicBatch(id, 2, "canceling", h.gatewayResults(id))},
		{http.MethodDelete, "/v1/messages/batches/" + id + "?beta=true", "", `{"id":"msgbatch_fake001","type":"message_batch_deleted"}`},
	}
	for i, st := range steps {
		r := h.batch(aliceBatchKey, st.method, st.path, st.body, beta)
		if r.status != http.StatusOK {
			t.Fatalf("%s %s: %d %s", st.method, st.path, r.status, r.body)
		}
		if string(r.body) != st.want {
			t.Errorf("%s %s answered\n %s\nwant\n %s", st.method, st.path, r.body, st.want)
		}
		if bytes.Contains(r.body, []byte(h.fakeURL())) {
			t.Errorf("%s %s: the provider's URL reached the client: %s", st.method, st.path, r.body)
		}
		reqs := h.ant.Requests()
		if len(reqs) != i+1 {
			t.Fatalf("after %s %s the upstream saw %d requests, want %d", st.method, st.path, len(reqs), i+1)
		}
		up := reqs[i]
		if wantPath, _, _ := strings.Cut(st.path, "?"); up.Path != wantPath || up.RawQuery != "beta=true" {
			t.Errorf("upstream saw %s?%s, want %s", up.Path, up.RawQuery, st.path)
		}
		if string(up.Body) != st.body {
			t.Errorf("%s %s: body changed on its way:\n got %s\nwant %s", st.method, st.path, up.Body, st.body)
		}
		if got := up.Header.Get("X-Api-Key"); got != anthropicKey {
			t.Errorf("upstream x-api-key = %q, want the upstream's own key", got)
		}
		if got := up.Header.Get("Anthropic-Version") + " " + up.Header.Get("Anthropic-Beta"); got != "2026-10-21 message-batches-2024-09-24" {
			t.Errorf("anthropic-version and -beta upstream: %q, want the client's", got)
		}
		for k, vs := range up.Header {
			if strings.Contains(strings.Join(vs, " "), aliceBatchKey) {
				t.Errorf("the client's gateway key reached the provider in %s", k)
			}
		}
	}
}

// TestMessageBatchesList: a client with its own upstream key lists its
// batches (the provider keeps tenants apart): the query reaches the
// upstream and every results_url in data[] names the gateway. Under the
// key clients share, the list would show every client's batches: it is
// refused, 403 in Anthropic's shape, and never sent.
func TestMessageBatchesList(t *testing.T) {
	h := newBatchesHarness(t)
	if r := h.batch(carolBatchKey, http.MethodPost, "/v1/messages/batches", batchBody, nil); r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	if r := h.batch(carolBatchKey, http.MethodPost, "/v1/messages/batches", batchBody, nil); r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	r := h.batch(carolBatchKey, http.MethodGet, "/v1/messages/batches?limit=2&after_id=msgbatch_0", "", nil)
	want := `{"data":[` + fakeprovider.AnthropicBatch("msgbatch_fake002", 2, "ended", h.gatewayResults("msgbatch_fake002")) + "," +
		fakeprovider.AnthropicBatch("msgbatch_fake001", 2, "ended", h.gatewayResults("msgbatch_fake001")) +
		`],"has_more":false,"first_id":"msgbatch_fake002","last_id":"msgbatch_fake001"}`
	if r.status != 200 || string(r.body) != want {
		t.Fatalf("list: %d\n %s\nwant\n %s", r.status, r.body, want)
	}
	reqs := h.ant.Requests()
	if up := reqs[2]; up.RawQuery != "limit=2&after_id=msgbatch_0" || up.Header.Get("X-Api-Key") != carolAnthropicKey {
		t.Errorf("upstream saw ?%s with key %q, want carol's query and her own key", up.RawQuery, up.Header.Get("X-Api-Key"))
	}
	calls := h.ant.Calls()
	shared := h.batch(aliceBatchKey, http.MethodGet, "/v1/messages/batches", "", nil)
	if msg := wantAnthropicError(t, shared, http.StatusForbidden, "permission_error"); !strings.Contains(msg, "every client's") {
		t.Errorf("the refusal does not say why: %s", msg)
	}
	if n := h.ant.Calls(); n != calls {
		t.Errorf("the refused list reached the upstream (%d calls, want %d)", n, calls)
	}
}

// TestMessageBatchesCrossTenant: a batch alice created under the key she
// shares with bob is hers: bob's get, results, cancel and delete of it
// are 404 not_found_error in Anthropic's shape with no upstream call, as
// is alice's own request for an id the gateway never handed her. Alice
// still reaches her batch afterwards.
func TestMessageBatchesCrossTenant(t *testing.T) {
	h := newBatchesHarness(t)
	if r := h.batch(aliceBatchKey, http.MethodPost, "/v1/messages/batches", batchBody, nil); r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	const id = "msgbatch_fake001"
	calls := h.ant.Calls()
	for _, tc := range []struct{ who, method, path string }{
		{bobBatchKey, http.MethodGet, "/v1/messages/batches/" + id},
		{bobBatchKey, http.MethodGet, "/v1/messages/batches/" + id + "/results"},
		{bobBatchKey, http.MethodPost, "/v1/messages/batches/" + id + "/cancel"},
		{bobBatchKey, http.MethodDelete, "/v1/messages/batches/" + id},
		{aliceBatchKey, http.MethodGet, "/v1/messages/batches/msgbatch_neverhers"},
	} {
		r := h.batch(tc.who, tc.method, tc.path, "", nil)
		if msg := wantAnthropicError(t, r, http.StatusNotFound, "not_found_error"); !strings.Contains(msg, "message batch") {
			t.Errorf("%s %s: 404 message %q does not name a message batch", tc.method, tc.path, msg)
		}
	}
	if n := h.ant.Calls(); n != calls {
		t.Fatalf("another tenant's batch ids reached the upstream: %d calls, want %d: %+v", n, calls, h.ant.Requests()[calls:])
	}
	if r := h.batch(aliceBatchKey, http.MethodGet, "/v1/messages/batches/"+id, "", nil); r.status != 200 {
		t.Errorf("alice's own batch: %d %s", r.status, r.body)
	}
}

// TestMessageBatchResultsStreamed: a batch's results are relayed as the
// upstream sends them: the client reads the first line while the
// upstream still holds back the last, and the whole body is the
// upstream's, byte for byte.
func TestMessageBatchResultsStreamed(t *testing.T) {
	h := newBatchesHarness(t)
	if r := h.batch(aliceBatchKey, http.MethodPost, "/v1/messages/batches", batchBody, nil); r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	hold := make(chan struct{})
	lines := []string{fakeprovider.AnthropicBatchResult("first", "claude-sonnet-4-5"), fakeprovider.AnthropicBatchResult("second", "claude-sonnet-4-5")}
	h.ant.Enqueue(fakeprovider.AnthropicStep{JSONL: lines, Hold: hold})
	released := false
	defer func() {
		if !released {
			close(hold)
		}
	}()
	res, err := h.send(context.Background(), http.MethodGet, "/v1/messages/batches/msgbatch_fake001/results", "",
		map[string]string{"X-Api-Key": aliceBatchKey, "Anthropic-Version": "2023-06-01"})
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("results: %d %s", res.StatusCode, readAllBody(t, res))
	}
	rd := bufio.NewReader(res.Body)
	first, err := rd.ReadString('\n')
	if err != nil || first != lines[0]+"\n" {
		t.Fatalf("first line %q (%v), want %q", first, err, lines[0])
	}
	// The upstream has not written the last line yet: it waits for hold.
	close(hold)
	released = true
	rest, err := io.ReadAll(rd)
	if err != nil || string(rest) != lines[1]+"\n" {
		t.Fatalf("rest %q (%v), want %q", rest, err, lines[1])
	}
	// One results request: the lines came from the held answer, not a
	// retry's.
	if n := h.ant.Calls(); n != 2 {
		t.Errorf("upstream calls %d, want 2 (create, results)", n)
	}
}

// TestMessageBatchResultsURLBytes: only results_url's value changes in a
// batch answer — spacing, unknown members, escapes and the order of the
// rest stay as the upstream wrote them — and a null results_url stays
// null.
func TestMessageBatchResultsURLBytes(t *testing.T) {
	h := newBatchesHarness(t)
	odd := `{ "id" : "msgbatch_odd", "type":"message_batch", "x_new": {"results_url_hint": "keep \u00e9"},` + "\n" +
		`  "results_url" : "https://api.anthropic.com/v1/messages/batches/msgbatch_odd/results" ,"tail":[1, 2.50]}`
	null := fakeprovider.AnthropicBatch("msgbatch_null", 1, "in_progress", "")
	h.ant.Enqueue(fakeprovider.AnthropicStep{Body: odd}, fakeprovider.AnthropicStep{Body: null})
	r := h.batch(aliceBatchKey, http.MethodPost, "/v1/messages/batches", batchBody, nil)
	want := strings.Replace(odd, "https://api.anthropic.com/v1/messages/batches/msgbatch_odd/results", h.gatewayResults("msgbatch_odd"), 1)
	if r.status != 200 || string(r.body) != want {
		t.Errorf("create: %d\n %s\nwant\n %s", r.status, r.body, want)
	}
	if got := r.header.Get("Content-Length"); got != "" && got != strconv.Itoa(len(want)) {
		t.Errorf("Content-Length %s, want %d", got, len(want))
	}
	r = h.batch(aliceBatchKey, http.MethodPost, "/v1/messages/batches", batchBody, nil)
	if r.status != 200 || string(r.body) != null {
		t.Errorf("create with results_url null: %d\n %s\nwant\n %s", r.status, r.body, null)
	}
}

// TestMessageBatchKeyed: a create under an Idempotency-Key is committed:
// the same key and body replay the answer (results_url the gateway's)
// byte for byte with no second upstream call; another body is 422 in
// Anthropic's shape.
func TestMessageBatchKeyed(t *testing.T) {
	h := newBatchesHarness(t)
	k := map[string]string{"Idempotency-Key": "batch-2026-01-02"}
	first := h.batch(aliceBatchKey, http.MethodPost, "/v1/messages/batches", batchBody, k)
	again := h.batch(aliceBatchKey, http.MethodPost, "/v1/messages/batches", batchBody, k)
	if first.status != 200 || again.status != 200 || !bytes.Equal(first.body, again.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %s / %d %s (replayed %q)", first.status, first.body, again.status, again.body, again.header.Get("Idempotent-Replayed"))
	}
	if !strings.Contains(string(first.body), h.gatewayResults("msgbatch_fake001")) {
		t.Errorf("committed answer's results_url is not the gateway's: %s", first.body)
	}
	if n := h.ant.Calls(); n != 1 {
		t.Errorf("upstream calls %d, want 1", n)
	}
	other := h.batch(aliceBatchKey, http.MethodPost, "/v1/messages/batches", strings.Replace(batchBody, "Hello", "Bye", 1), k)
	wantAnthropicError(t, other, http.StatusUnprocessableEntity, "invalid_request_error")
}

// TestMessagesUnknownPaths: a path under /v1/messages that is none of the
// Messages API's is a 404 in Anthropic's shape, a method a batch path
// does not take a 405 in it, and neither reaches an upstream; a path
// elsewhere under /v1 keeps OpenAI's shape.
func TestMessagesUnknownPaths(t *testing.T) {
	h := newBatchesHarness(t)
	for _, tc := range []struct {
		method, path string
		status       int
		typ          string
	}{
		{http.MethodGet, "/v1/messages/nope", 404, "not_found_error"},
		{http.MethodPost, "/v1/messages/batches/msgbatch_x/nope", 404, "not_found_error"},
		{http.MethodGet, "/v1/messages/batches/", 404, "not_found_error"},
		{http.MethodGet, "/v1/messages/count_tokens", 405, "invalid_request_error"},
		{http.MethodPut, "/v1/messages/batches", 405, "invalid_request_error"},
		{http.MethodPost, "/v1/messages/batches/msgbatch_x", 405, "invalid_request_error"},
		// /v1/messages itself takes POST only: another method is Anthropic's
		// 405 too (it was a 404 in OpenAI's shape).
		{http.MethodGet, "/v1/messages", 405, "invalid_request_error"},
		{http.MethodPut, "/v1/messages", 405, "invalid_request_error"},
		{http.MethodDelete, "/v1/messages", 405, "invalid_request_error"},
		{http.MethodGet, "/v1/messages/count_tokens/", 404, "not_found_error"},
	} {
		r := h.batch(aliceBatchKey, tc.method, tc.path, "", nil)
		wantAnthropicError(t, r, tc.status, tc.typ)
	}
	wantOpenAIError(t, h.batch(aliceBatchKey, http.MethodGet, "/v1/nope", "", nil), 404)
	if n := h.ant.Calls() + h.fake.Calls(""); n != 0 {
		t.Errorf("%d upstream calls, want none", n)
	}
}

// TestMessageBatchResultsURLAsReached: results_url names the gateway as
// the client reached it — the request's Host, and https only when TLS
// ended at the gateway or a trusted proxy (server.trusted_proxies) says
// so in X-Forwarded-Proto; from anyone else X-Forwarded-Proto is not
// believed, and X-Forwarded-Host never is.
func TestMessageBatchResultsURLAsReached(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trusted []string
		want    string
	}{
		{"untrusted peer", nil, "http://gw.example:8443/v1/messages/batches/msgbatch_fake001/results"},
		{"trusted proxy", []string{"127.0.0.1"}, "https://gw.example:8443/v1/messages/batches/msgbatch_fake001/results"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newMessagesHarness(t, func(c *config.Config) {
				c.Clients = []config.Client{{Name: "alice", Key: aliceBatchKey}}
				c.Server.TrustedProxies = tc.trusted
			})
			req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/messages/batches", strings.NewReader(batchBody))
			if err != nil {
				t.Fatal(err)
			}
			req.Host = "gw.example:8443"
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Api-Key", aliceBatchKey)
			req.Header.Set("X-Forwarded-Proto", "https")
			req.Header.Set("X-Forwarded-Host", "evil.example")
			res, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := readAllBody(t, res)
			if want := fakeprovider.AnthropicBatch("msgbatch_fake001", 2, "ended", tc.want); res.StatusCode != 200 || string(body) != want {
				t.Errorf("create: %d\n %s\nwant\n %s", res.StatusCode, body, want)
			}
		})
	}
}
