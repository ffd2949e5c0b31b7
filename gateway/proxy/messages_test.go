package proxy

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/metrics"
	"github.com/llmgate/llmgate/gateway/retry"
)

// recorded is a Messages stream recorded in classify's testdata, as the
// upstream sent it.
func recorded(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "classify", "testdata", "messages", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fakeAnthropic answers each POST with the next of its streams, and
// records the paths it was sent.
type fakeAnthropic struct {
	mu      sync.Mutex
	streams [][]byte
	paths   []string
}

func (f *fakeAnthropic) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	n := len(f.paths)
	f.paths = append(f.paths, r.URL.Path)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	if n < len(f.streams) {
		_, _ = w.Write(f.streams[n])
	}
}

func (f *fakeAnthropic) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.paths)
}

// messagesCall runs one streaming Messages call against an upstream that
// sends streams in turn, and relays it with hold. It returns what the
// client got before the commit point and the held tail.
func messagesCall(t *testing.T, hold bool, streams ...[]byte) (*fakeAnthropic, *Response, *httptest.ResponseRecorder, *Tail) {
	t.Helper()
	p, fake, resp := messagesExecute(t, streams...)
	if resp.Stream == nil {
		return fake, resp, nil, nil
	}
	w := httptest.NewRecorder()
	tail := p.RelayStream(w, resp, Relay{Start: time.Now(), Hold: hold})
	return fake, resp, w, tail
}

// messagesExecute runs one streaming Messages call against an upstream
// that sends streams in turn, up to its answer.
func messagesExecute(t *testing.T, streams ...[]byte) (*Proxy, *fakeAnthropic, *Response) {
	t.Helper()
	fake := &fakeAnthropic{streams: streams}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	cfg := config.Default()
	cfg.Retry.BaseDelay, cfg.Retry.MaxDelay = config.Duration(time.Nanosecond), config.Duration(time.Nanosecond)
	router, err := NewRouter([]config.Upstream{{Name: "anthropic", BaseURL: srv.URL + "/v1", Models: []string{"claude-*"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(router.Close)
	p := New(Options{Config: cfg, Router: router, Breakers: breaker.New([]breaker.Upstream{{Name: "anthropic"}}, breaker.Settings{}),
		Budget: retry.NewBudget(retry.BudgetOptions{}), Metrics: metrics.New(prometheus.NewRegistry(), nil)})
	body := []byte(`{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"Hi"}]}`)
	in := httptest.NewRequest(http.MethodPost, "/v1/messages", bytes.NewReader(body))
	c := &Call{In: in, Suffix: "/messages", API: Messages, Body: body, Model: "claude-sonnet-4-5", Stream: true,
		Hops: []Hop{PrivateHop(router.Upstream("anthropic"), "sk-ant-upstream")}}
	resp, err := p.Execute(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return p, fake, resp
}

// A message_start followed by an overloaded_error event is a failure
// before the client saw anything: the attempt is retried, and the client
// gets the second attempt's stream byte for byte, its tail (from the
// message_delta with the stop_reason) held until the commit.
func TestMessagesStreamRetriedAfterAnOverloadedStart(t *testing.T) {
	overloaded := []byte("event: message_start\n" + `data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"stop_reason":null,"usage":{"input_tokens":5,"output_tokens":1}}}` + "\n\n" +
		"event: error\n" + `data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}` + "\n\n")
	good := recorded(t, "thinking_tool_text.sse")
	fake, resp, w, tail := messagesCall(t, true, overloaded, good)
	if fake.calls() != 2 || fake.paths[0] != "/v1/messages" {
		t.Fatalf("upstream calls %v, want 2 to /v1/messages", fake.paths)
	}
	tailAt := bytes.Index(good, []byte("event: message_delta"))
	if got := w.Body.Bytes(); !bytes.Equal(got, good[:tailAt]) {
		t.Fatalf("before the commit the client got\n%s\nwant everything before the message_delta", got)
	}
	if !tail.Held() {
		t.Fatal("no tail held")
	}
	tail.Release()
	if got := w.Body.Bytes(); !bytes.Equal(got, good) {
		t.Errorf("the client got\n%s\nwant the upstream's stream byte for byte", got)
	}
	want := classify.Tokens{In: 472, Out: 89, Reported: true, CacheCreation: 1536, CacheRead: 2048}
	if resp.Outcome.Class != classify.Success || resp.Outcome.Usage != want || resp.Attempts != 2 {
		t.Errorf("outcome %+v after %d attempts, want success with usage %+v after 2", resp.Outcome, resp.Attempts, want)
	}
}

// An error event after content reached the client is the upstream's own
// failure event: relayed as it is, the one error event the client gets,
// and the stream is not an answer.
func TestMessagesStreamErrorAfterTwoDeltas(t *testing.T) {
	stream := recorded(t, "error_after_two_deltas.sse")
	fake, resp, w, tail := messagesCall(t, true, stream)
	if fake.calls() != 1 {
		t.Fatalf("upstream calls %d, want 1 (the client had seen content)", fake.calls())
	}
	if got := w.Body.Bytes(); !bytes.Equal(got, stream) {
		t.Errorf("the client got\n%s\nwant the upstream's stream as it was", got)
	}
	if n := bytes.Count(w.Body.Bytes(), []byte("event: error")); n != 1 || tail.Held() {
		t.Errorf("%d error events, tail held %v; want 1 and nothing held", n, tail.Held())
	}
	if resp.Outcome.Class != classify.Transient || resp.Outcome.Reason != "error.type overloaded_error" {
		t.Errorf("outcome %+v, want transient error.type overloaded_error", resp.Outcome)
	}
}

// A stream cut before message_stop ends with exactly one error event in
// Anthropic's shape: sent at once when nothing is held, or in place of the
// held tail when the cut came after the message_delta.
func TestMessagesStreamCut(t *testing.T) {
	full := recorded(t, "thinking_tool_text.sse")
	for _, tc := range []struct {
		name string
		at   string // the stream is cut before this event
		held bool
	}{
		{"mid-content", "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}", false},
		{"after the message_delta", "event: message_stop", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cut := full[:bytes.Index(full, []byte(tc.at))]
			_, resp, w, tail := messagesCall(t, true, cut)
			if resp.Outcome.Class != classify.Transient || resp.Outcome.Reason != "stream ended without message_stop" {
				t.Errorf("outcome %+v, want transient, stream ended without message_stop", resp.Outcome)
			}
			if tail.Held() != tc.held {
				t.Fatalf("tail held %v, want %v", tail.Held(), tc.held)
			}
			tail.Fail(nil)
			out := w.Body.String()
			if bytes.Contains(w.Body.Bytes(), []byte("event: message_delta")) {
				t.Errorf("the client saw the message_delta of a stream that failed:\n%s", out)
			}
			last := out[strings.LastIndex(out[:len(out)-2], "\n\n")+2:]
			if strings.Count(out, "event: error") != 1 || !strings.HasPrefix(last, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",") {
				t.Errorf("the stream ends with\n%s\nwant one Anthropic error event", last)
			}
		})
	}
}

// A refusal and an empty message are answers (committed, not retried),
// their tails held like any other.
func TestMessagesStreamRefusalAndEmpty(t *testing.T) {
	for file, want := range map[string]classify.Class{"refusal.sse": classify.ContentFilter, "empty.sse": classify.Empty} {
		t.Run(file, func(t *testing.T) {
			stream := recorded(t, file)
			fake, resp, w, tail := messagesCall(t, true, stream)
			if !tail.Held() {
				t.Fatal("no tail held")
			}
			tail.Release()
			if fake.calls() != 1 || resp.Outcome.Class != want || !bytes.Equal(w.Body.Bytes(), stream) {
				t.Errorf("%d calls, outcome %+v, client got\n%s\nwant 1 call, %s, the stream as it was", fake.calls(), resp.Outcome, w.Body, want)
			}
		})
	}
}
