package gateway

import (
	"bytes"
	"fmt"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
)

// A first client that stops reading its keyed stream does not starve the
// duplicates that joined it: once one write to it has been stuck for
// server.write_stall_timeout, it is dropped and the call goes on for the
// joiners (and the commit), which get every event, byte-identical, from
// one upstream call.
func TestStalledFirstClientDoesNotStarveJoiners(t *testing.T) {
	up := newPacedUpstream(0, 0)
	big := strings.Repeat("x", 16<<10)
	var events []string
	events = append(events, up.events[0])
	for i := range 40 { // 640 KiB: ten times what the sockets between gateway and a stalled client hold (smallSends)
		events = append(events, fmt.Sprintf(`data: {"id":"chatcmpl-join","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"%d%s"},"finish_reason":null}]}`+"\n\n", i, big))
	}
	up.events = append(events, up.events[1:]...)
	url := newTestServer(t, up)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = url + "/v1"
		c.Idempotency.MaxRecordBytes = 64 << 20
		c.Server.WriteStallTimeout = config.Duration(300 * time.Millisecond)
	})

	h = smallSends(t, h)

	// The first client sends its request and never reads the answer.
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetReadBuffer(4096)
	}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nIdempotency-Key: stall-1\r\nContent-Length: %d\r\n\r\n%s", len(streamBody), streamBody)
	up.step <- struct{}{} // the first event: the call is running

	joiner := openStream(t, h, "stall-1")
	if ev := joiner.event(); ev != up.events[0] {
		t.Fatalf("joiner's first event: %q", ev)
	}
	for range up.events[1:] {
		select {
		case up.step <- struct{}{}:
		case <-time.After(requestLimit / 3): // a bound, not a synchronisation
			t.Fatal("the upstream's next event was never read: the call is stuck on the stalled first client")
		}
	}
	got := make(chan []byte, 1)
	go func() { got <- joiner.rest() }()
	select {
	case b := <-got:
		if want := strings.Join(up.events, ""); !bytes.Equal(b, []byte(want)) {
			t.Fatalf("joiner got %d bytes, want the upstream's %d", len(b), len(want))
		}
	case <-time.After(requestLimit / 3):
		t.Fatal("the joiner never got the whole stream")
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls: %d, want 1", n)
	}
}

// smallSends is h served again on a listener whose connections have a
// 32 KiB send buffer (the kernel's autotuning off), so that a stream a
// client stops reading fills what the sockets hold after tens of KiB
// rather than the autotuned 4 MiB: a stall is reached with little data,
// which under -race on a busy machine is what takes the time.
func smallSends(t *testing.T, h *harness) *harness {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h.gw.Handler())
	srv.Listener = smallSendListener{ln}
	srv.Start()
	t.Cleanup(srv.Close)
	c := *h
	c.srv = srv
	return &c
}

type smallSendListener struct{ net.Listener }

func (l smallSendListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(32 << 10)
	}
	return c, err
}
