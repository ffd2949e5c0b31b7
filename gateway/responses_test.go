package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// POST /v1/responses through the keyed path (issue 14): classified by its
// status, committed and replayed byte for byte, streams relayed as typed
// events with their terminal event held until the commit is durable.

// respFake is an upstream that answers /v1/responses from a script: call n
// gets script[n], the last entry repeating. It records every body it saw.
type respFake struct {
	mu     sync.Mutex
	paths  []string
	bodies []string
	script []http.HandlerFunc
	// gate, when non-nil, holds every call until it is closed; entered
	// gets one value per call that reached the gate.
	gate    chan struct{}
	entered chan struct{}
}

func (f *respFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	n := len(f.bodies)
	f.paths = append(f.paths, r.URL.Path)
	f.bodies = append(f.bodies, string(b))
	h := f.script[min(n, len(f.script)-1)]
	f.mu.Unlock()
	if f.gate != nil {
		f.entered <- struct{}{}
		<-f.gate
	}
	h(w, r)
}

func (f *respFake) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

func (f *respFake) seen(i int) (path, body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.paths[i], f.bodies[i]
}

// respHarness is a gateway in front of a respFake; wrap, when non-nil,
// wraps the store (fault injection).
func respHarness(t *testing.T, wrap func(Store) Store, script ...http.HandlerFunc) (*harness, *respFake) {
	t.Helper()
	return respHarnessFake(t, wrap, &respFake{script: script})
}

// respHarnessFake is respHarness with the fake set up by the caller
// (before any goroutine can read it).
func respHarnessFake(t *testing.T, wrap func(Store) Store, f *respFake) (*harness, *respFake) {
	t.Helper()
	s := httptest.NewServer(f)
	t.Cleanup(s.Close)
	h := newHarnessStore(t, func(c *config.Config) { c.Upstreams[0].BaseURL = s.URL + "/v1" }, wrap, fakeprovider.Options{})
	return h, f
}

func jsonAnswer(body string, hdr ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		io.WriteString(w, body)
	}
}

// typedEvent is one Responses stream event as OpenAI frames it.
func typedEvent(typ, data string) string {
	return "event: " + typ + "\ndata: " + data + "\n\n"
}

// sseAnswer sends the events as written, each flushed.
func sseAnswer(events ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	}
}

const (
	respPath = "/v1/responses"
	// respBody carries a field the gateway does not know and a
	// temperature of 0: both must reach the upstream as written.
	respBody       = `{"model":"gpt-4.1","input":"Hello",  "temperature":0,"x_vendor":{"beam":[1,2.50]}}`
	respStreamBody = `{"model":"gpt-4.1","input":"Hello","stream":true}`
	respCompleted  = `{"id":"resp_1","object":"response","status":"completed","error":null,"incomplete_details":null,"output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi there","annotations":[]}]}],"usage":{"input_tokens":3,"output_tokens":2,"total_tokens":5}}`
)

func respFailed(code string) string {
	return `{"id":"resp_f","object":"response","status":"failed","error":{"code":"` + code + `","message":"failed"},"output":[]}`
}

var (
	evCreated    = typedEvent("response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"resp_s","object":"response","status":"in_progress","output":[]}}`)
	evInProgress = typedEvent("response.in_progress", `{"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_s","object":"response","status":"in_progress","output":[]}}`)
	evItem       = typedEvent("response.output_item.added", `{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_s","type":"message","status":"in_progress","role":"assistant","content":[]}}`)
	evDelta      = typedEvent("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":3,"item_id":"msg_s","output_index":0,"content_index":0,"delta":"Hi"}`)
	evTextDone   = typedEvent("response.output_text.done", `{"type":"response.output_text.done","sequence_number":4,"item_id":"msg_s","output_index":0,"content_index":0,"text":"Hi"}`)
	evCompleted  = typedEvent("response.completed", `{"type":"response.completed","sequence_number":5,"response":{"id":"resp_s","object":"response","status":"completed","output":[{"id":"msg_s","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}]}],"usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}}`)
	respEvents   = []string{evCreated, evInProgress, evItem, evDelta, evTextDone, evCompleted}
)

func evError(code string) string {
	return typedEvent("error", `{"type":"error","code":"`+code+`","message":"boom","param":null,"sequence_number":2}`)
}

func evFailed(code string) string {
	return typedEvent("response.failed", `{"type":"response.failed","sequence_number":4,"response":{"id":"resp_s","object":"response","status":"failed","error":{"code":"`+code+`","message":"boom"},"output":[]}}`)
}

func TestResponsesKeyedJSONReplayIsByteIdentical(t *testing.T) {
	h, f := respHarness(t, nil, jsonAnswer(respCompleted, "X-Request-Id", "req_up_1"))
	first := h.do(http.MethodPost, respPath, respBody, key("wf-1/step-1"))
	if first.status != 200 || string(first.body) != respCompleted {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	if first.header.Get("X-Llmgate-Outcome") != "" || first.header.Get("X-Llmgate-Upstream") != "primary" {
		t.Fatalf("headers: %v", first.header)
	}
	// Byte fidelity of the request: the path, an unknown field and
	// temperature 0, spacing included.
	if path, body := f.seen(0); path != "/v1/responses" || body != respBody {
		t.Fatalf("upstream saw %s %q, want %q", path, body, respBody)
	}
	again := h.do(http.MethodPost, respPath, respBody, key("wf-1/step-1"))
	if again.status != 200 || string(again.body) != string(first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d replayed=%q %s", again.status, again.header.Get("Idempotent-Replayed"), again.body)
	}
	if again.header.Get("X-Request-Id") != "req_up_1" {
		t.Error("replay lost the upstream's x-request-id")
	}
	if n := f.calls(); n != 1 {
		t.Fatalf("upstream calls = %d, want 1", n)
	}
}

func TestResponsesKeyReusedWithOtherBody(t *testing.T) {
	h, f := respHarness(t, nil, jsonAnswer(respCompleted))
	if r := h.do(http.MethodPost, respPath, respBody, key("reuse")); r.status != 200 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	r := h.do(http.MethodPost, respPath, `{"model":"gpt-4.1","input":"Goodbye"}`, key("reuse"))
	if e := wantOpenAIError(t, r, http.StatusUnprocessableEntity); e["code"] != "idempotency_key_reused" {
		t.Fatalf("other body under the key: %v", e)
	}
	if n := f.calls(); n != 1 {
		t.Fatalf("upstream calls = %d, want 1", n)
	}
}

// Concurrent duplicates: the upstream is held until every duplicate has
// been sent; one call, every client the same bytes.
func TestResponsesConcurrentDuplicatesMakeOneCall(t *testing.T) {
	h, f := respHarnessFake(t, nil, &respFake{script: []http.HandlerFunc{jsonAnswer(respCompleted)},
		gate: make(chan struct{}), entered: make(chan struct{}, 8)})
	const n = 5
	results := make(chan asyncResult, n)
	send := func() {
		r, err := h.try(http.MethodPost, respPath, respBody, key("dup"))
		results <- asyncResult{r, err}
	}
	go send()
	<-f.entered // the first holds the key, its call is upstream
	for range n - 1 {
		go send()
	}
	close(f.gate)
	for range n {
		r := h.await(results)
		if r.status != 200 || string(r.body) != respCompleted {
			t.Fatalf("duplicate got %d %s", r.status, r.body)
		}
	}
	if c := f.calls(); c != 1 {
		t.Fatalf("upstream calls = %d, want 1", c)
	}
}

func TestResponsesKeyedStreamReplayIsByteIdentical(t *testing.T) {
	h, f := respHarness(t, nil, sseAnswer(respEvents...))
	first := h.do(http.MethodPost, respPath, respStreamBody, key("stream-1"))
	want := strings.Join(respEvents, "")
	if first.status != 200 || string(first.body) != want {
		t.Fatalf("first: %d\n%q\nwant\n%q", first.status, first.body, want)
	}
	again := h.do(http.MethodPost, respPath, respStreamBody, key("stream-1"))
	if string(again.body) != want || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: replayed=%q %q", again.header.Get("Idempotent-Replayed"), again.body)
	}
	if c := f.calls(); c != 1 {
		t.Fatalf("upstream calls = %d, want 1", c)
	}
	// Unkeyed, the same bytes.
	if r := h.do(http.MethodPost, respPath, respStreamBody, nil); string(r.body) != want {
		t.Fatalf("unkeyed stream: %q", r.body)
	}
}

// blockingStore holds every commit until release is closed, first
// telling the test through entered; with fail set, the commit then fails,
// as a full disk would.
type blockingStore struct {
	Store
	entered chan struct{}
	release chan struct{}
	fail    atomic.Bool
}

func (s *blockingStore) Commit(ctx context.Context, k cache.Key, owner string, rec *cache.Record, ttl time.Duration) error {
	if s.entered != nil {
		s.entered <- struct{}{}
		<-s.release
	}
	if s.fail.Load() {
		return errDiskFull
	}
	return s.Store.Commit(ctx, k, owner, rec, ttl)
}

// tap records what a handler wrote to its client, as it writes it: the
// gateway writes a keyed stream from the call's goroutine, the one that
// commits, so at the commit the tap holds everything sent before it.
type tap struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (t *tap) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

func (t *tap) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(tapWriter{w, t}, r)
	})
}

type tapWriter struct {
	http.ResponseWriter
	t *tap
}

func (w tapWriter) Write(b []byte) (int, error) {
	w.t.mu.Lock()
	w.t.buf.Write(b)
	w.t.mu.Unlock()
	return w.ResponseWriter.Write(b)
}

func (w tapWriter) Flush()                      { w.ResponseWriter.(http.Flusher).Flush() }
func (w tapWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// The terminal event goes out only once the commit is durable: when the
// commit starts, the client has been sent every event before the terminal
// one and not it; it follows once the commit returns.
func TestResponsesTerminalEventWaitsForTheCommit(t *testing.T) {
	bs := &blockingStore{entered: make(chan struct{}, 1), release: make(chan struct{})}
	h, _ := respHarness(t, func(s Store) Store { bs.Store = s; return bs }, sseAnswer(respEvents...))
	sent := &tap{}
	srv := httptest.NewServer(sent.handler(h.gw.Handler()))
	t.Cleanup(srv.Close)
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(bs.release) }) }) // before srv.Close, which waits for the request
	done := make(chan asyncResult, 1)
	go func() {
		h2 := *h
		h2.srv = srv
		r, err := h2.try(http.MethodPost, respPath, respStreamBody, key("held"))
		done <- asyncResult{r, err}
	}()
	<-bs.entered
	before := strings.Join(respEvents[:len(respEvents)-1], "")
	if got := sent.String(); got != before {
		t.Fatalf("sent before the commit was durable:\n%q\nwant\n%q", got, before)
	}
	release.Do(func() { close(bs.release) })
	if r := h.await(done); string(r.body) != strings.Join(respEvents, "") {
		t.Fatalf("after the commit: %q", r.body)
	}
}

// A failed commit: the client gets one typed error event in place of the
// terminal event, never response.completed; the key is released and the
// retry runs again.
func TestResponsesCommitFailureSendsErrorEvent(t *testing.T) {
	bs := &blockingStore{}
	bs.fail.Store(true)
	h, f := respHarness(t, func(s Store) Store { bs.Store = s; return bs }, sseAnswer(respEvents...))
	r := h.do(http.MethodPost, respPath, respStreamBody, key("lost"))
	body := string(r.body)
	prefix := strings.Join(respEvents[:len(respEvents)-1], "")
	if !strings.HasPrefix(body, prefix) || strings.Contains(body, "response.completed") {
		t.Fatalf("stream with a failed commit: %q", body)
	}
	ev := strings.TrimPrefix(body, prefix)
	if !strings.HasPrefix(ev, "event: error\ndata: {\"type\":\"error\",\"code\":\"idempotency_store_unavailable\"") ||
		strings.Count(body, "event: error") != 1 || !strings.HasSuffix(ev, "\n\n") {
		t.Fatalf("in place of the terminal event: %q", ev)
	}
	data := strings.TrimSuffix(strings.TrimPrefix(ev, "event: error\ndata: "), "\n\n")
	var e struct {
		Type, Code string
		Error      struct{ Code string }
	}
	if err := json.Unmarshal([]byte(data), &e); err != nil || e.Type != "error" || e.Error.Code != "idempotency_store_unavailable" {
		t.Fatalf("error event data %q: %+v %v", data, e, err)
	}
	bs.fail.Store(false)
	again := h.do(http.MethodPost, respPath, respStreamBody, key("lost"))
	if string(again.body) != strings.Join(respEvents, "") || again.header.Get("Idempotent-Replayed") != "" || f.calls() != 2 {
		t.Fatalf("retry after a failed commit: calls=%d %q", f.calls(), again.body)
	}
}

// The model's answers that are not plain success are relayed as the
// upstream sent them, with X-Llmgate-Outcome, not retried, and committed:
// the replay carries the same header.
func TestResponsesOutcomesAreCommitted(t *testing.T) {
	tests := []struct {
		name, body, outcome string
	}{
		{"content filter", `{"id":"resp_cf","object":"response","status":"incomplete","incomplete_details":{"reason":"content_filter"},"output":[]}`, "content_filter"},
		{"no output items", `{"id":"resp_e","object":"response","status":"completed","output":[]}`, "empty_output"},
		{"reasoning only", `{"id":"resp_r","object":"response","status":"completed","output":[{"type":"reasoning","id":"rs_1","summary":[]}]}`, "empty_output"},
		{"max_output_tokens", `{"id":"resp_m","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"message","content":[{"type":"output_text","text":"The quick"}]}]}`, "max_output_tokens"},
		{"function call", `{"id":"resp_fc","object":"response","status":"completed","output":[{"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":"{}"}]}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, f := respHarness(t, nil, jsonAnswer(tc.body))
			r := h.do(http.MethodPost, respPath, respBody, key("k"))
			if r.status != 200 || string(r.body) != tc.body || r.header.Get("X-Llmgate-Outcome") != tc.outcome {
				t.Fatalf("%d outcome=%q %s", r.status, r.header.Get("X-Llmgate-Outcome"), r.body)
			}
			again := h.do(http.MethodPost, respPath, respBody, key("k"))
			if again.header.Get("Idempotent-Replayed") != "true" || string(again.body) != tc.body ||
				again.header.Get("X-Llmgate-Outcome") != tc.outcome {
				t.Fatalf("replay: replayed=%q outcome=%q", again.header.Get("Idempotent-Replayed"), again.header.Get("X-Llmgate-Outcome"))
			}
			if c := f.calls(); c != 1 {
				t.Fatalf("upstream calls = %d, want 1", c)
			}
		})
	}
}

// status failed is classified by its error.code: server_error is retried
// (once), rate_limit_exceeded after the wait its headers ask for. When
// the retries end failed, the client gets 502, never the 200, and nothing
// is committed.
func TestResponsesFailedStatusIsRetried(t *testing.T) {
	t.Run("server_error then completed", func(t *testing.T) {
		h, f := respHarness(t, nil, jsonAnswer(respFailed("server_error")), jsonAnswer(respCompleted))
		r := h.do(http.MethodPost, respPath, respBody, key("k"))
		if r.status != 200 || string(r.body) != respCompleted || f.calls() != 2 {
			t.Fatalf("%d calls=%d %s", r.status, f.calls(), r.body)
		}
	})
	t.Run("server_error twice", func(t *testing.T) {
		h, f := respHarness(t, nil, jsonAnswer(respFailed("server_error")), jsonAnswer(respFailed("server_error")), jsonAnswer(respCompleted))
		r := h.do(http.MethodPost, respPath, respBody, key("k"))
		if e := wantOpenAIError(t, r, http.StatusBadGateway); e["code"] != "upstream_bad_response" || r.header.Get("X-Should-Retry") != "false" {
			t.Fatalf("%v %v", e, r.header)
		}
		if c := f.calls(); c != 2 {
			t.Fatalf("server_error tried %d times, want 2 (one retry)", c)
		}
		// Not committed: the retry runs again, and gets the answer.
		if again := h.do(http.MethodPost, respPath, respBody, key("k")); again.status != 200 || f.calls() != 3 {
			t.Fatalf("retry: %d calls=%d", again.status, f.calls())
		}
	})
	t.Run("rate_limit_exceeded", func(t *testing.T) {
		h, f := respHarness(t, nil, jsonAnswer(respFailed("rate_limit_exceeded"), "Retry-After-Ms", "1"), jsonAnswer(respCompleted))
		r := h.do(http.MethodPost, respPath, respBody, key("k"))
		if r.status != 200 || f.calls() != 2 {
			t.Fatalf("%d calls=%d %s", r.status, f.calls(), r.body)
		}
		if !strings.Contains(h.logs.String(), `"class":"rate_limited"`) {
			t.Fatalf("the retry was not for a rate limit: %s", h.logs.String())
		}
	})
	t.Run("invalid_prompt is not retried", func(t *testing.T) {
		h, f := respHarness(t, nil, jsonAnswer(respFailed("invalid_prompt")), jsonAnswer(respCompleted))
		r := h.do(http.MethodPost, respPath, respBody, key("k"))
		wantOpenAIError(t, r, http.StatusBadGateway)
		if c := f.calls(); c != 1 {
			t.Fatalf("upstream calls = %d, want 1", c)
		}
	})
}

// Before the first byte reached the client (the announcing events are held
// back), a transient failure is retried; the client sees only the second
// attempt's stream.
func TestResponsesStreamFailureBeforeFirstByteIsRetried(t *testing.T) {
	for name, failing := range map[string][]string{
		"error event":     {evCreated, evError("server_error")},
		"response.failed": {evCreated, evInProgress, evFailed("server_error")},
	} {
		t.Run(name, func(t *testing.T) {
			h, f := respHarness(t, nil, sseAnswer(failing...), sseAnswer(respEvents...))
			r := h.do(http.MethodPost, respPath, respStreamBody, key("k"))
			if string(r.body) != strings.Join(respEvents, "") || f.calls() != 2 {
				t.Fatalf("calls=%d %q", f.calls(), r.body)
			}
			if again := h.do(http.MethodPost, respPath, respStreamBody, key("k")); again.header.Get("Idempotent-Replayed") != "true" {
				t.Fatal("the retried stream was not committed")
			}
		})
	}
}

// A stream that fails before its first byte on every attempt is a 2xx
// that is no answer: 502 upstream_bad_response, not committed.
func TestResponsesStreamFailingBeforeFirstByteEveryTime(t *testing.T) {
	h, f := respHarness(t, nil, sseAnswer(evCreated, evError("server_error")))
	r := h.do(http.MethodPost, respPath, respStreamBody, key("k"))
	if e := wantOpenAIError(t, r, http.StatusBadGateway); e["code"] != "upstream_bad_response" || r.header.Get("X-Should-Retry") != "false" {
		t.Fatalf("%v %v", e, r.header)
	}
	if c := f.calls(); c != 2 {
		t.Fatalf("server_error tried %d times, want 2 (one retry)", c)
	}
}

// After bytes reached the client, response.failed is the upstream's own
// failure event: relayed as sent, the stream not retried and not
// committed (the key's retry runs again).
func TestResponsesFailedMidStreamIsNotRetriedNorCommitted(t *testing.T) {
	events := []string{evCreated, evItem, evDelta, evFailed("server_error")}
	h, f := respHarness(t, nil, sseAnswer(events...), sseAnswer(respEvents...))
	r := h.do(http.MethodPost, respPath, respStreamBody, key("k"))
	if string(r.body) != strings.Join(events, "") || f.calls() != 1 {
		t.Fatalf("calls=%d %q", f.calls(), r.body)
	}
	again := h.do(http.MethodPost, respPath, respStreamBody, key("k"))
	if again.header.Get("Idempotent-Replayed") != "" || f.calls() != 2 || string(again.body) != strings.Join(respEvents, "") {
		t.Fatalf("retry: replayed=%q calls=%d", again.header.Get("Idempotent-Replayed"), f.calls())
	}
}

// A stream cut before its terminal event ends with one typed error event
// (an SDK raises on it) and is not committed.
func TestResponsesStreamCutBeforeTerminalEvent(t *testing.T) {
	events := []string{evCreated, evItem, evDelta}
	h, f := respHarness(t, nil, sseAnswer(events...), sseAnswer(respEvents...))
	r := h.do(http.MethodPost, respPath, respStreamBody, key("k"))
	prefix := strings.Join(events, "")
	ev := strings.TrimPrefix(string(r.body), prefix)
	if !strings.HasPrefix(string(r.body), prefix) || !strings.HasPrefix(ev, "event: error\ndata: ") ||
		!strings.Contains(ev, `"code":"upstream_stream_error"`) || !strings.Contains(ev, "without a terminal event") {
		t.Fatalf("cut stream: %q", r.body)
	}
	if again := h.do(http.MethodPost, respPath, respStreamBody, key("k")); again.header.Get("Idempotent-Replayed") != "" || f.calls() != 2 {
		t.Fatalf("a cut stream was committed: calls=%d", f.calls())
	}
}

// background: true — the creation answer (queued, with its id) is what is
// committed: a resumed workflow gets the same id and polls that response
// instead of starting a second one.
func TestResponsesBackgroundCreationIsCommitted(t *testing.T) {
	var n atomic.Int32
	h, f := respHarness(t, nil, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_bg_%d","object":"response","status":"queued","background":true,"output":[]}`, n.Add(1))
	})
	body := `{"model":"gpt-4.1","input":"Write a long report","background":true}`
	first := h.do(http.MethodPost, respPath, body, key("report"))
	again := h.do(http.MethodPost, respPath, body, key("report"))
	if first.status != 200 || !strings.Contains(string(first.body), `"id":"resp_bg_1"`) || first.header.Get("X-Llmgate-Outcome") != "" {
		t.Fatalf("first: %d %v %s", first.status, first.header, first.body)
	}
	if string(again.body) != string(first.body) || again.header.Get("Idempotent-Replayed") != "true" || f.calls() != 1 {
		t.Fatalf("replay: calls=%d %s", f.calls(), again.body)
	}
}

// Token metering reads response.usage: input_tokens / output_tokens, for a
// JSON answer and for a stream's terminal event.
func TestResponsesUsageIsCounted(t *testing.T) {
	h, _ := respHarness(t, nil, jsonAnswer(respCompleted), sseAnswer(respEvents...))
	series := `llmgate_tokens_total{client="",kind="%s",model="gpt-4.1",upstream="primary"}`
	in, out := fmt.Sprintf(series, "input"), fmt.Sprintf(series, "output")
	for _, step := range []struct {
		body    string
		in, out float64
	}{{respBody, 3, 2}, {respStreamBody, 3, 1}} {
		before := tokenSeries(t, h)
		if r := h.do(http.MethodPost, respPath, step.body, nil); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		got := deltas(before, tokenSeries(t, h))
		if want := map[string]float64{in: step.in, out: step.out}; !equalDeltas(got, want) {
			t.Fatalf("counters moved by %v, want %v", got, want)
		}
	}
}

// A keyed Responses stream past the client's deadline: the client gets one
// typed error event; the stream is read to its end and committed, and the
// retry replays it.
func TestResponsesClientDeadlineMidStream(t *testing.T) {
	h, f := respHarness(t, nil, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i, ev := range respEvents {
			io.WriteString(w, ev)
			w.(http.Flusher).Flush()
			if i >= 2 { // the stream starts at once, then the model is slow
				time.Sleep(60 * time.Millisecond) // latency, not synchronisation
			}
		}
	})
	r := h.do(http.MethodPost, respPath, respStreamBody, map[string]string{"Idempotency-Key": "slow", DeadlineHeader: "100ms"})
	body := string(r.body)
	if r.status != 200 || strings.Count(body, "event: error\ndata: ") != 1 || !strings.Contains(body, `"code":"client_deadline_exceeded"`) ||
		strings.Contains(body, "response.completed") {
		t.Fatalf("past the client's deadline: %d %q", r.status, body)
	}
	var again result
	for range 50 { // the call may still be running: 409, retry
		if again = h.do(http.MethodPost, respPath, respStreamBody, key("slow")); again.status != http.StatusConflict {
			break
		}
	}
	if again.header.Get("Idempotent-Replayed") != "true" || string(again.body) != strings.Join(respEvents, "") || f.calls() != 1 {
		t.Fatalf("retry: %d replayed=%q calls=%d %q", again.status, again.header.Get("Idempotent-Replayed"), f.calls(), again.body)
	}
}
