package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

// faultyStore fails the operations a test switches on, like a full disk.
type faultyStore struct {
	Store
	failClaim, failCommit, failPing atomic.Bool
}

var errDiskFull = errors.New("write: no space left on device")

func (f *faultyStore) Claim(ctx context.Context, k cache.Key, fp string, lease time.Duration) (cache.Claim, error) {
	if f.failClaim.Load() {
		return cache.Claim{}, errDiskFull
	}
	return f.Store.Claim(ctx, k, fp, lease)
}

func (f *faultyStore) Commit(ctx context.Context, k cache.Key, owner string, rec *cache.Record, ttl time.Duration) error {
	if f.failCommit.Load() {
		return errDiskFull
	}
	return f.Store.Commit(ctx, k, owner, rec, ttl)
}

func (f *faultyStore) Ping(ctx context.Context) error {
	if f.failPing.Load() {
		return errDiskFull
	}
	return f.Store.Ping(ctx)
}

func TestStoreFailures(t *testing.T) {
	var fs *faultyStore
	h := newHarnessStore(t, nil, func(s Store) Store { fs = &faultyStore{Store: s}; return fs }, fakeprovider.Options{})

	// Claim fails: the keyed request is refused with 503, never run
	// unprotected; an unkeyed one still proxies.
	fs.failClaim.Store(true)
	r := h.chat(chatBody, key("disk"))
	e := wantOpenAIError(t, r, 503)
	if e["code"] != "idempotency_store_unavailable" || strings.Contains(string(r.body), "no space") {
		t.Fatalf("claim failure answer: %s", r.body)
	}
	if h.fake.Calls("") != 0 {
		t.Fatal("a keyed request ran without its claim")
	}
	if r := h.chat(chatBody, nil); r.status != 200 {
		t.Fatalf("unkeyed request during a store failure: %d", r.status)
	}
	fs.failClaim.Store(false)

	// Commit fails: 503, and nothing half-committed remains — the key is
	// released and the next attempt runs and commits normally.
	fs.failCommit.Store(true)
	r = h.chat(chatBody, key("disk2"))
	wantOpenAIError(t, r, 503)
	if _, err := h.store.Get(context.Background(), cache.Key{Endpoint: "/v1/chat/completions", ID: "disk2"}); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("after a failed commit the store holds %v", err)
	}
	fs.failCommit.Store(false)
	if r := h.chat(chatBody, key("disk2")); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after failed commit: %d", r.status)
	}
	if r := h.chat(chatBody, key("disk2")); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("not committed on the retry")
	}

	fs.failPing.Store(true)
	if r := h.do(http.MethodGet, "/readyz", "", nil); r.status != 503 {
		t.Fatalf("readyz with a failing store: %d", r.status)
	}
	if strings.Contains(h.logs.String(), upstreamKey) {
		t.Fatal("upstream key logged")
	}
}

// An answer too large to record is served once; its retry gets a clear,
// non-retryable error instead of paying for a second, different answer
// (issue 12, item 3: the retry used to make a second upstream call).
func TestStreamOverRecordLimitServedOnceNeverTwice(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Idempotency.MaxRecordEvents = 3 })
	res, err := h.send(context.Background(), http.MethodPost, "/v1/chat/completions", streamBody, key("big"))
	if err != nil {
		t.Fatal(err)
	}
	b := readAllBody(t, res)
	if !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("stream not served in full: %q", b)
	}
	if got := res.Trailer.Get(idempotency.CommittedTrailer); got != "false" {
		t.Fatalf("trailer %s = %q, want false", idempotency.CommittedTrailer, got)
	}
	if !strings.Contains(h.logs.String(), "too large to store") {
		t.Fatal("no log line says the stream was too large to store")
	}
	wantNotStored(t, h, streamBody, "big")
	// Under the limit, the trailer says it was committed.
	h2 := newHarness(t, nil)
	res, err = h2.send(context.Background(), http.MethodPost, "/v1/chat/completions", streamBody, key("small"))
	if err != nil {
		t.Fatal(err)
	}
	readAllBody(t, res)
	if got := res.Trailer.Get(idempotency.CommittedTrailer); got != "true" {
		t.Fatalf("trailer = %q, want true", got)
	}
}

// wantNotStored checks a retry with key gets 410 idempotency_result_not_stored
// and makes no upstream call.
func wantNotStored(t *testing.T, h *harness, body, k string) {
	t.Helper()
	calls := h.fake.Calls("")
	r := h.chat(body, key(k))
	e := wantOpenAIError(t, r, http.StatusGone)
	if e["code"] != "idempotency_result_not_stored" || r.header.Get("X-Should-Retry") != "false" || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of an unstored answer: %v %v", r.header, e)
	}
	if got := h.fake.Calls(""); got != calls {
		t.Fatalf("the retry called the upstream again (%d calls, was %d)", got, calls)
	}
}

// The same for a JSON body too large to buffer: relayed whole, once.
func TestJSONOverRecordLimitServedOnceNeverTwice(t *testing.T) {
	h := newHarnessStore(t, func(c *config.Config) { c.Idempotency.MaxRecordBytes = 300 }, nil, fakeprovider.Options{ContentBytes: 2000})
	r := h.chat(chatBody, key("bigjson"))
	if r.status != 200 || len(r.body) < 2000 {
		t.Fatalf("large answer not served whole: %d, %d bytes", r.status, len(r.body))
	}
	wantNotStored(t, h, chatBody, "bigjson")
	// Another body under the same key is still a 422.
	wantOpenAIError(t, h.chat(strings.Replace(chatBody, "Hello", "Other", 1), key("bigjson")), http.StatusUnprocessableEntity)
}

// A content-cached answer (no Idempotency-Key) too large to record is
// served and not cached: the next identical request is a miss that runs
// again. Before, a not-stored marker was committed under the cache key,
// and every identical request got its 410 idempotency_result_not_stored
// ("use a new key", to clients that sent none) for cache_ttl (found by
// review).
func TestContentCachedOverRecordLimitIsNotCached(t *testing.T) {
	cached := map[string]string{"X-Llmgate-Cache": "on"}
	for _, tc := range []struct {
		body    string
		limit   func(c *config.Config)
		content int
	}{
		{chatBody, func(c *config.Config) { c.Idempotency.MaxRecordBytes = 300 }, 2000},
		{streamBody, func(c *config.Config) { c.Idempotency.MaxRecordEvents = 3 }, 0},
	} {
		h := newHarnessStore(t, tc.limit, nil, fakeprovider.Options{ContentBytes: tc.content})
		for round := range 2 {
			r := h.chat(tc.body, cached)
			whole := len(r.body) >= 2000 || strings.HasSuffix(string(r.body), "data: [DONE]\n\n")
			if r.status != 200 || !whole || r.header.Get("X-Llmgate-Cache") != "miss" {
				t.Fatalf("round %d: %d cache=%q: %.300s", round, r.status, r.header.Get("X-Llmgate-Cache"), r.body)
			}
			if got := h.fake.Calls(""); got != round+1 {
				t.Fatalf("round %d: upstream calls %d, want %d", round, got, round+1)
			}
		}
	}
}

// A stream whose "data: [DONE]" comes without the blank line that ends an
// event (the upstream closed the connection after its line) has ended: it
// is relayed as it came and committed, one upstream call, and its retry
// replays it. Before, it was taken for a cut stream: the client got an
// error event in place of the held finish, the call was retried (a second
// provider call), the breaker counted a failure (found by review).
func TestStreamDoneWithoutBlankLineIsTheEnd(t *testing.T) {
	var calls atomic.Int32
	done := "data: [DONE]\n"
	up := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`+"\n\n")
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
		fmt.Fprint(w, done)
	}))
	h := newHarnessStore(t, func(c *config.Config) { c.Upstreams[0].BaseURL = up + "/v1" }, nil, fakeprovider.Options{})
	for _, d := range []string{"data: [DONE]\n", "data: [DONE]"} {
		done = d
		k := key("done-" + strconv.Itoa(len(d)))
		a := h.chat(streamBody, k)
		if a.status != 200 || strings.Contains(string(a.body), "error") || !strings.HasSuffix(string(a.body), "\n\n"+d) {
			t.Fatalf("%q: %d %s", d, a.status, a.body)
		}
		b := h.chat(streamBody, k)
		if b.header.Get("Idempotent-Replayed") != "true" || string(b.body) != string(a.body) {
			t.Fatalf("%q: retry %d replayed=%q %s", d, b.status, b.header.Get("Idempotent-Replayed"), b.body)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("upstream calls %d, want 2", n)
	}
}

// A keyed stream too large to record holds nothing back: it will not be
// committed, so nothing need wait for a commit. Before, once a chat
// stream's tail had started (its first finish_reason: choice 0 of n=2),
// every later event was held, copied, until the upstream ended: choice 1's
// content reached the client only then, and what was held grew with the
// upstream's output past max_record_bytes (found by review).
func TestUnrecordableStreamHoldsNothingBack(t *testing.T) {
	release, stop := make(chan struct{}), make(chan struct{})
	chunk := func(i int, delta, finish string) string {
		return fmt.Sprintf(`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":%d,"delta":%s,"finish_reason":%s}]}`+"\n\n", i, delta, finish)
	}
	up := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, chunk(0, `{"content":"zero"}`, "null")+chunk(0, `{}`, `"stop"`))
		for range 5 { // each event under max_record_bytes, which bounds an event too
			fmt.Fprint(w, chunk(1, `{"content":"`+strings.Repeat("x", 400)+`"}`, "null"))
		}
		fmt.Fprint(w, chunk(1, `{"content":"ONE-"}`, "null"))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-stop:
		}
		fmt.Fprint(w, chunk(1, `{}`, `"stop"`)+"data: [DONE]\n\n")
	}))
	t.Cleanup(func() { close(stop) })
	h := newHarnessStore(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = up + "/v1"
		c.Idempotency.MaxRecordBytes = 1000
	}, nil, fakeprovider.Options{})
	body := `{"model":"gpt-4o-mini","stream":true,"n":2,"messages":[{"role":"user","content":"Hello"}]}`
	res, err := h.send(context.Background(), http.MethodPost, "/v1/chat/completions", body, key("n2-big"))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	seen := make(chan bool, 1)
	go func() {
		var all []byte
		buf := make([]byte, 4096)
		for {
			n, err := res.Body.Read(buf)
			if all = append(all, buf[:n]...); strings.Contains(string(all), "ONE-") {
				seen <- true
				return
			}
			if err != nil {
				seen <- false
				return
			}
		}
	}()
	select {
	case ok := <-seen:
		if !ok {
			t.Fatal("the stream ended without choice 1's content")
		}
	case <-time.After(requestLimit / 3):
		t.Fatal("choice 1's content, sent by the upstream, was held back")
	}
	close(release)
}

// On the Messages API, which ends on message_stop, a "data: [DONE]" cut
// before its blank line is a cut like any other: its bytes are not
// relayed, so the error event that ends the stream stays an event of its
// own (relayed, they ran into it: "data: [DONE]event: error", one event
// with no name to an SDK; found by review).
func TestMessagesPartialDoneIsACut(t *testing.T) {
	up := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-x\",\"content\":[],\"usage\":{\"input_tokens\":1,\"output_tokens\":0}}}\n\n")
		fmt.Fprint(w, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
		fmt.Fprint(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n")
	}))
	h := newHarness(t, func(c *config.Config) {
		budgeted(up)(c)
		c.Retry.MaxAttempts = 1
	})
	body := `{"model":"claude-x","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	r := h.do(http.MethodPost, "/v1/messages", body, map[string]string{"x-api-key": "key-alice", "anthropic-version": "2023-06-01"})
	if strings.Contains(string(r.body), "[DONE]") || !strings.Contains(string(r.body), "\n\nevent: error\n") {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

func TestTruncatedJSONIsRetried(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.Enqueue(fakeprovider.Step{Body: `{"id":"x","object":"chat.completion","choices":[{"index":0,"mess`}, fakeprovider.Step{})
	r := h.chat(chatBody, key("trunc"))
	if r.status != 200 || h.fake.Calls("") != 2 {
		t.Fatalf("status %d calls %d", r.status, h.fake.Calls(""))
	}
	if again := h.chat(chatBody, key("trunc")); string(again.body) != string(r.body) {
		t.Fatal("the truncated body was committed")
	}
}

func TestPprofBehindAdminToken(t *testing.T) {
	h := newHarness(t, nil)
	if r := h.do(http.MethodGet, "/admin/debug/pprof/goroutine?debug=1", "", nil); r.status != 401 {
		t.Fatalf("pprof without token: %d", r.status)
	}
	if r := h.admin(http.MethodGet, "/admin/debug/pprof/goroutine?debug=1"); r.status != 200 || !strings.Contains(string(r.body), "goroutine") {
		t.Fatalf("pprof with token: %d", r.status)
	}
}
