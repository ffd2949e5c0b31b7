package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// The guarantee under faults (issue 12): what a client took as complete is
// what its retry gets back. Each test here failed on the code before it.

// headerTransport adds fixed headers to every request, as an application
// sets Idempotency-Key on an SDK's HTTP client.
type headerTransport struct{ hdr map[string]string }

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.hdr {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// sdkStream streams a chat completion through go-openai with hdr set and
// reports whether the SDK saw it complete (io.EOF after the chunks), and the
// text it assembled.
func sdkStream(t *testing.T, h *harness, hdr map[string]string) (complete bool, text string) {
	t.Helper()
	cfg := openai.DefaultConfig("unused")
	cfg.BaseURL = h.srv.URL + "/v1"
	cfg.HTTPClient = &http.Client{Transport: headerTransport{hdr}}
	c := openai.NewClientWithConfig(cfg)
	st, err := c.CreateChatCompletionStream(context.Background(), openai.ChatCompletionRequest{
		Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "Hello"}},
	})
	if err != nil {
		return false, ""
	}
	defer st.Close()
	var b strings.Builder
	for {
		chunk, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return true, b.String()
		}
		if err != nil {
			return false, b.String()
		}
		for _, ch := range chunk.Choices {
			b.WriteString(ch.Delta.Content)
		}
	}
}

// Item 1: a keyed stream whose commit fails must not look complete to the
// SDK; once the store is back, the retry runs, completes, and from then on
// replays those same bytes.
func TestStreamCommitFailureIsNotComplete(t *testing.T) {
	var fs *faultyStore
	h := newHarnessStore(t, nil, func(s Store) Store { fs = &faultyStore{Store: s}; return fs }, fakeprovider.Options{})
	fs.failCommit.Store(true)
	hdr := key("stream-commit-fails")
	if complete, _ := sdkStream(t, h, hdr); complete {
		t.Fatal("the SDK saw a complete stream that was never committed: its retry would get a different answer")
	}
	if !strings.Contains(h.logs.String(), "commit failed") {
		t.Fatal("the commit failure was not logged")
	}
	fs.failCommit.Store(false)
	complete, text := sdkStream(t, h, hdr)
	if !complete || text == "" {
		t.Fatalf("retry after the store came back: complete=%v text=%q", complete, text)
	}
	calls := h.fake.Calls("")
	complete2, text2 := sdkStream(t, h, hdr)
	if !complete2 || text2 != text || h.fake.Calls("") != calls {
		t.Fatalf("a completed stream's retry is not its replay: %q vs %q (calls %d → %d)", text, text2, calls, h.fake.Calls(""))
	}
}

// The held-back tail: nothing from the first finish_reason on reaches the
// client before the commit; a committed stream still ends with [DONE].
func TestStreamTailFollowsCommit(t *testing.T) {
	h := newHarness(t, nil)
	r := h.chat(streamBody, key("tail"))
	if !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") || !strings.Contains(string(r.body), `"finish_reason":"stop"`) {
		t.Fatalf("committed stream not served whole: %q", r.body)
	}
	again := h.chat(streamBody, key("tail"))
	if string(again.body) != string(r.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("replay differs from the stream the client saw")
	}
}

// Item 2: the client's own deadline ends its wait, not the call: it gets a
// 504 it may retry, the call finishes and is committed, and the retry
// replays it with no second upstream call.
func TestClientDeadlineEndsTheWaitNotTheCall(t *testing.T) {
	h := newHarnessStore(t, nil, nil, fakeprovider.Options{Latency: 150 * time.Millisecond})
	r := h.chat(chatBody, map[string]string{"Idempotency-Key": "slow", DeadlineHeader: "30ms"})
	e := wantOpenAIError(t, r, http.StatusGatewayTimeout)
	if e["code"] != "client_deadline_exceeded" || r.header.Get("X-Should-Retry") != "true" {
		t.Fatalf("at the client's deadline: %v %v", r.header, e)
	}
	again := h.chat(chatBody, key("slow"))
	if again.status != 200 || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d replayed=%q %s", again.status, again.header.Get("Idempotent-Replayed"), again.body)
	}
	if n := h.fake.Calls(""); n != 1 {
		t.Fatalf("upstream calls = %d, want 1", n)
	}
}

// A keyed stream past the client's deadline: the client gets one error
// event; the stream is still read to its end and committed.
func TestClientDeadlineMidStreamCommitsAnyway(t *testing.T) {
	h := newHarnessStore(t, nil, nil, fakeprovider.Options{ChunkDelay: 30 * time.Millisecond})
	r := h.chat(streamBody, map[string]string{"Idempotency-Key": "slow-stream", DeadlineHeader: "60ms"})
	if r.status != 200 || strings.Count(string(r.body), `"error"`) != 1 || !strings.Contains(string(r.body), "client_deadline_exceeded") {
		t.Fatalf("stream past the client's deadline: %d %q", r.status, r.body)
	}
	again := h.chat(streamBody, key("slow-stream"))
	if again.header.Get("Idempotent-Replayed") != "true" || !strings.HasSuffix(string(again.body), "data: [DONE]\n\n") || h.fake.Calls("") != 1 {
		t.Fatalf("retry: replayed=%q calls=%d %q", again.header.Get("Idempotent-Replayed"), h.fake.Calls(""), again.body)
	}
}

// The reproduction: twenty keyed requests with a 1 ms deadline to a
// fast upstream. None gets a store error; every key converges on one
// upstream call, replayed by its retry.
func TestOneMillisecondDeadlinesConverge(t *testing.T) {
	h := newHarness(t, nil)
	var wg sync.WaitGroup
	first := make([]result, 20)
	for i := range first {
		wg.Go(func() {
			first[i] = h.chat(chatBody, map[string]string{"Idempotency-Key": fmt.Sprintf("k1ms-%d", i), DeadlineHeader: "1ms"})
		})
	}
	wg.Wait()
	for i, r := range first {
		if r.status == http.StatusServiceUnavailable {
			t.Fatalf("request %d: 503 %s", i, r.body)
		}
	}
	for i := range first {
		var r result
		for try := 0; try < 50; try++ { // a retry may meet its first call still in flight: 409, retry
			r = h.chat(chatBody, key(fmt.Sprintf("k1ms-%d", i)))
			if r.status != http.StatusConflict {
				break
			}
		}
		if r.status != 200 {
			t.Fatalf("retry of key %d: %d %s", i, r.status, r.body)
		}
	}
	seen := map[string]int{}
	for _, rq := range h.fake.Requests() {
		seen[rq.Header.Get("Idempotency-Key")]++
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("key %s reached the upstream %d times", k, n)
		}
	}
}

// Item 4: a hung upstream trips the breaker even when the operator's
// retry.deadline ends every attempt first: those are upstream failures.
func TestHungUpstreamTripsBreakerUnderShortDeadline(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Retry.Deadline = config.Duration(80 * time.Millisecond)
		c.Breaker.ConsecutiveFailures = 3
	})
	h.fake.SetDefault(fakeprovider.Step{Hang: true})
	for i := 0; i < 4; i++ {
		r := h.chat(chatBody, nil)
		if r.status != http.StatusGatewayTimeout && r.status != http.StatusServiceUnavailable {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	if got := breakerState(t, h, "primary"); got != "open" {
		t.Fatalf("breaker %s after four hung calls under the operator's deadline", got)
	}
}

// Item 6: an error event from the upstream is the stream's one error event.
func TestOneErrorEventPerStream(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.SetDefault(fakeprovider.Step{ErrorInStream: true})
	for _, hdr := range []map[string]string{nil, key("err-stream")} {
		r := h.chat(streamBody, hdr)
		if n := strings.Count(string(r.body), `{"error":`); n != 1 {
			t.Fatalf("%d error events (keyed=%v): %q", n, hdr != nil, r.body)
		}
	}
}

// Item 7: a 2xx that is no usable answer, still so after the retries,
// reaches the client as a 502, and is not committed.
func TestBroken2xxIs502(t *testing.T) {
	for _, body := range []string{
		`{"id":"x","object":"chat.completion","choices":[{"index":0,"mess`,
		`<html><body>Bad gateway</body></html>`,
		`{"error":{"message":"overloaded","type":"server_error","code":null}}`,
	} {
		h := newHarness(t, nil)
		h.fake.SetDefault(fakeprovider.Step{Body: body, Header: map[string]string{"Content-Type": "application/json"}})
		r := h.chat(chatBody, key("broken"))
		e := wantOpenAIError(t, r, http.StatusBadGateway)
		if e["code"] != "upstream_bad_response" || r.header.Get("X-Should-Retry") != "false" {
			t.Fatalf("%.20s: %v %v", body, r.header, e)
		}
		calls := h.fake.Calls("")
		h.fake.SetDefault(fakeprovider.Step{})
		if again := h.chat(chatBody, key("broken")); again.status != 200 || again.header.Get("Idempotent-Replayed") != "" || h.fake.Calls("") != calls+1 {
			t.Fatalf("%.20s: a broken answer was committed", body)
		}
	}
}

// Item 8: with the store down, an upstream with content-keyed caching on
// still serves unkeyed requests.
func TestCacheSkippedWhenStoreDown(t *testing.T) {
	var fs *faultyStore
	h := newHarnessStore(t, func(c *config.Config) { c.Upstreams[0].Cache = true },
		func(s Store) Store { fs = &faultyStore{Store: s}; return fs }, fakeprovider.Options{})
	fs.failClaim.Store(true)
	if r := h.chat(chatBody, nil); r.status != 200 {
		t.Fatalf("unkeyed request to a cache: true upstream with the store down: %d %s", r.status, r.body)
	}
	// A client's own key still needs the store.
	wantOpenAIError(t, h.chat(chatBody, key("needs-store")), http.StatusServiceUnavailable)
}

// TestRepeatedClientDeadlineRefused: X-Llmgate-Deadline sent twice is a
// 400 with no upstream call, as a repeated Idempotency-Key is: a proxy in
// between may keep either value, so the gateway cannot know which bound
// the client meant. Before, the first was taken silently.
func TestRepeatedClientDeadlineRefused(t *testing.T) {
	h := newHarness(t, nil)
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header["X-Llmgate-Deadline"] = []string{"30s", "1ms"}
	res, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := result{status: res.StatusCode, header: res.Header, body: readAllBody(t, res)}
	if e := wantOpenAIError(t, r, http.StatusBadRequest); !strings.Contains(fmt.Sprint(e["message"]), "more than once") {
		t.Fatalf("error = %v", e)
	}
	if n := h.fake.Calls(""); n != 0 {
		t.Fatalf("upstream calls %d, want 0", n)
	}
}
