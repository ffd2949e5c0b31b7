package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/request"
)

// A client that leaves after the last byte of an answer too large to record
// was handed to the server's buffer, but before the response ended, did not
// receive it whole: its retry must not get 410.
func TestNoMarkerWhenClientLeftBeforeTheAnswerEnded(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Idempotency.MaxRecordBytes = 1024 })
	step := fakeprovider.Step{Body: fixedJSON(40 << 10)}
	h.fake.Enqueue(step, step)
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srvCtx := make(chan context.Context, 1)
	hk := &request.CallHooks{At: func(p request.SettlePoint) {
		if p == request.PointSent {
			cancel() // the client leaves
			select {
			case <-(<-srvCtx).Done():
			case <-time.After(5 * time.Second):
				t.Error("server never saw the client leave")
			}
		}
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srvCtx <- r.Context()
		h.gw.Handler().ServeHTTP(w, r.WithContext(request.WithCallHooks(r.Context(), hk)))
	}))
	defer srv.Close()
	req, _ := http.NewRequestWithContext(cctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "left-at-end")
	res, err := http.DefaultClient.Do(req)
	got := 0
	if err == nil {
		b, _ := io.ReadAll(res.Body)
		got = len(b)
		res.Body.Close()
	}
	h.gw.requests.WaitCalls()
	t.Logf("first client got %d bytes of %d (err %v)", got, len(fixedJSON(40<<10)), err)
	again := h.chat(chatBody, key("left-at-end"))
	if again.status != http.StatusOK || len(again.body) != len(fixedJSON(40<<10)) {
		t.Fatalf("retry got %d (%d bytes), want the answer run again: %.300s", again.status, len(again.body), again.body)
	}
	if n := len(h.fake.Requests()); n != 2 {
		t.Fatalf("upstream saw %d calls, want 2 (the retry runs again)", n)
	}
}

// A client that leaves before a stream too large to record has its held
// tail, did not receive it whole: its retry runs again, no 410.
func TestNoMarkerWhenStreamClientLeftBeforeTheTail(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Idempotency.MaxRecordBytes = 1024 })
	step := fakeprovider.Step{Body: fixedStream}
	h.fake.Enqueue(step, step)
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srvCtx := make(chan context.Context, 1)
	hk := &request.CallHooks{At: func(p request.SettlePoint) {
		if p == request.PointSettled {
			cancel() // the client leaves before the held tail goes out
			select {
			case <-(<-srvCtx).Done():
			case <-time.After(5 * time.Second):
				t.Error("server never saw the client leave")
			}
		}
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srvCtx <- r.Context()
		h.gw.Handler().ServeHTTP(w, r.WithContext(request.WithCallHooks(r.Context(), hk)))
	}))
	defer srv.Close()
	req, _ := http.NewRequestWithContext(cctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "stream-left")
	res, err := http.DefaultClient.Do(req)
	got := ""
	if err == nil {
		b, _ := io.ReadAll(res.Body)
		got = string(b)
		res.Body.Close()
	}
	h.gw.requests.WaitCalls()
	t.Logf("first client got [DONE]=%v (err %v)", strings.Contains(got, "[DONE]"), err)
	again := h.chat(streamBody, key("stream-left"))
	if again.status != http.StatusOK || !strings.Contains(string(again.body), "[DONE]") {
		t.Fatalf("retry got %d, want the stream run again: %.300s", again.status, again.body)
	}
	if n := len(h.fake.Requests()); n != 2 {
		t.Fatalf("upstream saw %d calls, want 2 (the retry runs again)", n)
	}
}

// markerFailStore fails every commit of a not-stored marker (a 410 record).
type markerFailStore struct{ Store }

func (s *markerFailStore) Commit(ctx context.Context, k cache.Key, owner string, rec *cache.Record, ttl time.Duration) error {
	if rec.Status == http.StatusGone {
		return errors.New("store refused the marker")
	}
	return s.Store.Commit(ctx, k, owner, rec, ttl)
}

// A marker whose commit fails releases the key once: the release metric
// counts one release, and the client's retry runs again.
func TestFailedMarkerCommitReleasesOnce(t *testing.T) {
	for _, tc := range []struct{ name, body, answer string }{
		{"json", chatBody, fixedJSON(8 << 10)},
		{"stream", streamBody, fixedStream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessStore(t, func(c *config.Config) { c.Idempotency.MaxRecordBytes = 1024 },
				func(s Store) Store { return &markerFailStore{Store: s} }, fakeprovider.Options{})
			step := fakeprovider.Step{Body: tc.answer}
			h.fake.Enqueue(step, step)
			send := func() {
				// A JSON answer is cut (its marker failed: the retry runs
				// again); a stream is whole.
				if res, err := h.send(context.Background(), http.MethodPost, "/v1/chat/completions", tc.body, key("marker-fails")); err == nil {
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
				}
				h.gw.requests.WaitCalls()
			}
			send()
			const release = `llmgate_idempotency_events_total{event="release"} `
			var line string
			for _, l := range strings.Split(h.metricsText(), "\n") {
				if strings.HasPrefix(l, release) {
					line = l
				}
			}
			if line != release+"1" {
				t.Fatalf("release counted %q, want once", strings.TrimPrefix(line, release))
			}
			send()
			if n := len(h.fake.Requests()); n != 2 {
				t.Fatalf("upstream saw %d calls, want 2 (the retry runs again)", n)
			}
		})
	}
}
