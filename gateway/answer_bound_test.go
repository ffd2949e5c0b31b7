package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// TestAnswersHeldUnderClientShare: the upstream answers the gateway holds
// in memory (to classify and commit them) count against
// limits.max_inflight_bytes and its per-client share, as request bodies do.
// Alice's first keyed answer (700 KiB) is held; her second does not fit in
// what is left of her 1 MiB share, so it is relayed as it arrives, like an
// answer too large to hold: her client has its first bytes while the
// upstream is still sending, gets all of it, and its retry is 410
// idempotency_result_not_stored. Bob's answer, while Alice holds her
// share, is held and committed. Before, every answer was held whatever
// its size and number, past any bound: one tenant's large answers could
// grow the heap for all.
func TestAnswersHeldUnderClientShare(t *testing.T) {
	const size = 700 << 10
	answer := `{"id":"chatcmpl-big","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("a", size) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	gate := make(chan struct{})
	open := sync.OnceFunc(func() { close(gate) })
	defer open() // before the servers' cleanups, which wait for the calls
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		_, _ = io.WriteString(w, answer[:len(answer)-10])
		w.(http.Flusher).Flush()
		<-gate
		_, _ = io.WriteString(w, answer[len(answer)-10:])
	}))
	t.Cleanup(up.Close)
	h := newHarnessOptions(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = up.URL + "/v1"
		c.Clients = []config.Client{{Name: "alice", Key: aliceKey}, {Name: "bob", Key: bobKey}}
		c.Limits.MaxBodyBytes = 256 << 10
		c.Limits.MaxInflightBytes = 2 << 20 // a share of 1 MiB per client
	}, nil, fakeprovider.Options{}, nil)
	hdr := func(client, key string) map[string]string {
		return map[string]string{"Authorization": "Bearer " + client, "Idempotency-Key": key}
	}
	type sent struct {
		res  *http.Response
		body string
		err  error
	}
	send := func(client, key string) (headers <-chan *http.Response, done <-chan sent) {
		hc, dc := make(chan *http.Response, 1), make(chan sent, 1)
		go func() {
			res, err := h.send(context.Background(), http.MethodPost, "/v1/chat/completions", chatBody, hdr(client, key))
			if err != nil {
				dc <- sent{err: err}
				return
			}
			hc <- res
			b, err := io.ReadAll(res.Body)
			res.Body.Close()
			dc <- sent{res: res, body: string(b), err: err}
		}()
		return hc, dc
	}
	_, held := send(aliceKey, "big-1")
	waitFor(t, "alice's first answer held", func() bool { return h.gw.admit.InUse() >= size })
	heldBefore := h.gw.admit.InUse()
	relayedHeaders, relayed := send(aliceKey, "big-2")
	select {
	case res := <-relayedHeaders:
		if res.StatusCode != http.StatusOK {
			t.Fatalf("alice's second answer: status %d", res.StatusCode)
		}
	case <-held:
		t.Fatal("alice's first answer ended while the upstream was still sending it")
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for alice's second answer to start while the upstream is still sending it")
	}
	_, bobs := send(bobKey, "big-3")
	waitFor(t, "bob's answer held", func() bool { return h.gw.admit.InUse() >= heldBefore+size })
	open()
	for name, ch := range map[string]<-chan sent{"alice's held": held, "alice's relayed": relayed, "bob's": bobs} {
		s := <-ch
		if s.err != nil || s.res.StatusCode != http.StatusOK || s.body != answer {
			t.Fatalf("%s answer: err %v, status %v, %d bytes (want %d, as the upstream sent)", name, s.err, s.res, len(s.body), len(answer))
		}
	}
	for _, tc := range []struct {
		client, key string
		status      int
	}{{aliceKey, "big-1", http.StatusOK}, {aliceKey, "big-2", http.StatusGone}, {bobKey, "big-3", http.StatusOK}} {
		r := h.do(http.MethodPost, "/v1/chat/completions", chatBody, hdr(tc.client, tc.key))
		if r.status != tc.status || (tc.status == http.StatusOK && (string(r.body) != answer || r.header.Get("Idempotent-Replayed") != "true")) {
			t.Fatalf("retry of %s: status %d (want %d), replayed %q, %d bytes", tc.key, r.status, tc.status, r.header.Get("Idempotent-Replayed"), len(r.body))
		}
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("upstream calls = %d, want 3", n)
	}
	waitFor(t, "every byte given back", func() bool { return h.gw.admit.InUse() == 0 })
}

// TestStreamRecordUnderClientShare: the copy a keyed stream's recorder
// keeps counts against the client's share of limits.max_inflight_bytes as
// it grows. Alice's 1.5 MiB stream passes her 1 MiB share: it is relayed
// whole but not recorded, and its retry is 410
// idempotency_result_not_stored; Bob's 0.5 MiB stream is recorded and
// replayed byte for byte. Before, every keyed stream was recorded up to
// max_record_bytes (8 MiB) whatever the number in flight.
func TestStreamRecordUnderClientShare(t *testing.T) {
	event := "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" +
		strings.Repeat("a", 32<<10) + "\"}}]}\n\n"
	end := "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	stream := func(n int) string { return strings.Repeat(event, n) + end }
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		b, _ := io.ReadAll(r.Body)
		n := 16 // 0.5 MiB
		if strings.Contains(string(b), "big") {
			n = 48 // 1.5 MiB
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, stream(n))
	}))
	t.Cleanup(up.Close)
	h := newHarnessOptions(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = up.URL + "/v1"
		c.Clients = []config.Client{{Name: "alice", Key: aliceKey}, {Name: "bob", Key: bobKey}}
		c.Limits.MaxBodyBytes = 256 << 10
		c.Limits.MaxInflightBytes = 2 << 20 // a share of 1 MiB per client
	}, nil, fakeprovider.Options{}, nil)
	body := func(say string) string {
		return `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"` + say + `"}]}`
	}
	for _, tc := range []struct {
		client, key, say string
		events           int
		retry            int
	}{{aliceKey, "s-big", "big", 48, http.StatusGone}, {bobKey, "s-small", "small", 16, http.StatusOK}} {
		hdr := map[string]string{"Authorization": "Bearer " + tc.client, "Idempotency-Key": tc.key}
		r := h.do(http.MethodPost, "/v1/chat/completions", body(tc.say), hdr)
		if r.status != http.StatusOK || string(r.body) != stream(tc.events) {
			t.Fatalf("%s: status %d, %d bytes, want the stream whole (%d)", tc.key, r.status, len(r.body), len(stream(tc.events)))
		}
		again := h.do(http.MethodPost, "/v1/chat/completions", body(tc.say), hdr)
		if again.status != tc.retry || (tc.retry == http.StatusOK && string(again.body) != stream(tc.events)) {
			t.Fatalf("retry of %s: status %d (want %d), %d bytes", tc.key, again.status, tc.retry, len(again.body))
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("upstream calls = %d, want 2", n)
	}
	waitFor(t, "every byte given back", func() bool { return h.gw.admit.InUse() == 0 })
}
