package gateway

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/request"
)

// deadlineAt sends a keyed request to the gateway through a server of its
// own — over HTTP/2 with TLS when h2, else HTTP/1 — whose client deadline
// passes when the call reaches settle point p, and returns what the
// client received (err: the read failed, the answer was cut).
func (h *harness) deadlineAt(h2 bool, p request.SettlePoint, body string, hdr map[string]string) (status int, got []byte, trailer http.Header, err error) {
	h.t.Helper()
	deadline := make(chan time.Time, 1)
	cut := make(chan struct{})
	var fired atomic.Bool
	hk := &request.CallHooks{Deadline: deadline, Cut: func() { close(cut) }}
	hk.At = func(at request.SettlePoint) {
		if at == p && fired.CompareAndSwap(false, true) {
			deadline <- time.Time{}
			select {
			case <-cut:
			case <-time.After(requestLimit):
				h.t.Error("the handler never acted on the client's deadline")
			}
		}
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.gw.Handler().ServeHTTP(w, r.WithContext(request.WithCallHooks(r.Context(), hk)))
	}))
	client := testClient
	if h2 {
		srv.EnableHTTP2 = true
		srv.StartTLS()
		client = srv.Client()
		client.Timeout = requestLimit
	} else {
		srv.Start()
	}
	defer srv.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer res.Body.Close()
	if h2 && res.ProtoMajor != 2 {
		h.t.Fatalf("served over %s, want HTTP/2", res.Proto)
	}
	got, err = io.ReadAll(res.Body)
	if !fired.Load() {
		h.t.Fatalf("the call never reached %q: %d %.300s", p, res.StatusCode, got)
	}
	return res.StatusCode, got, res.Trailer, err
}

// TestClientDeadlineOverHTTP2: over HTTP/2 (an importer's TLS server) a
// client deadline does what it does over HTTP/1 — a 504 when nothing was
// written, the answer when it was written whole, a stream delivered whole
// ending cleanly — rather than resetting the stream. The handler set a
// write deadline of now whenever it ended the handoff, to cut a write
// stuck on the client; over HTTP/2 a deadline that passes resets the
// stream at once, write or no write, so each of these got a stream error
// (and the over-limit stream's retry a 410 for an answer cut short).
func TestClientDeadlineOverHTTP2(t *testing.T) {
	t.Run("nothing written: 504", func(t *testing.T) {
		h := newHarness(t, nil)
		h.fake.Enqueue(fakeprovider.Step{Body: fixedJSON(100)})
		status, got, _, err := h.deadlineAt(true, request.PointSettled, chatBody, key("h2-before-write"))
		if err != nil || status != http.StatusGatewayTimeout {
			t.Fatalf("status %d, err %v, body %.200q; want a 504", status, err, got)
		}
	})
	t.Run("JSON written whole: the answer", func(t *testing.T) {
		h := newHarness(t, nil)
		step := fakeprovider.Step{Body: fixedJSON(100)}
		h.fake.Enqueue(step)
		ref := h.chat(chatBody, key("reference"))
		h.fake.Enqueue(step)
		status, got, _, err := h.deadlineAt(true, request.PointSent, chatBody, key("h2-after-written"))
		if err != nil || status != http.StatusOK || !bytes.Equal(got, ref.body) {
			t.Fatalf("status %d, err %v, body %.100q; want the answer whole", status, err, got)
		}
	})
	t.Run("stream over the record limit, delivered: ends cleanly", func(t *testing.T) {
		h := newHarness(t, func(c *config.Config) { c.Idempotency.MaxRecordBytes = 1024 })
		step := fakeprovider.Step{Body: fixedStream}
		h.fake.Enqueue(step)
		ref := h.chat(streamBody, key("reference"))
		h.fake.Enqueue(step, step)
		status, got, trailer, err := h.deadlineAt(true, request.PointCommitted, streamBody, key("h2-marker"))
		if err != nil || status != http.StatusOK || !bytes.Equal(got, ref.body) || trailer.Get("X-Llmgate-Committed") != "false" {
			t.Fatalf("status %d, err %v, %d of %d bytes, trailer %q; want the stream whole, then X-Llmgate-Committed: false",
				status, err, len(got), len(ref.body), trailer.Get("X-Llmgate-Committed"))
		}
	})
}

// TestDeliveredStreamEndsAfterDeadline: a keyed stream over the record
// limit, of a client with a budget (its call flushes once more after the
// budget settles), whose client deadline passes once its not-stored marker
// is committed: the handler finds it delivered and waits for the call, and
// the stream must end cleanly, since its retry gets 410. The handler left
// its "ending" mark set, so the call's last flush set a write deadline of
// now that nothing lifted, and the response's end failed: the client read
// every event, then an unexpected EOF.
func TestDeliveredStreamEndsAfterDeadline(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, fixedStream)
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) {
		budgeted(up.URL, config.Budget{Window: config.WindowDay, Tokens: 1 << 30})(c)
		c.Idempotency.MaxRecordBytes = 1024
	})
	hdr := map[string]string{"Authorization": "Bearer key-alice", "Idempotency-Key": "ending-left-set"}
	status, got, trailer, err := h.deadlineAt(false, request.PointCommitted, streamBody, hdr)
	if err != nil || status != http.StatusOK || !bytes.HasSuffix(got, []byte("data: [DONE]\n\n")) || trailer.Get("X-Llmgate-Committed") != "false" {
		t.Fatalf("status %d, err %v, %d bytes, trailer %q; want the whole stream, then X-Llmgate-Committed: false",
			status, err, len(got), trailer.Get("X-Llmgate-Committed"))
	}
	if again := h.chat(streamBody, hdr); again.status != http.StatusGone {
		t.Fatalf("retry: %d %s, want 410", again.status, again.body)
	}
}
