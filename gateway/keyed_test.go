package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

func key(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }

func TestReplayIsByteIdenticalWithoutUpstreamCall(t *testing.T) {
	h := newHarness(t, nil)
	first := h.chat(chatBody, key("order-4711/summarize"))
	if first.status != 200 {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	if got, want := h.fake.Requests()[0].Header.Get("Idempotency-Key"), idempotency.ForwardKey(nil, cache.Key{Endpoint: "/v1/chat/completions", ID: "order-4711/summarize"}); got != want {
		t.Errorf("key forwarded upstream as %q, want %q (derived from the scope, never the raw key)", got, want)
	}
	// Same body, other spacing and key order: the same request.
	same := `{"messages":[{"content":"Hello","role":"user"}],  "model":"gpt-4o-mini"}`
	for _, body := range []string{chatBody, same} {
		again := h.chat(body, key("order-4711/summarize"))
		if again.status != 200 || string(again.body) != string(first.body) {
			t.Fatalf("replay differs:\n%s\n%s", again.body, first.body)
		}
		if again.header.Get("Idempotent-Replayed") != "true" {
			t.Error("replay not marked Idempotent-Replayed")
		}
		if again.header.Get("X-Request-Id") != first.header.Get("X-Request-Id") {
			t.Error("replay lost the upstream's x-request-id")
		}
	}
	if n := h.fake.Calls(""); n != 1 {
		t.Fatalf("upstream calls %d, want 1", n)
	}
	// RFC 8941 quoted form names the same key.
	if r := h.chat(chatBody, key(`"order-4711/summarize"`)); r.header.Get("Idempotent-Replayed") != "true" {
		t.Error("quoted key is not the same key")
	}
}

func TestSameKeyDifferentBodyIs422(t *testing.T) {
	h := newHarness(t, nil)
	h.chat(chatBody, key("k1"))
	r := h.chat(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Other"}]}`, key("k1"))
	e := wantOpenAIError(t, r, 422)
	if e["code"] != "idempotency_key_reused" {
		t.Fatalf("code %v", e["code"])
	}
	if h.fake.Calls("") != 1 {
		t.Fatal("a mismatched body reached the upstream")
	}
}

// TestKeysReadAlikeInAnotherOrderIs422: two bodies that differ only in the
// order of keys an upstream reads as one ("messages" and "\u006dessages"
// or "Messages") ask different things — the upstream reads the last — so
// the second under the same key is a 422, not the first's answer.
func TestKeysReadAlikeInAnotherOrderIs422(t *testing.T) {
	h := newHarness(t, nil)
	a, b := `[{"role":"user","content":"Say A"}]`, `[{"role":"user","content":"Say B"}]`
	for i, pair := range [][2]string{
		{`{"model":"gpt-4o-mini","messages":` + a + `,"\u006dessages":` + b + `}`, `{"model":"gpt-4o-mini","\u006dessages":` + b + `,"messages":` + a + `}`},
		{`{"model":"gpt-4o-mini","messages":` + a + `,"Messages":` + b + `}`, `{"model":"gpt-4o-mini","Messages":` + b + `,"messages":` + a + `}`},
	} {
		k := key(fmt.Sprintf("alike-%d", i))
		if r := h.chat(pair[0], k); r.status != http.StatusOK {
			t.Fatalf("first: %d %s", r.status, r.body)
		}
		if e := wantOpenAIError(t, h.chat(pair[1], k), 422); e["code"] != "idempotency_key_reused" {
			t.Fatalf("code %v", e["code"])
		}
	}
	if n := h.fake.Calls(""); n != 2 {
		t.Fatalf("upstream calls %d, want 2", n)
	}
}

// A keyed request whose body's objects hold more members at once than its
// fingerprint takes (idempotency.MaxMembers) is a 400 naming the bound,
// before any claim or upstream call, on the JSON routes and a JSON
// passthrough; sent without a key (nothing to compare with a retry) the
// same body goes upstream. Before, sorting such a body's members took
// ~27 times its size (the hostile-tenant run: ~0.5 GB for 30 MB).
func TestKeyedBodyOverMemberBoundIs400(t *testing.T) {
	h := newHarness(t, nil)
	var b strings.Builder
	b.WriteString(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"metadata":{`)
	for i := range idempotency.MaxMembers {
		fmt.Fprintf(&b, `"K%d":1,`, i)
	}
	b.WriteString(`"last":1}}`)
	body := b.String()
	for _, path := range []string{"/v1/chat/completions", "/v1/batches"} {
		r := h.do(http.MethodPost, path, body, key("many-members"))
		if e := wantOpenAIError(t, r, http.StatusBadRequest); e["code"] != "too_many_members" ||
			!strings.Contains(fmt.Sprint(e["message"]), strconv.Itoa(idempotency.MaxMembers)) {
			t.Fatalf("%s: %v", path, e)
		}
	}
	if n := h.fake.Calls(""); n != 0 {
		t.Fatalf("upstream calls %d, want 0", n)
	}
	if _, err := h.store.Get(context.Background(), cache.Key{Endpoint: "/v1/chat/completions", ID: "many-members"}); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("a refused request left a record: %v", err)
	}
	if r := h.chat(body, nil); r.status != http.StatusOK {
		t.Fatalf("unkeyed: %d %s", r.status, r.body)
	}
}

// A client's Idempotency-Key of the form of the gateway's own keys
// (a content-cache entry's, a derived key's) is a 400: before, a key
// "cache:<fingerprint of B>" sent with body A took the place of B's
// cache entry, and every content-cached request of B got 422
// idempotency_key_reused, though it sent no key (found by review).
func TestKeyOfTheGatewaysOwnFormRefused(t *testing.T) {
	h := newHarness(t, nil)
	fp, err := idempotency.Fingerprint([]byte(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(chatBody, "Hello", "Other", 1)
	for _, k := range []string{"cache:" + fp, "cache:" + fp[:32] + ":" + fp, "cache:acme:" + fp, "derived:" + fp} {
		if e := wantOpenAIError(t, h.chat(other, key(k)), http.StatusBadRequest); e["code"] != "invalid_idempotency_key" {
			t.Fatalf("%s: %v", k, e)
		}
	}
	if r := h.chat(chatBody, map[string]string{"X-Llmgate-Cache": "on"}); r.status != 200 || r.header.Get("X-Llmgate-Cache") != "miss" {
		t.Fatalf("content-cached: %d cache=%q %s", r.status, r.header.Get("X-Llmgate-Cache"), r.body)
	}
	// Keys that only look alike are a client's own.
	for _, k := range []string{"cache:warm-1", "derived:" + fp[:63], "cache:" + strings.ToUpper(fp), "Cache:" + fp, "cache::" + fp[1:], "cache:x" + fp} {
		if r := h.chat(other, key(k)); r.status != 200 {
			t.Fatalf("%s: %d %s", k, r.status, r.body)
		}
	}
}

func TestConcurrentDuplicatesMakeOneUpstreamCall(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.Enqueue(fakeprovider.Step{Delay: 300 * time.Millisecond})
	answers := make([]<-chan asyncResult, 6)
	for i := range answers {
		answers[i] = h.chatAsync(chatBody, key("dup"))
	}
	results := make([]result, len(answers))
	for i, a := range answers {
		results[i] = h.await(a)
	}
	for i, r := range results {
		if r.status != 200 || string(r.body) != string(results[0].body) {
			t.Fatalf("answer %d: %d %s", i, r.status, r.body)
		}
	}
	if n := h.fake.Calls(""); n != 1 {
		t.Fatalf("upstream calls %d, want 1", n)
	}
}

func TestInFlightPastWaitBoundIs409(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Idempotency.WaitTimeout = config.Duration(100 * time.Millisecond) })
	h.fake.Enqueue(fakeprovider.Step{Delay: 2 * time.Second})
	done := h.chatAsync(chatBody, key("slow"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.fake.WaitForCalls(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r := h.chat(chatBody, key("slow"))
	wantOpenAIError(t, r, 409)
	if r.header.Get("Retry-After") == "" || r.header.Get("X-Should-Retry") != "true" {
		t.Fatalf("409 headers: %v", r.header)
	}
	first := h.await(done)
	if first.status != 200 {
		t.Fatalf("first %d", first.status)
	}
	if h.fake.Calls("") != 1 {
		t.Fatal("a duplicate reached the upstream")
	}
}

func TestTenantsAreIsolated(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Clients = []config.Client{{Name: "team-a", Key: "key-a"}, {Name: "team-b", Key: "key-b"}}
	})
	a := h.chat(chatBody, map[string]string{"Authorization": "Bearer key-a", "Idempotency-Key": "shared"})
	b := h.chat(chatBody, map[string]string{"Authorization": "Bearer key-b", "Idempotency-Key": "shared"})
	if a.status != 200 || b.status != 200 || string(a.body) == string(b.body) {
		t.Fatalf("tenants share a record: %s / %s", a.body, b.body)
	}
	if b.header.Get("Idempotent-Replayed") != "" {
		t.Fatal("team-b got team-a's replay")
	}
	if h.fake.Calls("") != 2 {
		t.Fatalf("calls %d", h.fake.Calls(""))
	}
	// The admin view is per client too.
	if r := h.admin(http.MethodGet, "/admin/idempotency/shared?client=team-a"); r.status != 200 || !strings.Contains(string(r.body), `"committed"`) {
		t.Fatalf("admin get: %d %s", r.status, r.body)
	}
}

func TestFailureIsNotCommitted(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Retry.MaxAttempts = 1 })
	h.fake.Enqueue(fakeprovider.Step{Status: 503}, fakeprovider.Step{Status: 400})
	if r := h.chat(chatBody, key("f")); r.status != 503 {
		t.Fatalf("first %d", r.status)
	}
	if r := h.chat(chatBody, key("f")); r.status != 400 {
		t.Fatalf("second %d", r.status)
	}
	r := h.chat(chatBody, key("f"))
	if r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("third %d replayed=%q", r.status, r.header.Get("Idempotent-Replayed"))
	}
	if h.fake.Calls("") != 3 {
		t.Fatalf("calls %d", h.fake.Calls(""))
	}
}

func TestContentFilterAndEmptyAreCommitted(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.Enqueue(fakeprovider.Step{FinishReason: "content_filter"})
	first := h.chat(chatBody, key("cf"))
	again := h.chat(chatBody, key("cf"))
	if string(first.body) != string(again.body) || again.header.Get("X-Llmgate-Outcome") != "content_filter" {
		t.Fatalf("content_filter not committed: %s / %s (%v)", first.body, again.body, again.header)
	}
	if h.fake.Calls("") != 1 {
		t.Fatal("content_filter was not replayed")
	}
}

func TestStreamReplayIsIdentical(t *testing.T) {
	h := newHarness(t, nil)
	first := h.chat(streamBody, key("s1"))
	if first.status != 200 || !strings.HasSuffix(string(first.body), "data: [DONE]\n\n") {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	again := h.chat(streamBody, key("s1"))
	if string(again.body) != string(first.body) {
		t.Fatalf("stream replay differs:\n%q\n%q", again.body, first.body)
	}
	if !strings.HasPrefix(again.header.Get("Content-Type"), "text/event-stream") || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay headers %v", again.header)
	}
	if h.fake.Calls("") != 1 {
		t.Fatalf("calls %d", h.fake.Calls(""))
	}
}

func TestCutStreamIsNotCommitted(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.Enqueue(fakeprovider.Step{StopAfter: 2})
	h.chat(streamBody, key("s2"))
	r := h.chat(streamBody, key("s2"))
	if r.header.Get("Idempotent-Replayed") != "" || !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") {
		t.Fatalf("cut stream was committed or retry failed: %q", r.body)
	}
	if h.fake.Calls("") != 2 {
		t.Fatalf("calls %d", h.fake.Calls(""))
	}
}

func TestClientDisconnectStillCommits(t *testing.T) {
	for _, tc := range []struct{ name, body string }{{"json", chatBody}, {"stream", streamBody}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.fake.Enqueue(fakeprovider.Step{Delay: 300 * time.Millisecond, ChunkDelay: 20 * time.Millisecond})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				_ = h.fake.WaitForCalls(ctx, 1)
				cancel() // the client gives up while the model is thinking
			}()
			if res, err := h.send(ctx, http.MethodPost, "/v1/chat/completions", tc.body, key("gone")); err == nil {
				res.Body.Close()
			}
			// The retry waits for the in-flight call and gets its result.
			r := h.chat(tc.body, key("gone"))
			if r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry after disconnect: %d replayed=%q %s", r.status, r.header.Get("Idempotent-Replayed"), r.body)
			}
			if h.fake.Calls("") != 1 {
				t.Fatalf("upstream calls %d, want 1", h.fake.Calls(""))
			}
		})
	}
}

// TestUnkeyedDisconnectCancelsUpstream: when the client of an unkeyed
// request leaves, the gateway cancels its upstream call (nobody is left to
// pay for the answer), promptly and without a retry.
func TestUnkeyedDisconnectCancelsUpstream(t *testing.T) {
	// The upstream hangs until its request context ends; ended receives
	// the context's error when its handler returns.
	fake := fakeprovider.New(fakeprovider.Options{})
	fake.Enqueue(fakeprovider.Step{Hang: true})
	ended := make(chan error, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { ended <- r.Context().Err() }()
		fake.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	// The upstream's own timeout is far longer than the bound below, so
	// only a cancellation can end the call in time.
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = up.URL + "/v1"
		c.Upstreams[0].Timeout = config.Duration(time.Minute)
	})
	// Registered after the harness, so it runs before the harness's
	// cleanups: on failure it releases the hanging handler, and the servers
	// close instead of waiting for it.
	t.Cleanup(fake.Close)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	arrived := make(chan error, 1)
	go func() {
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		arrived <- fake.WaitForCalls(wctx, 1)
		cancel() // the client leaves while the upstream thinks
	}()
	res, err := h.send(ctx, http.MethodPost, "/v1/chat/completions", chatBody, nil)
	if err == nil {
		res.Body.Close()
		t.Fatalf("the client got %d instead of leaving", res.StatusCode)
	}
	if err := <-arrived; err != nil {
		t.Fatalf("the request never reached the upstream: %v", err)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the upstream call ended with its context %v, want canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream call still runs 5s after its client left: the gateway did not cancel it")
	}
	if n := fake.Calls(""); n != 1 {
		t.Fatalf("upstream calls %d, want 1: a request whose client left was retried", n)
	}
}

func TestRequireKey(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Idempotency.RequireKey = true })
	e := wantOpenAIError(t, h.chat(chatBody, nil), 400)
	if e["code"] != "idempotency_key_required" {
		t.Fatalf("code %v", e["code"])
	}
	if r := h.chat(chatBody, key("ok")); r.status != 200 {
		t.Fatalf("%d", r.status)
	}
}

func TestContentKeyedCache(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Upstreams[0].Cache = true })
	a := h.chat(chatBody, nil)
	b := h.chat(chatBody, nil)
	if a.header.Get(idempotency.CacheHeader) != "miss" || b.header.Get(idempotency.CacheHeader) != "hit" || string(a.body) != string(b.body) {
		t.Fatalf("cache: %q then %q", a.header.Get(idempotency.CacheHeader), b.header.Get(idempotency.CacheHeader))
	}
	if h.fake.Calls("") != 1 {
		t.Fatalf("calls %d", h.fake.Calls(""))
	}
	// no-cache skips the lookup; off turns it off.
	h.chat(chatBody, map[string]string{"Cache-Control": "no-cache"})
	h.chat(chatBody, map[string]string{idempotency.CacheHeader: "off"})
	if h.fake.Calls("") != 3 {
		t.Fatalf("calls %d", h.fake.Calls(""))
	}
	// no-store: a miss is served but not stored.
	other := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}]}`
	h.chat(other, map[string]string{"Cache-Control": "no-store"})
	if r := h.chat(other, nil); r.header.Get(idempotency.CacheHeader) != "miss" {
		t.Fatalf("no-store response was stored")
	}
}

func TestAdminIdempotencyRecord(t *testing.T) {
	h := newHarness(t, nil)
	h.chat(chatBody, key("order/1"))
	r := h.admin(http.MethodGet, "/admin/idempotency/order%2F1")
	if r.status != 200 || strings.Contains(string(r.body), "simulated") {
		t.Fatalf("get without body: %d %s", r.status, r.body)
	}
	r = h.admin(http.MethodGet, "/admin/idempotency/order%2F1?body=1")
	if !strings.Contains(string(r.body), "chat.completion") {
		t.Fatalf("get with body: %s", r.body)
	}
	if r := h.admin(http.MethodDelete, "/admin/idempotency/order%2F1"); r.status != 200 {
		t.Fatalf("delete %d %s", r.status, r.body)
	}
	if r := h.chat(chatBody, key("order/1")); r.header.Get("Idempotent-Replayed") != "" {
		t.Fatal("deleted key still replays")
	}
	if r := h.admin(http.MethodGet, "/admin/stats"); r.status != 200 || !strings.Contains(string(r.body), `"claim":2`) {
		t.Fatalf("stats %d %s", r.status, r.body)
	}
}

// A key with a '%' in it is named by its path escaped once, whether or
// not the escaped path holds other escapes: "a%40b" is /a%2540b (net/http
// keeps no raw path for it, and echo routes on the decoded one), and
// "c%d/e" is /c%25d%2Fe (raw path kept). Neither is decoded twice into
// another key ("a@b") nor refused for a bare '%'.
func TestAdminKeyWithPercent(t *testing.T) {
	h := newHarness(t, nil)
	for _, tc := range []struct{ key, path, other string }{
		{"a%40b", "/admin/idempotency/a%2540b", "a@b"},
		{"c%d/e", "/admin/idempotency/c%25d%2Fe", ""},
		{"100%", "/admin/idempotency/100%25", ""},
	} {
		if tc.other != "" {
			h.chat(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"other"}]}`, key(tc.other))
		}
		h.chat(chatBody, key(tc.key))
		if r := h.admin(http.MethodGet, tc.path); r.status != 200 || !strings.Contains(string(r.body), `"committed"`) {
			t.Fatalf("%s: get %d %s", tc.path, r.status, r.body)
		}
		if r := h.admin(http.MethodDelete, tc.path); r.status != 200 {
			t.Fatalf("%s: delete %d %s", tc.path, r.status, r.body)
		}
		if r := h.chat(chatBody, key(tc.key)); r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("%s: the key %q still replays after its delete", tc.path, tc.key)
		}
		if tc.other != "" {
			if r := h.chat(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"other"}]}`, key(tc.other)); r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("%s: deleting %q deleted %q", tc.path, tc.key, tc.other)
			}
		}
	}
}

// Every admin route naming something by its path decodes it once: a
// client name with a '%' (GET /admin/clients/x%2541 is the client
// "x%41", not "xA"), and an upstream's breaker by a name holding '/' or
// ':' escaped as encodeURIComponent writes it.
func TestAdminNamesWithEscapes(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		for _, name := range []string{"az/primary", "openai:eu"} {
			u := c.Upstreams[0]
			u.Name, u.Models = name, []string{"other-" + strings.NewReplacer("/", "-", ":", "-").Replace(name)}
			c.Upstreams = append(c.Upstreams, u)
		}
		c.Clients = []config.Client{{Name: "x%41", Key: "key-x"}, {Name: "xA", Key: "key-xa"}}
	})
	if r := h.admin(http.MethodGet, "/admin/clients/x%2541"); r.status != 200 || !strings.Contains(string(r.body), `"client":"x%41"`) {
		t.Fatalf("GET /admin/clients/x%%2541: %d %s", r.status, r.body)
	}
	if r := h.admin(http.MethodDelete, "/admin/clients/x%2541/data"); r.status != 200 || !strings.Contains(string(r.body), `"client":"x%41"`) {
		t.Fatalf("DELETE /admin/clients/x%%2541/data: %d %s", r.status, r.body)
	}
	for _, path := range []string{"/admin/breakers/az%2Fprimary", "/admin/breakers/openai%3Aeu"} {
		for _, op := range []string{"/open", "/close"} {
			if r := h.admin(http.MethodPost, path+op); r.status != 200 {
				t.Fatalf("POST %s%s: %d %s", path, op, r.status, r.body)
			}
		}
	}
}

// TestLeaseRenewedDuringLongCall: a call longer than the lease keeps its
// claim (renewed at most a third of the lease after the last time), so a
// duplicate waits instead of taking the key over and calling the upstream
// a second time.
func TestLeaseRenewedDuringLongCall(t *testing.T) {
	// 300 ms: renewed every 75–100 ms, so a goroutine stalled ~200 ms by a
	// loaded machine (CI under -race) does not lose it; the call lasts
	// over three leases.
	h := newHarness(t, func(c *config.Config) { c.Idempotency.Lease = config.Duration(300 * time.Millisecond) })
	h.fake.Enqueue(fakeprovider.Step{Delay: time.Second})
	done := h.chatAsync(chatBody, key("long"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.fake.WaitForCalls(ctx, 1); err != nil {
		t.Fatal(err)
	}
	dup := h.chat(chatBody, key("long"))
	first := h.await(done)
	if first.status != 200 || dup.status != 200 || string(dup.body) != string(first.body) {
		t.Fatalf("first %d %s, duplicate %d", first.status, first.body, dup.status)
	}
	if n := h.fake.Calls(""); n != 1 {
		t.Fatalf("the lease lapsed during the call: %d upstream calls", n)
	}
}
