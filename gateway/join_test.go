package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/request"
)

// pacedUpstream is an OpenAI chat stream whose events go out one at a
// time, each when the test steps it; cutAfter > 0 drops the connection
// after that many events instead of ending the stream.
type pacedUpstream struct {
	step     chan struct{}
	calls    atomic.Int32
	events   []string
	cutAfter atomic.Int32
}

func newPacedUpstream(content int, cutAfter int) *pacedUpstream {
	p := &pacedUpstream{step: make(chan struct{})}
	p.cutAfter.Store(int32(cutAfter))
	chunk := func(delta, finish string) string {
		return fmt.Sprintf(`data: {"id":"chatcmpl-join","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n", delta, finish)
	}
	p.events = append(p.events, chunk(`{"role":"assistant","content":""}`, "null"))
	for i := range content {
		p.events = append(p.events, chunk(fmt.Sprintf(`{"content":"part %d. "}`, i), "null"))
	}
	p.events = append(p.events, chunk(`{}`, `"stop"`),
		`data: {"id":"chatcmpl-join","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9}}`+"\n\n",
		"data: [DONE]\n\n")
	return p
}

func (p *pacedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.calls.Add(1)
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	for i, ev := range p.events {
		if c := int(p.cutAfter.Load()); c > 0 && i == c {
			panic(http.ErrAbortHandler)
		}
		select {
		case <-p.step:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, ev)
		w.(http.Flusher).Flush()
	}
}

// sseClient reads a keyed stream from the gateway an event at a time.
type sseClient struct {
	t      *testing.T
	opened chan *http.Response
	res    *http.Response
	rd     *bufio.Reader
	read   bytes.Buffer
}

// openStream sends a keyed stream request; its answer is read by event.
func openStream(t *testing.T, h *harness, key string) *sseClient {
	t.Helper()
	return openStreamAt(t, h.srv.URL, key, nil)
}

// openStreamAt is openStream to the gateway at url, with headers hdr.
func openStreamAt(t *testing.T, url, key string, hdr map[string]string) *sseClient {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &sseClient{t: t, opened: make(chan *http.Response, 1)}
	go func() {
		res, err := testClient.Do(req)
		if err != nil {
			close(c.opened)
			return
		}
		c.opened <- res
	}()
	return c
}

// response waits for the status line (within a bound).
func (c *sseClient) response() *http.Response {
	c.t.Helper()
	if c.res != nil {
		return c.res
	}
	select {
	case res, ok := <-c.opened:
		if !ok {
			c.t.Fatal("the request failed")
		}
		c.res, c.rd = res, bufio.NewReader(res.Body)
		c.t.Cleanup(func() { res.Body.Close() })
		return res
	case <-time.After(requestLimit / 3): // a bound, not a synchronisation
		c.t.Fatal("the stream's status line never came")
		return nil
	}
}

// event reads the next event (through its blank line), failing the test
// if it does not come within a bound: what the gateway has been sent must
// reach this client before the upstream sends more.
func (c *sseClient) event() string {
	c.t.Helper()
	c.response()
	got := make(chan string, 1)
	go func() {
		var ev strings.Builder
		for {
			line, err := c.rd.ReadString('\n')
			ev.WriteString(line)
			if err != nil || line == "\n" {
				got <- ev.String()
				return
			}
		}
	}()
	select {
	case ev := <-got:
		c.read.WriteString(ev)
		return ev
	case <-time.After(requestLimit / 3):
		c.t.Fatalf("no event within %v; read so far:\n%s", requestLimit/3, c.read.String())
		return ""
	}
}

// rest reads the stream to its end.
func (c *sseClient) rest() []byte {
	c.t.Helper()
	c.response()
	b, _ := io.ReadAll(c.rd)
	c.read.Write(b)
	return c.read.Bytes()
}

// TestDuplicateJoinsStreamInFlight: a duplicate of a keyed stream still
// running gets the events already sent at once — before the upstream
// sends the next — and then each event live, as the first client does:
// the same bytes, one upstream call, and the same bytes again on a later
// replay.
func TestDuplicateJoinsStreamInFlight(t *testing.T) {
	up := newPacedUpstream(4, 0)
	url := newTestServer(t, up)
	h := newHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = url + "/v1" })
	first := openStream(t, h, "join-1")
	var sent []string
	for i := range 3 {
		up.step <- struct{}{}
		sent = append(sent, first.event())
		if sent[i] != up.events[i] {
			t.Fatalf("first client's event %d: %q, upstream sent %q", i, sent[i], up.events[i])
		}
	}
	joiner := openStream(t, h, "join-1")
	for i := range 3 { // before the upstream sends event 3
		if ev := joiner.event(); ev != sent[i] {
			t.Fatalf("joiner's event %d: %q, the first client got %q", i, ev, sent[i])
		}
	}
	up.step <- struct{}{} // event 3 (content): both get it before event 4 goes out
	if a, b := first.event(), joiner.event(); a != up.events[3] || b != a {
		t.Fatalf("event 3: first %q, joiner %q, upstream %q", a, b, up.events[3])
	}
	for range up.events[4:] {
		up.step <- struct{}{}
	}
	a, b := first.rest(), joiner.rest()
	if !bytes.Equal(a, b) || !bytes.Equal(a, []byte(strings.Join(up.events, ""))) {
		t.Fatalf("the two clients' streams differ or are not the upstream's:\nfirst:  %q\njoiner: %q", a, b)
	}
	if joiner.response().Header.Get("X-Llmgate-Joined") != "true" || joiner.res.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("joiner's headers: %v", joiner.res.Header)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls: %d, want 1", n)
	}
	h.gw.requests.WaitCalls()
	again := h.chat(streamBody, map[string]string{"Idempotency-Key": "join-1"})
	if !bytes.Equal(again.body, a) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay after the commit: %s", again.body)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls after the replay: %d, want 1", n)
	}
}

// TestJoinedStreamFails: when the stream a duplicate joined is cut after
// events went out, both clients see the same bytes, ending in the same
// single error event; nothing is committed, and the next call runs again.
func TestJoinedStreamFails(t *testing.T) {
	up := newPacedUpstream(4, 3)
	url := newTestServer(t, up)
	h := newHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = url + "/v1" })
	first := openStream(t, h, "join-cut")
	for range 2 {
		up.step <- struct{}{}
		first.event()
	}
	joiner := openStream(t, h, "join-cut")
	joiner.event()
	joiner.event()
	up.step <- struct{}{} // event 2; then the upstream drops the connection
	a, b := first.rest(), joiner.rest()
	if !bytes.Equal(a, b) {
		t.Fatalf("the two clients' streams differ:\nfirst:  %q\njoiner: %q", a, b)
	}
	if n := bytes.Count(a, []byte(`data: {"error"`)); n != 1 {
		t.Fatalf("%d error events, want 1:\n%s", n, a)
	}
	h.gw.requests.WaitCalls()
	go func() { // the retry runs again: let its stream through
		for range up.events {
			up.step <- struct{}{}
		}
	}()
	up.cutAfter.Store(0)
	r := h.chat(streamBody, map[string]string{"Idempotency-Key": "join-cut"})
	if r.header.Get("Idempotent-Replayed") == "true" || up.calls.Load() != 2 {
		t.Fatalf("retry after the failed stream: replayed=%q, upstream calls %d", r.header.Get("Idempotent-Replayed"), up.calls.Load())
	}
}

// TestJoinedUnrecordableStreamIsCut: a stream past idempotency's record
// limits is not committed (its retry gets the not-stored 410, or runs
// again), so a duplicate that joined it is cut once the recorder gives up
// — its response aborted, never ended as if whole — while the first
// client, which the marker answers for, gets it all.
func TestJoinedUnrecordableStreamIsCut(t *testing.T) {
	up := newPacedUpstream(6, 0)
	url := newTestServer(t, up)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = url + "/v1"
		c.Idempotency.MaxRecordEvents = 4
	})
	first := openStream(t, h, "join-big")
	for range 2 {
		up.step <- struct{}{}
		first.event()
	}
	joiner := openStream(t, h, "join-big")
	joiner.event()
	joiner.event()
	go func() {
		for range up.events[2:] {
			up.step <- struct{}{}
		}
	}()
	a := first.rest()
	if !bytes.HasSuffix(a, []byte("data: [DONE]\n\n")) {
		t.Fatalf("the first client's stream did not end whole:\n%s", a)
	}
	joiner.response()
	rest, err := io.ReadAll(joiner.rd)
	if err == nil {
		t.Fatalf("the joiner's stream of an unrecordable answer ended cleanly:\n%s%s", joiner.read.String(), rest)
	}
}

// TestJoinerDeadlineAfterStreamEnd: a joiner whose client deadline passes
// once the stream it follows has written its end, committed, gets that
// stream as the first client does, with nothing after its end (before,
// the joiner appended a client_deadline_exceeded event after [DONE] while
// the call still settled, and an SDK reading to the end raised on it).
func TestJoinerDeadlineAfterStreamEnd(t *testing.T) {
	up := newPacedUpstream(2, 0)
	url := newTestServer(t, up)
	h := newHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = url + "/v1" })
	sent, release := make(chan struct{}), make(chan struct{})
	deadline, cutting := make(chan time.Time, 1), make(chan struct{})
	first := &request.CallHooks{At: func(p request.SettlePoint) {
		if p == request.PointSent {
			close(sent)
			<-release // the call settles on only once the joiner has met its deadline
		}
	}}
	joinerHooks := &request.CallHooks{Deadline: deadline, Cutting: func() { close(cutting) }}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hk := first
		if r.Header.Get("X-Test-Joiner") != "" {
			hk = joinerHooks
		}
		h.gw.Handler().ServeHTTP(w, r.WithContext(request.WithCallHooks(r.Context(), hk)))
	}))
	defer srv.Close()
	a := openStreamAt(t, srv.URL, "join-deadline", nil)
	up.step <- struct{}{}
	a.event()
	joiner := openStreamAt(t, srv.URL, "join-deadline", map[string]string{"X-Test-Joiner": "1"})
	joiner.event()
	go func() {
		for range up.events[1:] {
			up.step <- struct{}{}
		}
	}()
	wait := func(c <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(requestLimit): // a bound, not a synchronisation
			close(release)
			t.Fatalf("%s never happened", what)
		}
	}
	wait(sent, "the first call's end going out")
	for !strings.HasSuffix(joiner.read.String(), "data: [DONE]\n\n") {
		joiner.event()
	}
	deadline <- time.Time{}
	wait(cutting, "the joiner acting on its deadline")
	close(release)
	whole := []byte(strings.Join(up.events, ""))
	if got := joiner.rest(); !bytes.Equal(got, whole) {
		t.Fatalf("the joiner got, after the stream's end:\n%s", got[len(whole)-len("data: [DONE]\n\n"):])
	}
	if got := a.rest(); !bytes.Equal(got, whole) {
		t.Fatalf("the first client got:\n%s", got)
	}
}
