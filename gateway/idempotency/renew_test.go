package idempotency

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	badgerstore "github.com/llmgate/llmgate/cache/badger"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// renewStore counts renewals, and answers them with err.
type renewStore struct {
	Store
	mu      sync.Mutex
	renewed int
	err     error
	// hook, when set, runs as a renewal begins.
	hook func()
}

func (s *renewStore) Renew(context.Context, cache.Key, string, time.Duration) error {
	if s.hook != nil {
		s.hook()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renewed++
	return s.err
}

func (s *renewStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renewed
}

// renewHarness is a Keeper with an hour's lease on a clock the test moves,
// whose renewals run when the test runs them (run).
type renewHarness struct {
	k       *Keeper
	store   *renewStore
	now     time.Time
	pending []func()
}

func newRenewHarness() *renewHarness {
	h := &renewHarness{store: &renewStore{}, now: time.Unix(1_700_000_000, 0)}
	h.k = New(Options{Store: h.store, Metrics: metrics.New(prometheus.NewRegistry(), nil), Lease: time.Hour})
	h.k.renewals.now = func() time.Time { return h.now }
	h.k.renewals.start = func(within time.Duration, f func()) {
		if within != h.k.renewals.tickEvery() {
			panic("a renewal spread over other than a tick")
		}
		h.pending = append(h.pending, f)
	}
	return h
}

func (h *renewHarness) lease(id string) *Lease {
	return &Lease{k: h.k, req: &Request{Key: cache.Key{Scope: "c", Endpoint: "/v1/chat/completions", ID: id}}, owner: "o-" + id}
}

// at moves the clock to d after the start and ticks, then runs the
// renewals the tick started.
func (h *renewHarness) at(d time.Duration) {
	h.now = time.Unix(1_700_000_000, 0).Add(d)
	h.k.renewals.tick()
	h.run()
}

func (h *renewHarness) run() {
	p := h.pending
	h.pending = nil
	for _, f := range p {
		f()
	}
}

func (h *renewHarness) held() int {
	r := h.k.renewals
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.due) + len(r.renewing)
}

// TestRenewalsRenewEachLeaseInTime: one timer renews every lease held, a
// quarter of the lease after its claim and then after each renewal — never
// later than a third, given the tick of a twelfth — and stops with
// StopRenewing; with none held, the timer lapses.
func TestRenewalsRenewEachLeaseInTime(t *testing.T) {
	h := newRenewHarness()
	defer func() { h.k.renewals.timer.Stop() }()
	if got := h.k.renewals.tickEvery(); got != 150*time.Second {
		t.Fatalf("tick every %v, want a 24th of the lease", got)
	}
	a, b := h.lease("a"), h.lease("b")
	a.Renew(context.Background())
	h.at(10 * time.Minute)
	b.Renew(context.Background()) // due at 25 min
	h.at(14 * time.Minute)
	if n := h.store.count(); n != 0 {
		t.Fatalf("%d renewals before a quarter of the lease", n)
	}
	h.at(15 * time.Minute) // a's first renewal
	if n := h.store.count(); n != 1 {
		t.Fatalf("%d renewals at a quarter of a's lease, want 1", n)
	}
	h.at(25 * time.Minute) // b's first
	h.at(30 * time.Minute) // a's second
	if n := h.store.count(); n != 3 {
		t.Fatalf("%d renewals by 30 min, want 3 (a twice, b once)", n)
	}
	a.StopRenewing()
	b.StopRenewing()
	h.at(time.Hour)
	if n := h.store.count(); n != 3 {
		t.Fatalf("renewed after StopRenewing: %d renewals", n)
	}
	if h.held() != 0 || h.k.renewals.armed {
		t.Fatalf("after the last lease: %d held, timer armed %v", h.held(), h.k.renewals.armed)
	}
	// The next lease arms it again.
	c := h.lease("c")
	c.Renew(context.Background())
	if !h.k.renewals.armed {
		t.Fatal("a lease held with no timer armed")
	}
	c.StopRenewing()
}

// TestRenewalStopsWhenLost: a renewal that finds the key no longer the
// lease's (ErrNotOwner), or its call's context ended, renews it no more; a
// renewal started before StopRenewing that runs after it renews nothing.
func TestRenewalStopsWhenLost(t *testing.T) {
	h := newRenewHarness()
	defer func() { h.k.renewals.timer.Stop() }()
	h.store.err = cache.ErrNotOwner
	lost := h.lease("lost")
	lost.Renew(context.Background())
	h.at(15 * time.Minute)
	h.at(45 * time.Minute)
	if n := h.store.count(); n != 1 || h.held() != 0 {
		t.Fatalf("a lost lease: %d renewals, still held %v; want 1, false", n, h.held() != 0)
	}

	h.store.err = nil
	ctx, cancel := context.WithCancel(context.Background())
	ended := h.lease("ended")
	ended.Renew(ctx)
	cancel()
	h.at(time.Hour)
	if n := h.store.count(); n != 1 || h.held() != 0 {
		t.Fatalf("a lease whose call ended: %d renewals, still held %v; want 1, false", n, h.held() != 0)
	}
	ended.StopRenewing()

	late := h.lease("late")
	late.Renew(context.Background())
	h.now = h.now.Add(15 * time.Minute)
	h.k.renewals.tick() // started, not yet run
	if !h.k.renewals.armed {
		t.Fatal("the timer lapsed while a lease was being renewed")
	}
	late.StopRenewing()
	h.run()
	if n := h.store.count(); n != 1 {
		t.Fatalf("a renewal ran after StopRenewing returned: %d renewals", n)
	}
}

// TestStopRenewingWaitsForRenewal: StopRenewing returns only once a
// renewal under way has, so none reaches the store after it (a renewal
// racing the call's commit would find the key no longer in flight).
func TestStopRenewingWaitsForRenewal(t *testing.T) {
	h := newRenewHarness()
	defer func() { h.k.renewals.timer.Stop() }()
	entered, release := make(chan struct{}), make(chan struct{})
	h.store.hook = func() { close(entered); <-release }
	l := h.lease("slow")
	l.Renew(context.Background())
	h.now = h.now.Add(15 * time.Minute)
	h.k.renewals.tick()
	go h.run()
	<-entered
	stopped := make(chan struct{})
	go func() { l.StopRenewing(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("StopRenewing returned while a renewal was under way")
	case <-time.After(50 * time.Millisecond): // a StopRenewing that does not wait returns at once
	}
	close(release)
	<-stopped
	if h.held() != 0 {
		t.Fatal("a stopped lease is still held")
	}
}

// A lease asked whether it was taken (a retry is due) half a lease or more
// after the store last confirmed it — its renewals are overdue: the
// process was stopped or stalled, and they have yet to run — is renewed
// there and then: taken when the store says another owner holds the key,
// held (and confirmed anew) when not. Sooner it is not renewed.
func TestTakenConfirmsAStaleLease(t *testing.T) {
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	h := newRenewHarness()
	l := h.lease("stale")
	l.heldAt = h.now
	l.Renew(context.Background())
	defer l.StopRenewing()

	h.now = h.now.Add(29 * time.Minute)
	if closed(l.Taken()) || h.store.count() != 0 {
		t.Fatalf("within half the lease: taken %v, %d renewals; want neither", closed(l.Taken()), h.store.count())
	}
	h.now = h.now.Add(time.Minute) // half the lease since the claim, no renewal ran
	if closed(l.Taken()) || h.store.count() != 1 {
		t.Fatalf("half a lease after the claim, the store holding it: taken %v, %d renewals; want held, 1", closed(l.Taken()), h.store.count())
	}
	h.now = h.now.Add(15 * time.Minute)
	if l.Taken(); h.store.count() != 1 {
		t.Fatalf("renewed a quarter of a lease ago: %d renewals, want 1 (none more)", h.store.count())
	}
	h.now = h.now.Add(16 * time.Minute)
	h.store.err = cache.ErrNotOwner
	if !closed(l.Taken()) || h.store.count() != 2 {
		t.Fatalf("half a lease after the last renewal, another owner holding it: taken %v, %d renewals; want taken, 2", closed(l.Taken()), h.store.count())
	}
}

// A renewal that reaches the store after the call's own commit or release
// (a tick started it just before; StopRenewing comes after the settling)
// finds the key not its owner's: that is the call's own doing, not a
// takeover. Before, it was counted as taken_over and logged as a failed
// renewal, a false alarm for anyone alerting on it (found by review).
func TestRenewalAfterOwnSettlingIsNoTakeover(t *testing.T) {
	for _, settle := range []string{"commit", "release"} {
		t.Run(settle, func(t *testing.T) {
			st, err := badgerstore.Open(badgerstore.Options{InMemory: true})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			now := time.Unix(1_700_000_000, 0)
			var logs strings.Builder
			reg := prometheus.NewRegistry()
			k := New(Options{Store: st, Metrics: metrics.New(reg, nil), Lease: time.Hour,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			var pending []func()
			k.renewals.now = func() time.Time { return now }
			k.renewals.start = func(_ time.Duration, f func()) { pending = append(pending, f) }
			kr := &Request{Key: cache.Key{Scope: "c", Endpoint: "/v1/chat/completions", ID: "k1"}, Fingerprint: "fp", TTL: time.Hour}
			cl, err := st.Claim(context.Background(), kr.Key, kr.Fingerprint, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			l := &Lease{k: k, req: kr, owner: cl.Owner, heldAt: now}
			l.Renew(context.Background())
			now = now.Add(20 * time.Minute)
			k.renewals.tick() // a renewal is due, and started
			if len(pending) != 1 {
				t.Fatalf("%d renewals started, want 1", len(pending))
			}
			if settle == "commit" {
				if err := l.Commit(context.Background(), &cache.Record{Status: 200, Body: []byte("{}")}); err != nil {
					t.Fatal(err)
				}
			} else {
				l.Release(context.Background())
			}
			pending[0]() // it reaches the store now
			l.StopRenewing()
			if l.TakenOver() || strings.Contains(logs.String(), "renewing idempotency lease failed") {
				t.Fatalf("the call's own %s reported as a takeover; log:\n%s", settle, logs.String())
			}
		})
	}
}

// replayHeldStore holds every replay back as a Redis store with
// WaitReplicas does a record not yet on its replicas.
type replayHeldStore struct{ Store }

func (replayHeldStore) GetReplay(context.Context, cache.Key, string) (*cache.Record, error) {
	return nil, cache.ErrNotReplicated
}

// Lookup (a keyed request that claims nothing: over its quota, no-store)
// reads through the store's GetReplay when it has one, and a record held
// back is the store's error, not a miss that would run the call again
// (found by review: Lookup replayed with a plain Get, past the barrier).
func TestLookupHeldBackIsAnError(t *testing.T) {
	st, err := badgerstore.Open(badgerstore.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	k := New(Options{Store: replayHeldStore{st}, Metrics: metrics.New(prometheus.NewRegistry(), nil), Lease: time.Hour})
	kr := &Request{Key: cache.Key{Scope: "c", Endpoint: "/v1/chat/completions", ID: "k1"}, Fingerprint: "fp", TTL: time.Hour}
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	w := httptest.NewRecorder()
	_, ok, err := k.Lookup(w, r, kr)
	var su *apierror.StoreUnavailable
	if ok || !errors.As(err, &su) || w.Body.Len() != 0 {
		t.Fatalf("Lookup of a held-back record: replayed %v, err %v, wrote %q; want a StoreUnavailable", ok, err, w.Body)
	}
	// A content-cache entry promises nothing: read plainly, a miss.
	kr.Cache = true
	if _, ok, err := k.Lookup(w, r, kr); ok || err != nil {
		t.Fatalf("Lookup of a content-cache entry: replayed %v, err %v; want a miss", ok, err)
	}
}

// A key another owner took while the call ran, found by the call's
// commit rather than by a renewal, is a takeover as a renewal's finding
// is: counted taken_over (not store_error) and reported by TakenOver.
func TestCommitFindingTheKeyTakenIsATakeover(t *testing.T) {
	st, err := badgerstore.Open(badgerstore.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := metrics.New(prometheus.NewRegistry(), nil)
	k := New(Options{Store: st, Metrics: m, Lease: time.Hour})
	kr := &Request{Key: cache.Key{Scope: "c", Endpoint: "/v1/chat/completions", ID: "k1"}, Fingerprint: "fp", TTL: time.Hour}
	ctx := context.Background()
	cl, err := st.Claim(ctx, kr.Key, kr.Fingerprint, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	l := &Lease{k: k, req: kr, owner: cl.Owner}
	// An operator deletes the key and a retry claims it: another owner.
	if err := st.Delete(ctx, kr.Key); err != nil {
		t.Fatal(err)
	}
	if c, err := st.Claim(ctx, kr.Key, kr.Fingerprint, time.Hour); err != nil || c.Status != cache.Claimed {
		t.Fatalf("the retry's claim: %+v %v", c, err)
	}
	if err := l.Commit(ctx, &cache.Record{Status: 200, Body: []byte("{}")}); err == nil {
		t.Fatal("a commit under a key another owner holds succeeded")
	}
	got := m.IdemCounts()
	if !l.TakenOver() || got["taken_over"] != 1 || got["store_error"] != 0 {
		t.Fatalf("TakenOver %v, events %v; want a takeover counted once, no store error", l.TakenOver(), got)
	}
}
