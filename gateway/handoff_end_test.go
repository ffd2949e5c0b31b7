package gateway

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/request"
)

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
		status, got, _, err := h.deadlineAt(nil, string(request.PointSettled), true, chatBody, key("h2-before-write"))
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
		status, got, _, err := h.deadlineAt(nil, string(request.PointSent), true, chatBody, key("h2-after-written"))
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
		status, got, trailer, err := h.deadlineAt(nil, string(request.PointCommitted), true, streamBody, key("h2-marker"))
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
	status, got, trailer, err := h.deadlineAt(nil, string(request.PointCommitted), false, streamBody, hdr)
	if err != nil || status != http.StatusOK || !bytes.HasSuffix(got, []byte("data: [DONE]\n\n")) || trailer.Get("X-Llmgate-Committed") != "false" {
		t.Fatalf("status %d, err %v, %d bytes, trailer %q; want the whole stream, then X-Llmgate-Committed: false",
			status, err, len(got), trailer.Get("X-Llmgate-Committed"))
	}
	if again := h.chat(streamBody, hdr); again.status != http.StatusGone {
		t.Fatalf("retry: %d %s, want 410", again.status, again.body)
	}
}
