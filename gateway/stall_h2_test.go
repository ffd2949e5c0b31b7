package gateway

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
)

// Served over HTTP/2 (an importer's TLS server), a keyed stream whose
// upstream pauses between events for longer than write_stall_timeout (a
// model thinking, well within stream_idle_timeout) is not reset: the stall
// guard bounds writes that are stuck, and on HTTP/2 a write deadline left
// set between writes resets the stream when it passes, write or no write.
func TestStallGuardLetsAnHTTP2StreamPause(t *testing.T) {
	const stall = 100 * time.Millisecond
	up := newPacedUpstream(1, 0)
	url := newTestServer(t, up)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = url + "/v1"
		c.Server.WriteStallTimeout = config.Duration(stall)
	})
	srv := httptest.NewUnstartedServer(h.gw.Handler())
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "h2-pause")
	go func() { up.step <- struct{}{} }() // the first event
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.ProtoMajor != 2 {
		t.Fatalf("served over %s, want HTTP/2", res.Proto)
	}
	br := bufio.NewReader(res.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, `"role":"assistant"`) {
		t.Fatalf("first event: %q, %v", line, err)
	}
	time.Sleep(3 * stall) // the upstream is silent: the pause under test
	go func() {
		for range up.events[1:] {
			select {
			case up.step <- struct{}{}:
			case <-t.Context().Done():
				return
			}
		}
	}()
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("stream cut after a pause of %v: %v", 3*stall, err)
	}
	if !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("stream ended without [DONE]: %s", rest)
	}
}
