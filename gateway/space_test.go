package gateway

import (
	"context"
	"errors"
	"fmt"
	"github.com/llmgate/llmgate/gateway/request"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	badgerstore "github.com/llmgate/llmgate/cache/badger"
	"github.com/llmgate/llmgate/cache/storetest"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/apierror"
)

// fullableStore is a real Badger store whose statfs and clock the test
// controls: with free set under 100 MiB and the clock advanced past the
// space interval (1h here, so only the test moves it: a second is enough
// after a write), the store is full.
func fullableStore(t *testing.T) (*badgerstore.Store, *storetest.Clock, *atomic.Int64) {
	t.Helper()
	clock := storetest.NewClock()
	free := new(atomic.Int64)
	free.Store(1 << 30)
	bs, err := badgerstore.Open(badgerstore.Options{Dir: t.TempDir(), Now: clock.Now, After: clock.After,
		MinFreeBytes: 100 << 20, SpaceInterval: time.Hour,
		Statfs: func(string) (uint64, error) { return uint64(free.Load()), nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bs.Close() })
	return bs, clock, free
}

// TestStoreFullState walks a gateway on a real Badger store, whose statfs
// and clock the test controls, through a full disk and back: new keyed
// requests get 503 idempotency_store_full before any claim or upstream
// call, committed keys replay, unkeyed requests pass, /readyz stays 200 and
// says why, the metric says it, and keyed work resumes once there is room.
func TestStoreFullState(t *testing.T) {
	bs, clock, free := fullableStore(t)
	h := newHarnessStore(t, nil, func(Store) Store { return bs }, fakeprovider.Options{})
	key := func(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }

	first := h.chat(chatBody, key("before"))
	if first.status != 200 {
		t.Fatalf("keyed with room: %d %s", first.status, first.body)
	}
	expectSpaceMetric(t, h, "llmgate_store_full 0")

	free.Store(10 << 20)
	clock.Advance(time.Second)
	calls := h.fake.Calls("")
	r := h.chat(chatBody, key("while-full"))
	e := wantOpenAIError(t, r, http.StatusServiceUnavailable)
	if e["code"] != "idempotency_store_full" || e["type"] != "server_error" || r.header.Get("Retry-After") != "30" ||
		r.header.Get("X-Should-Retry") != "false" {
		t.Fatalf("new key while full: %v Retry-After=%q x-should-retry=%q", e, r.header.Get("Retry-After"), r.header.Get("X-Should-Retry"))
	}
	if n := h.fake.Calls(""); n != calls {
		t.Fatalf("a refused keyed request called the upstream (%d calls, was %d)", n, calls)
	}
	if _, err := bs.Get(context.Background(), cache.Key{Endpoint: "/v1/chat/completions", ID: "while-full"}); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("a refused keyed request left a record (claimed before the check?): %v", err)
	}
	if r := h.chat(chatBody, key("before")); r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" || string(r.body) != string(first.body) {
		t.Fatalf("replay while full: %d replayed=%q", r.status, r.header.Get("Idempotent-Replayed"))
	}
	if r := h.chat(chatBody, nil); r.status != 200 {
		t.Fatalf("unkeyed while full: %d %s", r.status, r.body)
	}
	if r := h.chat(chatBody, map[string]string{"X-Llmgate-Cache": "on"}); r.status != 200 {
		t.Fatalf("content-cached while full (served without storing): %d %s", r.status, r.body)
	}
	ready := h.do(http.MethodGet, "/readyz", "", nil)
	if ready.status != 200 || !strings.Contains(string(ready.body), "store full (disk_low") {
		t.Fatalf("/readyz while full: %d %s", ready.status, ready.body)
	}
	expectSpaceMetric(t, h, "llmgate_store_full 1", "llmgate_store_free_bytes 1.048576e+07", "llmgate_store_min_free_bytes 1.048576e+08")

	free.Store(1 << 30)
	clock.Advance(time.Second)
	if r := h.chat(chatBody, key("while-full")); r.status != 200 || r.header.Get("Idempotent-Replayed") == "true" {
		t.Fatalf("keyed after space returned: %d %s", r.status, r.body)
	}
	if ready := h.do(http.MethodGet, "/readyz", "", nil); ready.status != 200 || string(ready.body) != "ready\n" {
		t.Fatalf("/readyz after space returned: %d %s", ready.status, ready.body)
	}
	expectSpaceMetric(t, h, "llmgate_store_full 0")
}

func expectSpaceMetric(t *testing.T, h *harness, lines ...string) {
	t.Helper()
	m := h.admin(http.MethodGet, "/metrics")
	for _, l := range lines {
		if !strings.Contains(string(m.body), "\n"+l+"\n") {
			t.Fatalf("metrics lack %q", l)
		}
	}
}

// TestStoreFullWire: the gateway's refusal and a store's own "full" error
// (cache.ErrFull: a commit below the Badger reserve, Redis at maxmemory)
// reach the client as the same 503; any other store failure stays
// idempotency_store_unavailable.
func TestStoreFullWire(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code string
	}{
		{&apierror.StoreFull{Reason: cache.FullDiskLow, RetryAfter: request.StoreFullRetryAfter}, "idempotency_store_full"},
		{&apierror.StoreUnavailable{Err: fmt.Errorf("commit k: %w", cache.ErrFull)}, "idempotency_store_full"},
		{&apierror.StoreUnavailable{Err: errors.New("connection refused")}, "idempotency_store_unavailable"},
	} {
		e := apierror.Wire(tc.err)
		if e.Status != http.StatusServiceUnavailable || e.Type != "server_error" || e.Code != tc.code || e.RetryAfter <= 0 || e.ShouldRetry {
			t.Errorf("%v: %d %s/%s Retry-After %v x-should-retry %v, want 503 %s", tc.err, e.Status, e.Type, e.Code, e.RetryAfter, e.ShouldRetry, tc.code)
		}
	}
}

// fullStore is a store that reports itself full (max_bytes reached:
// commits still pass) while full is set.
type fullStore struct {
	Store
	full atomic.Bool
}

func (f *fullStore) Space() cache.Space {
	if f.full.Load() {
		return cache.Space{Full: true, Reason: cache.FullOverCap}
	}
	return cache.Space{}
}

// A duplicate of a keyed request in flight, arriving once the store is
// full (max_bytes reached), waits for that call and replays its answer, as any duplicate
// does: waiting stores nothing new. Before, it was refused 503
// idempotency_store_full with x-should-retry: false, giving up on an
// answer already paid for (found by review). If the call it waits for
// ends without an answer, the duplicate may not start another: it gets
// the refusal, and leaves no record.
func TestStoreFullDuplicateOfInFlightWaits(t *testing.T) {
	var fs *fullStore
	var calls atomic.Int32
	arrived, release, stop := make(chan struct{}, 4), make(chan int, 4), make(chan struct{})
	up := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		arrived <- struct{}{}
		status := http.StatusInternalServerError
		select {
		case status = <-release:
		case <-stop: // the test ended early
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if status != 200 {
			fmt.Fprint(w, `{"error":{"message":"bad","type":"invalid_request_error"}}`)
			return
		}
		fmt.Fprint(w, `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(func() { close(stop) }) // before the upstream's Close waits for its handlers
	h := newHarnessStore(t, func(c *config.Config) { c.Upstreams[0].BaseURL = up + "/v1" },
		func(s Store) Store { fs = &fullStore{Store: s}; return fs }, fakeprovider.Options{})
	waits := 0
	duplicateWhileFull := func(key string, status int) (first, dup result) {
		t.Helper()
		hdr := map[string]string{"Idempotency-Key": key}
		a := h.chatAsync(chatBody, hdr)
		<-arrived
		fs.full.Store(true)
		b := h.chatAsync(chatBody, hdr)
		waits++
		want := fmt.Sprintf(`llmgate_idempotency_events_total{event="wait"} %d`, waits)
		deadline := time.Now().Add(requestLimit / 3)
		for !strings.Contains(string(h.admin("GET", "/metrics").body), want) {
			if time.Now().After(deadline) {
				t.Fatal("the duplicate never waited")
			}
			time.Sleep(time.Millisecond) // polling a counter, not synchronising on time
		}
		release <- status
		first, dup = h.await(a), h.await(b)
		fs.full.Store(false)
		return first, dup
	}

	a, b := duplicateWhileFull("in-flight-then-full", 200)
	if a.status != 200 || b.status != 200 || string(b.body) != string(a.body) || b.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("duplicate while full: %d %s (replayed %q), first %d %s", b.status, b.body, b.header.Get("Idempotent-Replayed"), a.status, a.body)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("upstream calls = %d, want 1", n)
	}

	a, b = duplicateWhileFull("in-flight-then-full-fails", http.StatusBadRequest)
	if a.status != http.StatusBadRequest {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	if e := wantOpenAIError(t, b, http.StatusServiceUnavailable); e["code"] != "idempotency_store_full" {
		t.Fatalf("duplicate of a call that ended without an answer, store full: %v", e)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("upstream calls = %d, want 2 (the duplicate started none)", n)
	}
	if _, err := fs.Get(context.Background(), cache.Key{Endpoint: "/v1/chat/completions", ID: "in-flight-then-full-fails"}); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("the refused duplicate left a record: %v", err)
	}
}
