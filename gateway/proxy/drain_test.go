package proxy

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/metrics"
	"github.com/llmgate/llmgate/gateway/retry"
)

const chatStream = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n" +
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n" +
	"data: [DONE]\n\n"

// chatStreamCall is a Proxy with one OpenAI upstream at url and a streaming
// chat call to it.
func chatStreamCall(t *testing.T, url string) (*Proxy, *Call) {
	t.Helper()
	router, err := NewRouter([]config.Upstream{{Name: "openai", BaseURL: url + "/v1", Models: []string{"gpt-*"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(router.Close)
	p := New(Options{Config: config.Default(), Router: router, Breakers: breaker.New([]breaker.Upstream{{Name: "openai"}}, breaker.Settings{}),
		Budget: retry.NewBudget(retry.BudgetOptions{}), Metrics: metrics.New(prometheus.NewRegistry(), nil)})
	body := []byte(`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"Hi"}]}`)
	in := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
	return p, &Call{In: in, Suffix: "/chat/completions", API: ChatCompletions, Body: body, Model: "gpt-4o", Stream: true,
		Hops: []Hop{PrivateHop(router.Upstream("openai"), "sk-upstream")}}
}

// flushSignal is a client that says when a flush has sent [DONE].
type flushSignal struct {
	*httptest.ResponseRecorder
	done chan struct{}
	sent atomic.Bool
}

func (f *flushSignal) Flush() {
	f.ResponseRecorder.Flush()
	if bytes.Contains(f.Body.Bytes(), []byte("[DONE]")) && f.sent.CompareAndSwap(false, true) {
		close(f.done)
	}
}

// A stream whose body's last chunk arrives after the read that brought
// [DONE] (the upstream's handler returns only once the client has [DONE])
// is read to its end before it is closed, so its connection goes back to
// the pool for the next call instead of being closed (before, ~6% of
// streams at 16 clients dialled a new connection).
func TestStreamEndDrainedConnectionReused(t *testing.T) {
	release := make(chan struct{})
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(chatStream))
		w.(http.Flusher).Flush()
		<-release // the last chunk (0\r\n\r\n) goes out when this returns
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	p, c := chatStreamCall(t, srv.URL)
	p.drainWait = time.Minute // the test, not the clock, decides when the last chunk comes

	idle := make(chan error, 1)
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{PutIdleConn: func(err error) { idle <- err }})
	resp, err := p.Execute(ctx, c)
	if err != nil || resp.Stream == nil {
		t.Fatalf("execute: %v, stream %v", err, resp.Stream != nil)
	}
	w := &flushSignal{ResponseRecorder: httptest.NewRecorder(), done: make(chan struct{})}
	relayed := make(chan struct{})
	go func() {
		defer close(relayed)
		p.RelayStream(w, resp, Relay{Start: time.Now()})
	}()
	<-w.done       // the client has the whole stream
	close(release) // now the upstream ends its body
	<-relayed
	if got := w.Body.String(); got != chatStream {
		t.Fatalf("the client got\n%s\nwant the stream byte for byte", got)
	}
	select {
	case err := <-idle:
		if err != nil {
			t.Fatalf("connection not put back idle: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream's connection never went back to the pool: its body was closed before its end")
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections to the upstream, want 1", n)
	}
}

// An upstream that holds its connection open after [DONE] does not hold the
// stream's end: the drain gives up after drainWait and the connection is
// closed, as before.
func TestStreamEndDrainBounded(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(chatStream))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	p, c := chatStreamCall(t, srv.URL)
	resp, err := p.Execute(context.Background(), c)
	if err != nil || resp.Stream == nil {
		t.Fatalf("execute: %v", err)
	}
	w := httptest.NewRecorder()
	start := time.Now()
	p.RelayStream(w, resp, Relay{Start: start})
	if w.Body.String() != chatStream || resp.Outcome.Class.BreakerFailure() {
		t.Fatalf("the client got %q, outcome %+v", w.Body.String(), resp.Outcome)
	}
	// Bounded by drainWait, not by the upstream (which never ends).
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the relay took %v with the upstream holding its connection open", took)
	}
}
