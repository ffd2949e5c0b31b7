package limits

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/metrics"
)

// fakeStore serves ScanCommitted and ScanOwners from fixed lists per
// scope, or fails.
type fakeStore struct {
	mu         sync.Mutex
	records    map[string][]cache.CommittedRecord
	owners     map[string][]cache.CommittedRecord
	fail       bool
	ownersFail bool
	during     func() // called in the middle of a scan
	scans      atomic.Int64
	// mark is the purge mark (PurgeMark); marks counts its reads.
	mark, marks atomic.Int64
}

func (f *fakeStore) PurgeMark(context.Context, string) (int64, error) {
	f.marks.Add(1)
	return f.mark.Load(), nil
}

func (f *fakeStore) ScanOwners(_ context.Context, scope string, fn func(cache.CommittedRecord) error) error {
	f.mu.Lock()
	entries, fail := f.owners[scope], f.ownersFail
	f.mu.Unlock()
	if fail {
		return errors.New("store down")
	}
	for _, e := range entries {
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeStore) ScanCommitted(_ context.Context, scope string, fn func(cache.CommittedRecord) error) error {
	f.scans.Add(1)
	f.mu.Lock()
	recs, fail, during := f.records[scope], f.fail, f.during
	f.mu.Unlock()
	if fail {
		return errors.New("store down")
	}
	for i, r := range recs {
		if i == 1 && during != nil {
			during()
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

func newLimiter(t *testing.T, cfg config.Config, store Store, clock *storetest.Clock) (*Limiter, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	l := New(Options{Config: cfg, Store: store, Metrics: metrics.New(reg, nil), Now: clock.Now})
	t.Cleanup(l.Close)
	return l, reg
}

func limited(t *testing.T, err error, limit apierror.Limit) *apierror.ClientLimited {
	t.Helper()
	var cl *apierror.ClientLimited
	if !errors.As(err, &cl) || cl.Limit != limit {
		t.Fatalf("err = %v, want a %s limit", err, limit)
	}
	return cl
}

func oneClient(l config.ClientLimits) config.Config {
	return config.Config{Clients: []config.Client{{Name: "alice", Limits: l}, {Name: "bob"}}}
}

// Each replica allows its share: the rate divided by replicas, and
// ceil(burst/replicas), ceil(max_concurrent/replicas) of the rest.
func TestReplicaShares(t *testing.T) {
	clock := storetest.NewClock()
	cfg := oneClient(config.ClientLimits{RequestsPerSecond: 3, Burst: 5, MaxConcurrent: 5})
	cfg.Replicas = 3
	l, _ := newLimiter(t, cfg, nil, clock)
	var slots []*Slot
	for range 2 { // ceil(5/3) = 2 slots and 2 tokens
		s, err := l.Admit("alice")
		if err != nil {
			t.Fatalf("admit: %v", err)
		}
		slots = append(slots, s)
	}
	limited(t, admitOnce(l, "alice"), apierror.LimitConcurrency)
	slots[0].Release()
	slots[0].Release() // a second Release does nothing
	cl := limited(t, admitOnce(l, "alice"), apierror.LimitRate)
	if cl.RetryAfter != time.Second { // 3/3 = 1 token per second
		t.Fatalf("RetryAfter = %v, want 1s", cl.RetryAfter)
	}
	clock.Advance(time.Second)
	s, err := l.Admit("alice")
	if err != nil {
		t.Fatalf("after a second: %v", err)
	}
	limited(t, admitOnce(l, "alice"), apierror.LimitConcurrency)
	s.Release()
	slots[1].Release()
	// bob has no limits; nor has a name that is not configured.
	for _, name := range []string{"bob", "mallory"} {
		for range 10 {
			if s, err := l.Admit(name); err != nil || s != nil {
				t.Fatalf("%s: %v, %v", name, s, err)
			}
		}
	}
}

// A refused concurrency check spends no token.
func TestConcurrencyBeforeRate(t *testing.T) {
	clock := storetest.NewClock()
	l, _ := newLimiter(t, oneClient(config.ClientLimits{RequestsPerSecond: 1, Burst: 2, MaxConcurrent: 1}), nil, clock)
	s, err := l.Admit("alice")
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		limited(t, admitOnce(l, "alice"), apierror.LimitConcurrency)
	}
	s.Release()
	if s, err := l.Admit("alice"); err != nil {
		t.Fatalf("the second token was spent by refused requests: %v", err)
	} else {
		s.Release()
	}
}

// Take moves the hold: the handler's Release after a Take does nothing,
// the taker's Release frees the slot.
func TestSlotTake(t *testing.T) {
	l, _ := newLimiter(t, oneClient(config.ClientLimits{MaxConcurrent: 1}), nil, storetest.NewClock())
	s, _ := l.Admit("alice")
	held := s.Take()
	s.Release()
	limited(t, admitOnce(l, "alice"), apierror.LimitConcurrency)
	if s.Take() != nil {
		t.Fatal("a slot was taken twice")
	}
	held.Release()
	if _, err := l.Admit("alice"); err != nil {
		t.Fatalf("after the taker released: %v", err)
	}
	var none *Slot
	none.Release()
	if none.Take() != nil {
		t.Fatal("nil slot taken")
	}
}

// Stored bytes count from the hour their records expire in until that
// hour is over; Retry-After is when enough of them have dropped off.
func TestStorageHours(t *testing.T) {
	clock := storetest.NewClock() // 12:00
	now := clock.Now()
	store := &fakeStore{records: map[string][]cache.CommittedRecord{"alice": {
		{Size: 400, ExpiresAt: now.Add(30 * time.Minute)}, // hour 12
		{Size: 400, ExpiresAt: now.Add(90 * time.Minute)}, // hour 13
		{Size: 100, ExpiresAt: now.Add(150 * time.Minute)},
	}}}
	l, reg := newLimiter(t, oneClient(config.ClientLimits{MaxStoredBytes: 1000}), store, clock)
	if got := l.StoredBytes("alice"); got != 900 {
		t.Fatalf("counted at start: %d, want 900", got)
	}
	if err := l.CheckStorage("alice"); err != nil {
		t.Fatalf("under the quota: %v", err)
	}
	l.Committed("alice", 100, 3*time.Hour) // hour 15
	cl := limited(t, l.CheckStorage("alice"), apierror.LimitStorage)
	if cl.RetryAfter != time.Hour { // hour 12 is over at 13:00
		t.Fatalf("RetryAfter = %v, want 1h", cl.RetryAfter)
	}
	if v := value(t, reg, "llmgate_client_stored_bytes", ""); v != 1000 {
		t.Fatalf("llmgate_client_stored_bytes = %v", v)
	}
	clock.Advance(time.Hour - time.Nanosecond)
	limited(t, l.CheckStorage("alice"), apierror.LimitStorage)
	clock.Advance(time.Nanosecond)
	if err := l.CheckStorage("alice"); err != nil || l.StoredBytes("alice") != 600 {
		t.Fatalf("after hour 12: %v, %d bytes, want 600", err, l.StoredBytes("alice"))
	}
	clock.Advance(10 * time.Hour)
	if got := l.StoredBytes("alice"); got != 0 {
		t.Fatalf("after every hour passed: %d", got)
	}
}

// With several replicas, a replica weighs its own commits since the count
// as if every replica made as many.
func TestStorageReplicas(t *testing.T) {
	clock := storetest.NewClock()
	store := &fakeStore{records: map[string][]cache.CommittedRecord{"alice": {{Size: 400, ExpiresAt: clock.Now().Add(time.Hour)}}}}
	cfg := oneClient(config.ClientLimits{MaxStoredBytes: 1000})
	cfg.Replicas, cfg.Store.Kind = 3, config.StoreRedis
	l, _ := newLimiter(t, cfg, store, clock)
	l.Committed("alice", 100, time.Hour)
	if got := l.StoredBytes("alice"); got != 700 {
		t.Fatalf("400 counted + 3 × 100 own = %d, want 700", got)
	}
	l.Committed("alice", 100, time.Hour)
	limited(t, l.CheckStorage("alice"), apierror.LimitStorage)
	// The next count sees what every replica committed; own commits made
	// before it began are in it.
	store.records["alice"] = append(store.records["alice"], cache.CommittedRecord{Size: 200, ExpiresAt: clock.Now().Add(time.Hour)})
	if err := l.count(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := l.StoredBytes("alice"); got != 600 {
		t.Fatalf("after a count: %d, want 600", got)
	}
}

// With several replicas, a refusal reads the store's purge mark for the
// client, at most every recountEvery, and counts the client from the
// store only when the mark moved: a purge another replica made stops the
// refusals within seconds, not at the next store.usage_rescan (found by
// the hostile-tenant run: ten minutes of 429s on the replica that did
// not purge), and a client at its quota costs one read per interval, not
// a scan of the store.
func TestStorageRefusalRecountsAfterPurge(t *testing.T) {
	clock := storetest.NewClock()
	store := &fakeStore{records: map[string][]cache.CommittedRecord{"alice": {{Size: 1000, ExpiresAt: clock.Now().Add(time.Hour)}}}}
	cfg := oneClient(config.ClientLimits{MaxStoredBytes: 1000})
	cfg.Replicas, cfg.Store.Kind = 2, config.StoreRedis
	l, _ := newLimiter(t, cfg, store, clock)
	l.recounted = make(chan struct{}, 4)
	scans, marks := store.scans.Load(), store.marks.Load()
	// At the quota, no purge: the mark is read, nothing scanned.
	limited(t, l.CheckStorage("alice"), apierror.LimitStorage)
	<-l.recounted
	limited(t, l.CheckStorage("alice"), apierror.LimitStorage) // within recountEvery: not read again
	if s, m := store.scans.Load()-scans, store.marks.Load()-marks; s != 0 || m != 1 {
		t.Fatalf("%d scans and %d mark reads after two refusals with no purge, want 0 and 1", s, m)
	}
	// Another replica purges her data.
	store.mu.Lock()
	store.records["alice"] = nil
	store.mu.Unlock()
	store.mark.Add(1)
	clock.Advance(recountEvery)
	limited(t, l.CheckStorage("alice"), apierror.LimitStorage)
	<-l.recounted
	if s := store.scans.Load() - scans; s != 1 {
		t.Fatalf("%d scans once the mark moved, want 1", s)
	}
	if err := l.CheckStorage("alice"); err != nil {
		t.Fatalf("after the count that found her data purged: %v", err)
	}
}

// A commit made while a count runs stays counted (perhaps twice, until
// the next count); a purge made while it runs wins over it.
func TestCountRaces(t *testing.T) {
	clock := storetest.NewClock()
	exp := clock.Now().Add(time.Hour)
	store := &fakeStore{records: map[string][]cache.CommittedRecord{"alice": {{Size: 100, ExpiresAt: exp}, {Size: 100, ExpiresAt: exp}}}}
	l, _ := newLimiter(t, oneClient(config.ClientLimits{MaxStoredBytes: 1000}), store, clock)
	store.during = func() { l.Committed("alice", 50, time.Hour) }
	if err := l.count(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := l.StoredBytes("alice"); got != 250 {
		t.Fatalf("commit during a count: %d, want 250", got)
	}
	store.during = func() { l.Forget("alice") }
	if err := l.count(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := l.StoredBytes("alice"); got != 0 {
		t.Fatalf("purge during a count: %d, want 0", got)
	}
}

// The store down at start: the storage limit checks this process's own
// commits alone, and counts each check as failing open, until a count
// succeeds.
func TestStorageFailsOpen(t *testing.T) {
	clock := storetest.NewClock()
	store := &fakeStore{fail: true, records: map[string][]cache.CommittedRecord{"alice": {{Size: 5000, ExpiresAt: clock.Now().Add(time.Hour)}}}}
	l, reg := newLimiter(t, oneClient(config.ClientLimits{MaxStoredBytes: 1000}), store, clock)
	if err := l.CheckStorage("alice"); err != nil {
		t.Fatalf("with the store down at start: %v", err)
	}
	if v := value(t, reg, "llmgate_client_limit_fail_open_total", ""); v != 1 {
		t.Fatalf("fail-open count %v, want 1", v)
	}
	if v := value(t, reg, "llmgate_client_usage_scans_total", "error"); v != 1 {
		t.Fatalf("failed scans %v, want 1", v)
	}
	l.Committed("alice", 1000, time.Hour)
	limited(t, l.CheckStorage("alice"), apierror.LimitStorage)
	store.mu.Lock()
	store.fail = false
	store.records["alice"] = append(store.records["alice"], cache.CommittedRecord{Size: 1000, ExpiresAt: clock.Now().Add(time.Hour)})
	store.mu.Unlock()
	if err := l.count(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := l.StoredBytes("alice"); got != 6000 {
		t.Fatalf("after the store came back: %d, want 6000", got)
	}
	before := value(t, reg, "llmgate_client_limit_fail_open_total", "")
	limited(t, l.CheckStorage("alice"), apierror.LimitStorage)
	if v := value(t, reg, "llmgate_client_limit_fail_open_total", ""); v != before {
		t.Fatal("a check with a count counted as failing open")
	}
}

// Ownership entries count with the records; a count whose records are
// read but whose entries are not keeps what the last count found.
func TestStorageCountsOwners(t *testing.T) {
	clock := storetest.NewClock()
	exp := clock.Now().Add(time.Hour)
	store := &fakeStore{records: map[string][]cache.CommittedRecord{"alice": {{Size: 300, ExpiresAt: exp}}},
		owners: map[string][]cache.CommittedRecord{"alice": {{Size: 80, ExpiresAt: exp}, {Size: 90, ExpiresAt: exp}}}}
	l, _ := newLimiter(t, oneClient(config.ClientLimits{MaxStoredBytes: 1000}), store, clock)
	if got := l.StoredBytes("alice"); got != 470 {
		t.Fatalf("counted %d, want 470 (a record and two entries)", got)
	}
	store.mu.Lock()
	store.ownersFail = true
	store.records["alice"] = nil
	store.mu.Unlock()
	if err := l.count(context.Background()); err == nil {
		t.Fatal("a count whose entries could not be read succeeded")
	}
	if got := l.StoredBytes("alice"); got != 470 {
		t.Fatalf("after a half-failed count: %d, want 470 kept", got)
	}
}

// No client has a storage quota: the store is never read.
func TestNoQuotaNoScan(t *testing.T) {
	store := &fakeStore{}
	newLimiter(t, oneClient(config.ClientLimits{RequestsPerSecond: 1}), store, storetest.NewClock())
	if n := store.scans.Load(); n != 0 {
		t.Fatalf("%d scans without a quota", n)
	}
}

// With no clients configured, client_limits applies to the shared scope.
func TestSharedScope(t *testing.T) {
	l, _ := newLimiter(t, config.Config{ClientLimits: config.ClientLimits{MaxConcurrent: 1}}, nil, storetest.NewClock())
	s, err := l.Admit("")
	if err != nil || s == nil {
		t.Fatalf("admit: %v, %v", s, err)
	}
	limited(t, admitOnce(l, ""), apierror.LimitConcurrency)
}

// admitOnce admits one request of name and gives its slot back at once:
// for the checks that expect a refusal.
func admitOnce(l *Limiter, name string) error {
	s, err := l.Admit(name)
	s.Release()
	return err
}

// value is the value of the series of name in reg whose labels include
// label (any series if label is ""), or -1 when there is none.
func value(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if label == "" || lp.GetValue() == label {
					return m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// BenchmarkCheck is what a keyed request of a client with all three limits
// pays: Admit (concurrency, rate), CheckStorage, and the slot's Release.
func BenchmarkCheck(b *testing.B) {
	l := benchLimiter(b, config.ClientLimits{RequestsPerSecond: 1e9, MaxConcurrent: 1 << 20, MaxStoredBytes: 1 << 40})
	b.ReportAllocs()
	for b.Loop() {
		check(b, l)
	}
}

// BenchmarkCheckParallel is BenchmarkCheck from every P at once, one client.
func BenchmarkCheckParallel(b *testing.B) {
	l := benchLimiter(b, config.ClientLimits{RequestsPerSecond: 1e9, MaxConcurrent: 1 << 20, MaxStoredBytes: 1 << 40})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			check(b, l)
		}
	})
}

// BenchmarkCheckUnlimited is the same for a client without limits.
func BenchmarkCheckUnlimited(b *testing.B) {
	l := benchLimiter(b, config.ClientLimits{})
	b.ReportAllocs()
	for b.Loop() {
		check(b, l)
	}
}

func benchLimiter(b *testing.B, lim config.ClientLimits) *Limiter {
	clock := storetest.NewClock()
	store := &fakeStore{records: map[string][]cache.CommittedRecord{"alice": {{Size: 1000, ExpiresAt: clock.Now().Add(24 * time.Hour)}}}}
	l := New(Options{Config: oneClient(lim), Store: store, Metrics: metrics.New(prometheus.NewRegistry(), nil)})
	b.Cleanup(l.Close)
	return l
}

func check(b *testing.B, l *Limiter) {
	s, err := l.Admit("alice")
	if err == nil {
		err = l.CheckStorage("alice")
	}
	if err != nil {
		b.Fatal(err)
	}
	s.Release()
}
