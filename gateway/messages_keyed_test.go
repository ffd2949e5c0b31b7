package gateway

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/request"
)

const messagesStreamBody = `{"model":"claude-sonnet-4-5","max_tokens":256,"stream":true,"messages":[{"role":"user","content":"Hello"}]}`

// TestMessagesKeyedReplay: the same key and body replay the committed
// answer byte for byte, JSON and stream, with Idempotent-Replayed: true
// and no second upstream call.
func TestMessagesKeyedReplay(t *testing.T) {
	for _, tc := range []struct{ name, body string }{{"json", messagesBody}, {"stream", messagesStreamBody}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newMessagesHarness(t, nil)
			hdr := map[string]string{"Idempotency-Key": "msg-replay-" + tc.name, "Anthropic-Beta": "interleaved-thinking-2025-05-14"}
			first := h.messages("/v1/messages", tc.body, hdr)
			if first.status != 200 || first.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("first: %d replayed=%q %s", first.status, first.header.Get("Idempotent-Replayed"), first.body)
			}
			second := h.messages("/v1/messages", tc.body, hdr)
			if second.status != 200 || second.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("second: %d replayed=%q %s", second.status, second.header.Get("Idempotent-Replayed"), second.body)
			}
			if !bytes.Equal(first.body, second.body) {
				t.Errorf("replay differs:\n first %s\nsecond %s", first.body, second.body)
			}
			if ct := second.header.Get("Content-Type"); ct != first.header.Get("Content-Type") {
				t.Errorf("replay Content-Type %q, first %q", ct, first.header.Get("Content-Type"))
			}
			if n := h.ant.Calls(); n != 1 {
				t.Errorf("upstream calls = %d, want 1", n)
			}
		})
	}
}

// TestMessagesKeyReusedElsewhere: the key's fingerprint covers the body
// and the anthropic-version and anthropic-beta headers: another body,
// another beta list or another version under the same key is a 422 in
// Anthropic's shape, and never reaches the upstream.
func TestMessagesKeyReusedElsewhere(t *testing.T) {
	h := newMessagesHarness(t, nil)
	hdr := map[string]string{"Idempotency-Key": "msg-422", "Anthropic-Beta": "a-2025-01-01"}
	if r := h.messages("/v1/messages", messagesBody, hdr); r.status != 200 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	for name, send := range map[string]func() result{
		"another body": func() result {
			return h.messages("/v1/messages", strings.Replace(messagesBody, "Hello", "Bye", 1), hdr)
		},
		"another beta": func() result {
			return h.messages("/v1/messages", messagesBody, map[string]string{"Idempotency-Key": "msg-422", "Anthropic-Beta": "b-2025-01-01"})
		},
		"no beta": func() result {
			return h.messages("/v1/messages", messagesBody, map[string]string{"Idempotency-Key": "msg-422"})
		},
		"another version": func() result {
			return h.messages("/v1/messages", messagesBody, map[string]string{"Idempotency-Key": "msg-422",
				"Anthropic-Beta": "a-2025-01-01", "Anthropic-Version": "2026-10-21"})
		},
	} {
		r := send()
		msg := wantAnthropicError(t, r, http.StatusUnprocessableEntity, "invalid_request_error")
		if !strings.Contains(msg, "Idempotency-Key") {
			t.Errorf("%s: message %q does not name the key", name, msg)
		}
	}
	if n := h.ant.Calls(); n != 1 {
		t.Errorf("upstream calls = %d, want 1", n)
	}
}

// TestMessagesConcurrentDuplicates: requests with one key sent while its
// first call is in flight get that call's answer; the upstream is called
// once.
func TestMessagesConcurrentDuplicates(t *testing.T) {
	h := newMessagesHarness(t, nil)
	arrived, release := make(chan struct{}), make(chan struct{})
	h.ant.Enqueue(fakeprovider.AnthropicStep{Arrived: arrived, Release: release})
	hdr := map[string]string{"Idempotency-Key": "msg-dup", "Authorization": "Bearer " + gwClientKey}
	send := func() <-chan asyncResult {
		ch := make(chan asyncResult, 1)
		go func() {
			r, err := h.try(http.MethodPost, "/v1/messages", messagesBody, hdr)
			ch <- asyncResult{r, err}
		}()
		return ch
	}
	first := send()
	<-arrived
	dups := []<-chan asyncResult{send(), send()}
	close(release)
	want := h.await(first)
	if want.status != 200 {
		t.Fatalf("first: %d %s", want.status, want.body)
	}
	for i, d := range dups {
		r := h.await(d)
		if r.status != 200 || !bytes.Equal(r.body, want.body) {
			t.Errorf("duplicate %d: %d %s", i, r.status, r.body)
		}
	}
	if n := h.ant.Calls(); n != 1 {
		t.Errorf("upstream calls = %d, want 1", n)
	}
}

// TestMessagesKeyedStreamHoldsTail: a keyed stream's tail — from the
// message_delta with the stop_reason on — waits for the commit. When the
// commit fails, the client gets the deltas and then one error event in
// Anthropic's shape in place of the tail, never a clean end; the key is
// released and its retry runs again.
func TestMessagesKeyedStreamHoldsTail(t *testing.T) {
	var fs *faultyStore
	h := newMessagesHarnessStore(t, nil, func(s Store) Store { fs = &faultyStore{Store: s}; return fs })
	fs.failCommit.Store(true)
	hdr := map[string]string{"Idempotency-Key": "msg-tail"}
	r := h.messages("/v1/messages", messagesStreamBody, hdr)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	body := string(r.body)
	if !strings.Contains(body, `"text":" from the fake"`) {
		t.Errorf("deltas before the tail not relayed:\n%s", body)
	}
	if strings.Contains(body, "message_delta") || strings.Contains(body, "message_stop") {
		t.Errorf("the tail went out although the commit failed:\n%s", body)
	}
	if n := strings.Count(body, "event: error\n"); n != 1 || !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("%d error events, want one at the end:\n%s", n, body)
	}
	last := body[strings.LastIndex(body, "event: error\n"):]
	if !strings.Contains(last, `{"type":"error","error":{"type":"overloaded_error","message":`) {
		t.Errorf("error event not in Anthropic's shape: %s", last)
	}
	fs.failCommit.Store(false)
	again := h.messages("/v1/messages", messagesStreamBody, hdr)
	if again.status != 200 || again.header.Get("Idempotent-Replayed") != "" || !strings.Contains(string(again.body), "event: message_stop") {
		t.Fatalf("retry: %d replayed=%q %s", again.status, again.header.Get("Idempotent-Replayed"), again.body)
	}
	if n := h.ant.Calls(); n != 2 {
		t.Errorf("upstream calls = %d, want 2", n)
	}
}

// TestMessagesClientDeadlineKeyed: when a keyed call's client deadline
// passes before the answer, the client gets a 504 in Anthropic's shape
// saying the call goes on; the call commits, and the retry with the key
// replays its answer without another upstream call.
func TestMessagesClientDeadlineKeyed(t *testing.T) {
	h := newMessagesHarness(t, nil)
	arrived, release := make(chan struct{}), make(chan struct{})
	h.ant.Enqueue(fakeprovider.AnthropicStep{Arrived: arrived, Release: release})
	deadline, committed := make(chan time.Time, 1), make(chan struct{})
	hk := &request.CallHooks{Deadline: deadline, At: func(p request.SettlePoint) {
		if p == request.PointCommitted {
			close(committed)
		}
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.gw.Handler().ServeHTTP(w, r.WithContext(request.WithCallHooks(r.Context(), hk)))
	}))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(messagesBody))
	req.Header.Set("Authorization", "Bearer "+gwClientKey)
	req.Header.Set("Idempotency-Key", "msg-deadline")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	go func() {
		<-arrived
		deadline <- time.Time{}
	}()
	res, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := result{status: res.StatusCode, header: res.Header, body: readAllBody(t, res)}
	msg := wantAnthropicError(t, r, http.StatusGatewayTimeout, "timeout_error")
	if !strings.Contains(msg, "same key") || r.header.Get("X-Should-Retry") != "true" {
		t.Errorf("504 does not say to retry with the key: %q, x-should-retry %q", msg, r.header.Get("X-Should-Retry"))
	}
	close(release)
	<-committed
	again := h.messages("/v1/messages", messagesBody, map[string]string{"Idempotency-Key": "msg-deadline"})
	if again.status != 200 || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d replayed=%q %s", again.status, again.header.Get("Idempotent-Replayed"), again.body)
	}
	if n := h.ant.Calls(); n != 1 {
		t.Errorf("upstream calls %d, want 1", n)
	}
}
