package gateway

import (
	"bytes"
	"context"
	"fmt"
	"github.com/llmgate/llmgate/gateway/request"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// commitHookStore calls its hook (when set) before each commit, so a test
// can pass the client's deadline while a commit is under way.
type commitHookStore struct {
	Store
	hook atomic.Pointer[func()]
}

func (s *commitHookStore) Commit(ctx context.Context, k cache.Key, owner string, rec *cache.Record, ttl time.Duration) error {
	if f := s.hook.Load(); f != nil {
		(*f)()
	}
	return s.Store.Commit(ctx, k, owner, rec, ttl)
}

// A fixed stream of five content chunks (about 3 KB) and a finish, so that
// every run of it gives the same bytes.
var fixedStream = func() string {
	var b strings.Builder
	b.WriteString(`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n")
	for i := range 5 {
		fmt.Fprintf(&b, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"%d%s"},"finish_reason":null}]}`+"\n\n", i, strings.Repeat("x", 600))
	}
	b.WriteString("data: " + finishChunk + "\n\ndata: [DONE]\n\n")
	return b.String()
}()

func fixedJSON(n int) string {
	return `{"id":"x","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("a", n) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
}

// The client's deadline may pass at any moment of a keyed call's
// settlement: before anything is committed or sent, while the answer (or
// the not-stored marker of one too large to record) is being committed,
// after the commit, and after the whole answer went out. Whenever it
// passes, the retry with the same key gets the whole answer (a replay or a
// fresh run, byte-identical to an uncut run), or — for an answer too large
// to record — a 410 only if the first response did carry the whole
// answer. Never a 410 for an answer the client did not receive.
func TestClientDeadlineAtEachPointOfSettlement(t *testing.T) {
	scenarios := []struct {
		name      string
		body      string
		upstream  string
		maxRecord int64
	}{
		{"stream", streamBody, fixedStream, 0},
		{"stream over the record limit", streamBody, fixedStream, 1024},
		{"json", chatBody, fixedJSON(100), 0},
		{"json over the record limit", chatBody, fixedJSON(40 << 10), 1024},
	}
	points := []string{string(request.PointSettled), "store commit", string(request.PointCommitted), string(request.PointSent)}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			var st *commitHookStore
			h := newHarnessStore(t, func(c *config.Config) {
				if sc.maxRecord > 0 {
					c.Idempotency.MaxRecordBytes = sc.maxRecord
				}
			}, func(s Store) Store { st = &commitHookStore{Store: s}; return st }, fakeprovider.Options{})
			step := fakeprovider.Step{Body: sc.upstream}
			h.fake.Enqueue(step)
			ref := h.chat(sc.body, key("reference"))
			if ref.status != 200 || len(ref.body) < len(sc.upstream)/2 {
				t.Fatalf("reference run: %d %.200s", ref.status, ref.body)
			}
			for _, p := range points {
				t.Run(p, func(t *testing.T) {
					h.fake.Enqueue(step, step)
					k := "cut-at-" + strings.ReplaceAll(p, " ", "-")
					whole := h.cutAt(st, p, sc.body, k, ref.body)
					if p == string(request.PointSent) && !whole {
						// The whole answer, its end included, was out
						// before the deadline passed: nothing may follow it.
						t.Errorf("a deadline passing once the whole answer was sent spoiled it")
					}
					again := h.chat(sc.body, key(k))
					switch {
					case again.status == http.StatusGone && !whole:
						t.Fatalf("the retry got 410 for an answer the client did not receive whole: %s", again.body)
					case again.status == http.StatusGone && sc.maxRecord == 0:
						t.Fatalf("410 for an answer under the record limit: %s", again.body)
					case again.status != http.StatusGone && (again.status != 200 || !bytes.Equal(again.body, ref.body)):
						t.Fatalf("retry: %d replayed=%q, not the whole answer: %.300q", again.status,
							again.header.Get("Idempotent-Replayed"), again.body)
					}
				})
			}
		})
	}
}

// cutAt sends a keyed request whose client deadline passes at point p of
// its settlement ("store commit": while the store commits), and reports
// whether its response carried the whole answer (want) and ended cleanly.
// An aborted response (a JSON answer cut at the deadline) is no error
// here: the client did not get it whole, that is all.
func (h *harness) cutAt(st *commitHookStore, p, body, k string, want []byte) (whole bool) {
	h.t.Helper()
	status, got, _, err := h.deadlineAt(st, p, false, body, key(k))
	return err == nil && status == http.StatusOK && bytes.Equal(got, want)
}

// deadlineAt sends a keyed request (its headers hdr) whose client deadline
// passes at point p of its settlement ("store commit": while the store st
// commits) through a server of its own — over HTTP/2 with TLS when h2,
// else HTTP/1 — and returns what the client received (err: the request
// or the read failed, the answer was cut).
func (h *harness) deadlineAt(st *commitHookStore, p string, h2 bool, body string, hdr map[string]string) (status int, got []byte, trailer http.Header, err error) {
	h.t.Helper()
	deadline := make(chan time.Time, 1)
	cutting, cut := make(chan struct{}), make(chan struct{})
	var fired atomic.Bool
	fire := func(wait <-chan struct{}) {
		if !fired.CompareAndSwap(false, true) {
			return
		}
		deadline <- time.Time{}
		select {
		case <-wait:
		case <-time.After(requestLimit):
			h.t.Error("the handler never acted on the client's deadline")
		}
	}
	hk := &request.CallHooks{Deadline: deadline, Cutting: func() { close(cutting) }, Cut: func() { close(cut) }}
	if p == "store commit" {
		// The handler's wait for the handoff may be held up by the commit
		// itself: wait only until it has begun to end it.
		f := func() { fire(cutting) }
		st.hook.Store(&f)
		defer st.hook.Store(nil)
	} else {
		hk.At = func(at request.SettlePoint) {
			if string(at) == p {
				fire(cut)
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
	if err == nil {
		if h2 && res.ProtoMajor != 2 {
			h.t.Fatalf("served over %s, want HTTP/2", res.Proto)
		}
		got, err = io.ReadAll(res.Body)
		res.Body.Close()
		status, trailer = res.StatusCode, res.Trailer
	}
	if !fired.Load() {
		h.t.Fatalf("the call never reached %q: %d %.300s", p, status, got)
	}
	return status, got, trailer, err
}

// A keyed JSON answer written whole when the client's deadline passes
// reaches the client whole: the deadline finds it delivered, not a status
// line to cut (before, the handler aborted the response, and the client
// saw a transport error for an answer committed and written; under -race,
// 20 keyed requests with a 1 ms deadline met that about once in 150 runs).
func TestClientDeadlineAfterJSONWrittenDelivers(t *testing.T) {
	var st *commitHookStore
	h := newHarnessStore(t, nil, func(s Store) Store { st = &commitHookStore{Store: s}; return st }, fakeprovider.Options{})
	step := fakeprovider.Step{Body: fixedJSON(100)}
	h.fake.Enqueue(step)
	ref := h.chat(chatBody, key("reference"))
	if ref.status != 200 {
		t.Fatalf("reference run: %d %.200s", ref.status, ref.body)
	}
	h.fake.Enqueue(step)
	if !h.cutAt(st, string(request.PointSent), chatBody, "cut-after-written", ref.body) {
		t.Fatal("a JSON answer written whole before the client's deadline did not reach the client whole")
	}
}

// A keyed call whose client's deadline passes once its whole answer is
// out detaches nothing, not even for a moment. Before, the handler
// counted it detached before finding the answer delivered: at the
// detached cap that evicted another client's detached call (cancelled,
// its answer never committed, so its retry paid for a second one) or
// cancelled this one (with a "too many detached calls" warning); and so
// did a client leaving once its whole answer was out, on a call with no
// deadline of its own, the common case (found by review).
func TestDeadlineAfterAnswerSentDetachesNothing(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	releaseAll := func() { once.Do(func() { close(release) }) }
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if bytes.Contains(b, []byte("hang")) {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(up.Close)
	defer releaseAll() // before the cleanups, which wait for the upstream's handler
	var st *commitHookStore
	h := newHarnessStore(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = up.URL + "/v1"
		c.Upstreams[0].Timeout = config.Duration(time.Minute)
		c.Idempotency.MaxDetached = 2
		c.Clients = []config.Client{{Name: "alice", Key: "key-alice"}, {Name: "bob", Key: "key-bob"}, {Name: "carol", Key: "key-carol"}}
	}, func(s Store) Store { st = &commitHookStore{Store: s}; return st }, fakeprovider.Options{})
	const hang = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hang"}]}`
	as := func(who string) map[string]string {
		return map[string]string{"Authorization": "Bearer key-" + who, "Idempotency-Key": who + "-1"}
	}
	for _, who := range []string{"bob", "carol"} {
		// Each runs on past its client's deadline: the cap of 2 is full.
		if r := h.chat(hang, with(as(who), DeadlineHeader, "50ms")); r.status != http.StatusGatewayTimeout {
			t.Fatalf("%s at the deadline: %d %s", who, r.status, r.body)
		}
	}
	status, got, _, err := h.deadlineAt(st, string(request.PointSent), false, chatBody, as("alice"))
	if err != nil || status != http.StatusOK || !bytes.Contains(got, []byte(`"content":"hi"`)) {
		t.Fatalf("alice, her deadline passing once her answer was out: %d %v %s", status, err, got)
	}
	// Her second call's client leaves (its request's context ends) once
	// its whole answer is out: no deadline, the same rule.
	var sent atomic.Bool
	left := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, leave := context.WithCancel(r.Context())
		defer leave()
		acted := make(chan struct{})
		hk := &request.CallHooks{Left: func() { close(acted) }, At: func(at request.SettlePoint) {
			if at == request.PointSent {
				sent.Store(true)
				leave()
				select { // the call goes on once the handler has acted on it
				case <-acted:
				case <-time.After(requestLimit):
					t.Error("the handler never acted on its client leaving")
				}
			}
		}}
		h.gw.Handler().ServeHTTP(w, r.WithContext(request.WithCallHooks(ctx, hk)))
	}))
	defer left.Close()
	req, _ := http.NewRequest(http.MethodPost, left.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	for k, v := range with(as("alice"), "Idempotency-Key", "alice-2") {
		req.Header.Set(k, v)
	}
	res, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if !sent.Load() {
		t.Fatal("alice's second call never reached the point its whole answer was sent")
	}
	if strings.Contains(h.logs.String(), "too many detached calls") {
		t.Fatalf("a delivered answer's end cancelled a detached call:\n%s", h.logs.String())
	}
	releaseAll()
	h.gw.requests.WaitCalls()
	for _, who := range []string{"bob", "carol"} {
		if r := h.chat(hang, as(who)); r.status != http.StatusOK || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s's retry: %d replayed=%q %s", who, r.status, r.header.Get("Idempotent-Replayed"), r.body)
		}
	}
}
