package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// upstreamHarness is a gateway in front of a hand-written upstream, for
// failures the scripted fake does not produce.
func upstreamHarness(t *testing.T, up http.HandlerFunc, mutate func(*config.Config)) (*harness, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		up(w, r)
	}))
	t.Cleanup(s.Close)
	return newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = s.URL + "/v1"
		if mutate != nil {
			mutate(c)
		}
	}), &calls
}

func cutAfter(w http.ResponseWriter, contentType, length, body string) {
	w.Header().Set("Content-Type", contentType)
	if length != "" {
		w.Header().Set("Content-Length", length)
	}
	w.WriteHeader(200)
	_, _ = w.Write([]byte(body))
	w.(http.Flusher).Flush()
	conn, _, _ := w.(http.Hijacker).Hijack()
	conn.Close()
}

// A 200 whose body is cut is a transport failure, not an empty 200 — and is
// never committed.
func TestCutBodyIsNotAnEmpty200(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"json", chatBody},
		{"stream", streamBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, calls := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
				if strings.Contains(tc.name, "stream") {
					cutAfter(w, "text/event-stream", "", `data: {"id":`)
				} else {
					cutAfter(w, "application/json", "500", `{"id":"x","choi`)
				}
			}, nil)
			r := h.chat(tc.body, key("cut"))
			e := wantOpenAIError(t, r, http.StatusBadGateway)
			if e["code"] != "upstream_unreachable" || calls.Load() != 3 {
				t.Fatalf("code %v after %d calls", e["code"], calls.Load())
			}
			if r := h.chat(tc.body, key("cut")); r.header.Get("Idempotent-Replayed") != "" || calls.Load() != 6 {
				t.Fatalf("a cut response was committed (calls %d)", calls.Load())
			}
		})
	}
}

// A 200 that is not an answer (malformed body, or an error object) is not
// committed, and says x-should-retry: false.
func TestUnusable200IsNotCommitted(t *testing.T) {
	for _, body := range []string{`{"id":"x","choices":[`, `{"error":{"message":"quota","type":"insufficient_quota","code":"insufficient_quota"}}`} {
		h, calls := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, body)
		}, nil)
		r := h.chat(chatBody, key("bad200"))
		if r.header.Get("X-Should-Retry") != "false" {
			t.Errorf("%s: x-should-retry %q", body, r.header.Get("X-Should-Retry"))
		}
		before := calls.Load()
		if r := h.chat(chatBody, key("bad200")); r.header.Get("Idempotent-Replayed") != "" || calls.Load() == before {
			t.Fatalf("%s was committed", body)
		}
	}
}

// [DONE] ends a stream: an upstream that then holds the connection open
// (or resets it) does not fail it, and it is committed.
func TestStreamEndsAtDone(t *testing.T) {
	h, calls := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		_, _ = w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}, func(c *config.Config) { c.Limits.StreamIdleTimeout = config.Duration(time.Minute) })
	first := h.chat(streamBody, key("done"))
	if !strings.HasSuffix(string(first.body), "data: [DONE]\n\n") {
		t.Fatalf("stream %q", first.body)
	}
	again := h.chat(streamBody, key("done"))
	if again.header.Get("Idempotent-Replayed") != "true" || string(again.body) != string(first.body) || calls.Load() != 1 {
		t.Fatalf("not committed: calls %d", calls.Load())
	}
}

// A client's short deadline is the client's business: it must not open
// the breaker for everyone else.
func TestClientDeadlineDoesNotTripBreaker(t *testing.T) {
	h, _ := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(200 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}`)
	}, func(c *config.Config) { c.Breaker.ConsecutiveFailures = 2 })
	for i := 0; i < 4; i++ {
		h.chat(chatBody, map[string]string{DeadlineHeader: "10ms"})
	}
	if got := breakerState(t, h, "primary"); got != "closed" {
		t.Fatalf("short client deadlines opened the breaker: %s", got)
	}
	if r := h.chat(chatBody, nil); r.status != 200 {
		t.Fatalf("a normal client got %d", r.status)
	}
}

// A response too large to buffer that is cut while being copied reaches the
// client as a broken response, not a short complete one.
func TestCutLargeResponseIsAborted(t *testing.T) {
	h, _ := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		cutAfter(w, "application/json", "5000", `{"id":"x","choices":[{"message":{"content":"`+strings.Repeat("a", 2000))
	}, func(c *config.Config) { c.Idempotency.MaxRecordBytes = 1000 })
	res, err := h.send(context.Background(), http.MethodPost, "/v1/chat/completions", chatBody, nil)
	if err != nil {
		return // cut before the headers: also not a clean answer
	}
	_, err = io.ReadAll(res.Body)
	res.Body.Close()
	if err == nil {
		t.Fatalf("a cut response read as complete (status %d)", res.StatusCode)
	}
}

// An upstream that hangs until its own timeout failed, however short the
// client's deadline: a keyed call runs on past that deadline, and its
// attempt timing out says something about the upstream, so the breaker
// counts it — with or without a client deadline, as with max_attempts 1.
func TestHungUpstreamTripsBreakerUnderShortClientDeadline(t *testing.T) {
	for _, dl := range []string{"", "50ms"} {
		t.Run("deadline="+dl, func(t *testing.T) {
			h := newHarness(t, func(c *config.Config) {
				c.Breaker.ConsecutiveFailures = 1
				c.Upstreams[0].Timeout = config.Duration(200 * time.Millisecond)
			})
			h.fake.Enqueue(fakeprovider.Step{Hang: true}, fakeprovider.Step{Hang: true}, fakeprovider.Step{Hang: true})
			hdr := key("hung-" + dl)
			if dl != "" {
				hdr[DeadlineHeader] = dl
			}
			r := h.chat(chatBody, hdr)
			h.gw.requests.WaitCalls()
			st, _ := h.gw.breakers.Status(breaker.Key{Upstream: "primary", Model: "gpt-4o-mini"})
			if st.State != breaker.Open {
				t.Fatalf("status %d, breaker %v after the upstream hung to its timeout (upstream calls %d)", r.status, st.State, len(h.fake.Requests()))
			}
		})
	}
}
