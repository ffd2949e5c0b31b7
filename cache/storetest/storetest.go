// Package storetest is the behaviour every idempotency store must share:
// Run exercises a store through the cache contract, and the Badger and
// Redis stores' tests call it with their own constructor. It also holds the
// fixtures those tests share: a fake clock, sample records, and a record
// comparison.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
)

// Store is what Run exercises: the methods the Badger and Redis stores
// share.
type Store interface {
	Claim(ctx context.Context, k cache.Key, fingerprint string, lease time.Duration) (cache.Claim, error)
	Renew(ctx context.Context, k cache.Key, owner string, lease time.Duration) error
	Commit(ctx context.Context, k cache.Key, owner string, rec *cache.Record, ttl time.Duration) error
	Release(ctx context.Context, k cache.Key, owner string) error
	Wait(ctx context.Context, k cache.Key) error
	Get(ctx context.Context, k cache.Key) (*cache.Record, error)
	Delete(ctx context.Context, k cache.Key) error
	PutDeadLetter(ctx context.Context, k cache.Key, d *cache.DeadLetter, ttl time.Duration) error
	GetDeadLetter(ctx context.Context, id string) (*cache.DeadLetter, error)
	DeleteDeadLetter(ctx context.Context, id string) error
	ListDeadLetters(ctx context.Context, f cache.DeadLetterFilter) ([]cache.DeadLetter, error)
	ScanCommitted(ctx context.Context, scope string, fn func(cache.CommittedRecord) error) error
	PurgeScope(ctx context.Context, scope string) (cache.Purged, error)
}

// Observed is a store under test plus what Run needs to watch it from
// outside. Run's open should return one: the cases that wait for a Wait
// call to block need Blocked signalled.
type Observed struct {
	Store
	// Blocked receives each time a Wait call is about to block; the store's
	// test wires its hook to SignalBlocked.
	Blocked chan struct{}
	// TTL, if set, returns the store's own expiry of k's record (Redis's
	// PTTL). Run then checks that an in-flight record outlives its lease by
	// at most Grace, and a committed one lives about its ttl.
	TTL   func(k cache.Key) time.Duration
	Grace time.Duration
}

// NewObserved wraps s; the caller wires s's Wait hook to SignalBlocked.
func NewObserved(s Store) *Observed {
	return &Observed{Store: s, Blocked: make(chan struct{}, 1024)}
}

// SignalBlocked is the hook a store calls when Wait is about to block.
func (o *Observed) SignalBlocked() {
	select {
	case o.Blocked <- struct{}{}:
	default:
	}
}

var (
	ctx    = context.Background()
	chatEP = "/v1/chat/completions"
	key1   = cache.Key{Scope: "acme", Endpoint: chatEP, ID: "key-1"}
)

const (
	lease = 30 * time.Second
	ttl   = 24 * time.Hour
)

// Run runs the behaviour every store must share, each case in a subtest on
// a fresh, empty store. open returns that store on the given clock, closed
// when t ends; it should return an *Observed (see Observed).
func Run(t *testing.T, open func(t *testing.T, now func() time.Time) Store) {
	runClaimRace(t, open)
	runCommitReplay(t, open)
	runNotOwner(t, open)
	runLeaseExpiry(t, open)
	runMismatch(t, open)
	runWaitWoken(t, open)
	runWaitNotInFlight(t, open)
	runWaitCancel(t, open)
	runWaitNoMissedWakeup(t, open)
	runTenantScoping(t, open)
	runManyKeys(t, open)
	runDelete(t, open)
	runTTL(t, open)
	runDeadLetters(t, open)
	runScanCommitted(t, open)
	runPurgeScope(t, open)
	runInvalidArguments(t, open)
}

// opener is Run's open: it returns a fresh, empty store on the given clock.
type opener = func(t *testing.T, now func() time.Time) Store

// setup opens a fresh store on a new fake clock, wrapped in an Observed if
// open did not return one.
func setup(t *testing.T, open opener) (*Observed, *Clock) {
	t.Helper()
	clock := NewClock()
	s := open(t, clock.Now)
	o, ok := s.(*Observed)
	if !ok {
		o = NewObserved(s)
	}
	return o, clock
}

// claim claims k with fp and fails t unless the claim's status is want.
func claim(t *testing.T, s Store, k cache.Key, fp string, want cache.ClaimStatus) cache.Claim {
	t.Helper()
	c, err := s.Claim(ctx, k, fp, lease)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if c.Status != want {
		t.Fatalf("Claim status = %v, want %v (record %+v)", c.Status, want, c.Record)
	}
	return c
}

// startWait runs Wait in a goroutine and returns once it blocks.
func startWait(t *testing.T, s *Observed, wctx context.Context, k cache.Key) <-chan error {
	t.Helper()
	res := make(chan error, 1)
	go func() { res <- s.Wait(wctx, k) }()
	select {
	case <-s.Blocked:
	case err := <-res:
		t.Fatalf("Wait returned %v instead of blocking", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not block within 10s (does the store signal Observed.Blocked?)")
	}
	return res
}

// commitAs claims and commits rec under k, and returns the record as
// stored (its fingerprint set), for StoredSize.
func commitAs(t *testing.T, s Store, k cache.Key, rec *cache.Record, ttl time.Duration) *cache.Record {
	t.Helper()
	c := claim(t, s, k, "fp-"+k.ID, cache.Claimed)
	if err := s.Commit(ctx, k, c.Owner, rec, ttl); err != nil {
		t.Fatalf("Commit(%v): %v", k, err)
	}
	rec.Fingerprint = "fp-" + k.ID
	return rec
}

// scan counts the committed records ScanCommitted reports for scope.
func scan(t *testing.T, s Store, scope string) map[cache.CommittedRecord]int {
	t.Helper()
	got := map[cache.CommittedRecord]int{}
	if err := s.ScanCommitted(ctx, scope, func(r cache.CommittedRecord) error { got[r]++; return nil }); err != nil {
		t.Fatalf("ScanCommitted(%q): %v", scope, err)
	}
	return got
}

// Scopes whose storage keys a careless prefix or pattern would mix up.
var neighbours = []string{"acme2", "", "ac*", "acme:x"}

// runClaimRace checks that of many concurrent claims of one key, exactly one
// wins.
func runClaimRace(t *testing.T, open opener) {
	t.Run("claim race", func(t *testing.T) {
		s, _ := setup(t, open)
		const n = 64
		var wg sync.WaitGroup
		results := make([]cache.Claim, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() { results[i], errs[i] = s.Claim(ctx, key1, "fp", lease) })
		}
		wg.Wait()
		counts := map[cache.ClaimStatus]int{}
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("Claim %d: %v", i, errs[i])
			}
			counts[results[i].Status]++
		}
		if counts[cache.Claimed] != 1 || counts[cache.Busy] != n-1 {
			t.Fatalf("claims = %v, want 1 claimed and %d busy", counts, n-1)
		}
	})
}

// runCommitReplay checks that a committed record, JSON or stream, is stored
// as given and replayed to the next claim with the same fingerprint.
func runCommitReplay(t *testing.T, open opener) {
	for name, newRec := range map[string]func() *cache.Record{"json": JSONRecord, "stream": StreamRecord} {
		t.Run("commit replay "+name, func(t *testing.T) {
			s, clock := setup(t, open)
			fp := "fp-" + name
			c := claim(t, s, key1, fp, cache.Claimed)
			if s.TTL != nil {
				if d := s.TTL(key1); d <= lease || d > lease+s.Grace {
					t.Fatalf("in-flight TTL = %v, want in (%v, %v]", d, lease, lease+s.Grace)
				}
			}
			clock.Advance(2 * time.Second)
			at := clock.Now()
			rec := newRec()
			if err := s.Commit(ctx, key1, c.Owner, rec, ttl); err != nil {
				t.Fatalf("Commit: %v", err)
			}
			if !reflect.DeepEqual(rec, newRec()) {
				t.Fatal("Commit modified the caller's record")
			}
			want := newRec()
			want.State, want.Fingerprint = cache.Committed, fp
			want.CreatedAt, want.ExpiresAt = at, at.Add(ttl)

			got, err := s.Get(ctx, key1)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			AssertSameRecord(t, got, want)
			if got.Owner != "" || !got.LeaseUntil.IsZero() {
				t.Fatalf("committed record keeps owner %q lease %v", got.Owner, got.LeaseUntil)
			}
			if len(got.Events) != len(want.Events) {
				t.Fatalf("%d events, want %d", len(got.Events), len(want.Events))
			}
			for i := range want.Events {
				if !bytes.Equal(got.Events[i], want.Events[i]) {
					t.Fatalf("event %d = %q, want %q", i, got.Events[i], want.Events[i])
				}
			}
			if !bytes.Equal(got.Body, want.Body) {
				t.Fatalf("body = %q, want %q", got.Body, want.Body)
			}
			if s.TTL != nil {
				if d := s.TTL(key1); d <= ttl-time.Minute || d > ttl {
					t.Fatalf("committed TTL = %v, want about %v", d, ttl)
				}
			}
			replay := claim(t, s, key1, fp, cache.Done)
			AssertSameRecord(t, replay.Record, want)
		})
	}
}

// runNotOwner checks that only the current owner commits, releases or
// renews.
func runNotOwner(t *testing.T, open opener) {
	t.Run("not owner", func(t *testing.T) {
		s, clock := setup(t, open)
		if err := s.Commit(ctx, key1, "nobody", JSONRecord(), ttl); !errors.Is(err, cache.ErrNotOwner) {
			t.Fatalf("Commit of absent key: %v, want cache.ErrNotOwner", err)
		}
		c := claim(t, s, key1, "fp", cache.Claimed)
		for name, err := range map[string]error{
			"commit":  s.Commit(ctx, key1, "other", JSONRecord(), ttl),
			"release": s.Release(ctx, key1, "other"),
			"renew":   s.Renew(ctx, key1, "other", lease),
			"empty":   s.Release(ctx, key1, ""),
		} {
			if !errors.Is(err, cache.ErrNotOwner) {
				t.Errorf("%s by a non-owner: %v, want cache.ErrNotOwner", name, err)
			}
		}
		clock.Advance(lease)
		c2 := claim(t, s, key1, "fp", cache.Claimed)
		if c2.Owner == c.Owner {
			t.Fatal("takeover kept the old owner token")
		}
		if err := s.Renew(ctx, key1, c.Owner, lease); !errors.Is(err, cache.ErrNotOwner) {
			t.Fatalf("old owner's Renew after takeover: %v", err)
		}
		if err := s.Commit(ctx, key1, c.Owner, JSONRecord(), ttl); !errors.Is(err, cache.ErrNotOwner) {
			t.Fatalf("old owner's Commit after takeover: %v", err)
		}
		if err := s.Release(ctx, key1, c.Owner); !errors.Is(err, cache.ErrNotOwner) {
			t.Fatalf("old owner's Release after takeover: %v", err)
		}
		if err := s.Commit(ctx, key1, c2.Owner, JSONRecord(), ttl); err != nil {
			t.Fatalf("new owner's Commit: %v", err)
		}
		if err := s.Release(ctx, key1, c2.Owner); !errors.Is(err, cache.ErrNotOwner) {
			t.Fatalf("Release after Commit: %v", err)
		}
		if err := s.Commit(ctx, key1, c2.Owner, JSONRecord(), ttl); !errors.Is(err, cache.ErrNotOwner) {
			t.Fatalf("second Commit: %v", err)
		}
		if err := s.Renew(ctx, key1, c2.Owner, lease); !errors.Is(err, cache.ErrNotOwner) {
			t.Fatalf("Renew after Commit: %v", err)
		}
	})
}

// runLeaseExpiry checks that a lease that runs out is taken over; one
// renewed is not.
func runLeaseExpiry(t *testing.T, open opener) {
	t.Run("lease expiry takeover", func(t *testing.T) {
		s, clock := setup(t, open)
		c := claim(t, s, key1, "fp", cache.Claimed)
		clock.Advance(lease - time.Second)
		busy := claim(t, s, key1, "fp", cache.Busy)
		if busy.Record.State != cache.InFlight || !busy.Record.LeaseUntil.Equal(clock.Now().Add(time.Second)) {
			t.Fatalf("busy record = %+v", busy.Record)
		}
		if err := s.Renew(ctx, key1, c.Owner, lease); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		got, err := s.Get(ctx, key1)
		if err != nil || !got.LeaseUntil.Equal(clock.Now().Add(lease)) {
			t.Fatalf("Get after Renew: %+v, %v; want lease until %v", got, err, clock.Now().Add(lease))
		}
		clock.Advance(lease - time.Nanosecond)
		claim(t, s, key1, "fp", cache.Busy)
		clock.Advance(time.Nanosecond)
		taken := claim(t, s, key1, "fp", cache.Claimed)
		if taken.Owner == c.Owner {
			t.Fatal("takeover kept the old owner token")
		}
		// A lease that ran out is still renewed if nobody took it over.
		clock.Advance(2 * lease)
		if err := s.Renew(ctx, key1, taken.Owner, lease); err != nil {
			t.Fatalf("Renew of a lapsed lease: %v", err)
		}
		claim(t, s, key1, "fp", cache.Busy)
	})
}

// runMismatch checks that another body under the same key is a mismatch, in
// flight or committed.
func runMismatch(t *testing.T, open opener) {
	t.Run("mismatch", func(t *testing.T) {
		s, _ := setup(t, open)
		c := claim(t, s, key1, "fp-a", cache.Claimed)
		m := claim(t, s, key1, "fp-b", cache.Mismatch)
		if m.Record == nil || m.Record.State != cache.InFlight || m.Record.Fingerprint != "fp-a" {
			t.Fatalf("mismatch while in flight: record %+v", m.Record)
		}
		if err := s.Commit(ctx, key1, c.Owner, JSONRecord(), ttl); err != nil {
			t.Fatal(err)
		}
		m = claim(t, s, key1, "fp-b", cache.Mismatch)
		if m.Record == nil || m.Record.State != cache.Committed || m.Record.Fingerprint != "fp-a" {
			t.Fatalf("mismatch after commit: record %+v", m.Record)
		}
	})
}

// runWaitWoken checks that a blocked Wait returns once the key is committed,
// released or deleted.
func runWaitWoken(t *testing.T, open opener) {
	wakers := map[string]func(s Store, owner string) error{
		"commit":  func(s Store, owner string) error { return s.Commit(ctx, key1, owner, JSONRecord(), ttl) },
		"release": func(s Store, owner string) error { return s.Release(ctx, key1, owner) },
		"delete":  func(s Store, _ string) error { return s.Delete(ctx, key1) },
	}
	for name, wake := range wakers {
		t.Run("wait woken by "+name, func(t *testing.T) {
			s, _ := setup(t, open)
			c := claim(t, s, key1, "fp", cache.Claimed)
			res := startWait(t, s, ctx, key1)
			if err := wake(s, c.Owner); err != nil {
				t.Fatal(err)
			}
			if err := waitResult(t, res); err != nil {
				t.Fatalf("Wait: %v", err)
			}
		})
	}
}

// runWaitNotInFlight checks that Wait does not block on a key that is not in
// flight.
func runWaitNotInFlight(t *testing.T, open opener) {
	t.Run("wait returns at once when not in flight", func(t *testing.T) {
		s, clock := setup(t, open)
		if err := s.Wait(ctx, key1); err != nil {
			t.Fatalf("Wait on absent key: %v", err)
		}
		claim(t, s, key1, "fp", cache.Claimed)
		clock.Advance(lease)
		if err := s.Wait(ctx, key1); err != nil {
			t.Fatalf("Wait on an expired lease: %v", err)
		}
		c := claim(t, s, key1, "fp", cache.Claimed)
		if err := s.Commit(ctx, key1, c.Owner, JSONRecord(), ttl); err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(ctx, key1); err != nil {
			t.Fatalf("Wait on committed key: %v", err)
		}
		if len(s.Blocked) != 0 {
			t.Fatal("Wait blocked although the key was not in flight")
		}
	})
}

// runWaitCancel checks that Wait returns the context's error once it is
// done.
func runWaitCancel(t *testing.T, open opener) {
	t.Run("wait ctx cancel", func(t *testing.T) {
		s, _ := setup(t, open)
		claim(t, s, key1, "fp", cache.Claimed)
		wctx, cancel := context.WithCancel(ctx)
		res := startWait(t, s, wctx, key1)
		cancel()
		if err := waitResult(t, res); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait after cancel: %v, want context.Canceled", err)
		}
		if err := s.Wait(wctx, key1); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait with a done ctx: %v", err)
		}
	})
}

// runWaitNoMissedWakeup checks that a commit racing with a waiter's Claim →
// Wait never leaves the waiter blocked (it would hit waitResult's 10s guard:
// the lease is 30s and the fake clock does not move).
func runWaitNoMissedWakeup(t *testing.T, open opener) {
	t.Run("wait no missed wakeup", func(t *testing.T) {
		s, _ := setup(t, open)
		for i := range 50 {
			k := cache.Key{Endpoint: chatEP, ID: fmt.Sprintf("race-%d", i)}
			c := claim(t, s, k, "fp", cache.Claimed)
			res := make(chan error, 1)
			go func() {
				for {
					cl, err := s.Claim(ctx, k, "fp", lease)
					if err != nil || cl.Status == cache.Done {
						res <- err
						return
					}
					if err := s.Wait(ctx, k); err != nil {
						res <- err
						return
					}
				}
			}()
			if err := s.Commit(ctx, k, c.Owner, JSONRecord(), ttl); err != nil {
				t.Fatal(err)
			}
			if err := waitResult(t, res); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
	})
}

// runTenantScoping checks that the same id in another scope or endpoint is
// another key.
func runTenantScoping(t *testing.T, open opener) {
	t.Run("tenant scoping", func(t *testing.T) {
		s, _ := setup(t, open)
		a := cache.Key{Scope: "acme", Endpoint: chatEP, ID: "same-id"}
		b := cache.Key{Scope: "globex", Endpoint: chatEP, ID: "same-id"}
		shared := cache.Key{Endpoint: chatEP, ID: "same-id"}
		embed := cache.Key{Scope: "acme", Endpoint: "/v1/embeddings", ID: "same-id"}
		ca := claim(t, s, a, "fp-a", cache.Claimed)
		cb := claim(t, s, b, "fp-b", cache.Claimed)
		claim(t, s, shared, "fp-c", cache.Claimed)
		claim(t, s, embed, "fp-d", cache.Claimed)
		if err := s.Commit(ctx, a, ca.Owner, JSONRecord(), ttl); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, b, ca.Owner, JSONRecord(), ttl); !errors.Is(err, cache.ErrNotOwner) {
			t.Fatalf("Commit of another scope's key with this owner: %v", err)
		}
		if got, err := s.Get(ctx, b); err != nil || got.State != cache.InFlight || got.Fingerprint != "fp-b" {
			t.Fatalf("other scope's record = %+v, %v", got, err)
		}
		if err := s.Delete(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, b, cb.Owner); err != nil {
			t.Fatalf("Release in the other scope: %v", err)
		}
		for _, k := range []cache.Key{a, b} {
			if _, err := s.Get(ctx, k); !errors.Is(err, cache.ErrNotFound) {
				t.Fatalf("Get(%v) after its Delete or Release: %v, want cache.ErrNotFound", k, err)
			}
		}
		for k, fp := range map[cache.Key]string{shared: "fp-c", embed: "fp-d"} {
			if got, err := s.Get(ctx, k); err != nil || got.State != cache.InFlight || got.Fingerprint != fp {
				t.Fatalf("Get(%v) = %+v, %v; want in flight with %s", k, got, err, fp)
			}
		}
	})
}

// runManyKeys checks that keys of one scope keep their own state and expire
// on their own.
func runManyKeys(t *testing.T, open opener) {
	t.Run("many keys in a scope", func(t *testing.T) {
		s, clock := setup(t, open)
		for _, id := range []string{"k3", "k1", "k0", "k2", "k4"} {
			k := cache.Key{Scope: "acme", Endpoint: chatEP, ID: id}
			c := claim(t, s, k, "fp", cache.Claimed)
			if id < "k3" {
				if err := s.Commit(ctx, k, c.Owner, JSONRecord(), ttl); err != nil {
					t.Fatal(err)
				}
			}
		}
		claim(t, s, cache.Key{Scope: "acme", Endpoint: "/v1/completions", ID: "k0"}, "fp-z", cache.Claimed)
		claim(t, s, cache.Key{Scope: "acme2", Endpoint: chatEP, ID: "k0"}, "fp-x", cache.Claimed)
		check := func(t *testing.T, afterTTL bool) {
			t.Helper()
			for i := range 5 {
				k := cache.Key{Scope: "acme", Endpoint: chatEP, ID: fmt.Sprintf("k%d", i)}
				got, err := s.Get(ctx, k)
				if i < 3 && afterTTL {
					if !errors.Is(err, cache.ErrNotFound) {
						t.Fatalf("Get(%v) after its ttl: %+v, %v; want cache.ErrNotFound", k, got, err)
					}
					continue
				}
				wantState, wantSize := cache.InFlight, 0
				if i < 3 {
					wantState, wantSize = cache.Committed, len(JSONRecord().Body)
				}
				if err != nil || got.State != wantState || got.Size() != wantSize || got.Fingerprint != "fp" {
					t.Fatalf("Get(%v) = %+v, %v; want state %v size %d", k, got, err, wantState, wantSize)
				}
			}
			for k, fp := range map[cache.Key]string{
				{Scope: "acme", Endpoint: "/v1/completions", ID: "k0"}: "fp-z",
				{Scope: "acme2", Endpoint: chatEP, ID: "k0"}:           "fp-x",
			} {
				if got, err := s.Get(ctx, k); err != nil || got.State != cache.InFlight || got.Fingerprint != fp {
					t.Fatalf("Get(%v) = %+v, %v; want in flight with %s", k, got, err, fp)
				}
			}
		}
		check(t, false)
		clock.Advance(ttl)
		check(t, true)
	})
}

// runDelete checks that a deleted key is absent and can be claimed afresh.
func runDelete(t *testing.T, open opener) {
	t.Run("delete", func(t *testing.T) {
		s, _ := setup(t, open)
		if err := s.Delete(ctx, key1); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("Delete absent: %v, want cache.ErrNotFound", err)
		}
		c := claim(t, s, key1, "fp", cache.Claimed)
		if err := s.Commit(ctx, key1, c.Owner, JSONRecord(), ttl); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, key1); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, err := s.Get(ctx, key1); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("Get after Delete: %v", err)
		}
		claim(t, s, key1, "another-fp", cache.Claimed)
	})
}

// runTTL checks that a committed record lives exactly its ttl by the store's
// clock.
func runTTL(t *testing.T, open opener) {
	t.Run("ttl", func(t *testing.T) {
		s, clock := setup(t, open)
		c := claim(t, s, key1, "fp", cache.Claimed)
		const short = 90 * time.Second
		if err := s.Commit(ctx, key1, c.Owner, JSONRecord(), short); err != nil {
			t.Fatal(err)
		}
		if s.TTL != nil {
			if d := s.TTL(key1); d <= short-10*time.Second || d > short {
				t.Fatalf("real TTL = %v, want about %v", d, short)
			}
		}
		got, err := s.Get(ctx, key1)
		if err != nil || !got.ExpiresAt.Equal(clock.Now().Add(short)) {
			t.Fatalf("Get = %+v, %v; want ExpiresAt %v", got, err, clock.Now().Add(short))
		}
		clock.Advance(short - time.Nanosecond)
		if _, err := s.Get(ctx, key1); err != nil {
			t.Fatalf("Get just before expiry: %v", err)
		}
		claim(t, s, key1, "fp", cache.Done)
		clock.Advance(time.Nanosecond)
		if _, err := s.Get(ctx, key1); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("Get at expiry: %v, want cache.ErrNotFound", err)
		}
		// Expired means absent: the key can be claimed afresh, with any body.
		claim(t, s, key1, "another-fp", cache.Claimed)
	})
}

// runDeadLetters checks that dead letters merge per key, list by filter
// without their bodies, delete, and expire.
func runDeadLetters(t *testing.T, open opener) {
	t.Run("dead letters", func(t *testing.T) {
		s, clock := setup(t, open)
		first := clock.Now()
		k2 := cache.Key{Scope: "globex", Endpoint: chatEP, ID: "key-2"}
		put := func(k cache.Key, d cache.DeadLetter) cache.DeadLetter {
			t.Helper()
			d.LastAt = clock.Now()
			if d.FirstAt.IsZero() {
				d.FirstAt = d.LastAt
			}
			if err := s.PutDeadLetter(ctx, k, &d, time.Hour); err != nil {
				t.Fatalf("PutDeadLetter: %v", err)
			}
			return d
		}
		d1 := put(key1, cache.DeadLetter{Body: []byte(`{"model":"m"}`), Upstreams: []string{"openai"}, Class: "transient", Attempts: 3, Message: "502"})
		if d1.ID != cache.DeadLetterID(key1) || d1.Client != "acme" || d1.Key != "key-1" || d1.Failures != 1 {
			t.Fatalf("first put = %+v", d1)
		}
		clock.Advance(time.Minute)
		d1 = put(key1, cache.DeadLetter{Body: []byte(`{"model":"m2"}`), Upstreams: []string{"openai", "azure"}, Class: "open", Attempts: 1, Message: "breaker"})
		if d1.Failures != 2 || !d1.FirstAt.Equal(first) || !d1.LastAt.Equal(clock.Now()) {
			t.Fatalf("merged = failures %d first %v last %v; want 2, %v, %v", d1.Failures, d1.FirstAt, d1.LastAt, first, clock.Now())
		}
		clock.Advance(time.Minute)
		d2 := put(k2, cache.DeadLetter{Upstreams: []string{"azure"}, Class: "transient"})

		got, err := s.GetDeadLetter(ctx, d1.ID)
		if err != nil || string(got.Body) != `{"model":"m2"}` || got.Failures != 2 || got.Class != "open" {
			t.Fatalf("GetDeadLetter = %+v, %v", got, err)
		}
		for _, tc := range []struct {
			f    cache.DeadLetterFilter
			want []string
		}{
			{cache.DeadLetterFilter{}, []string{d2.ID, d1.ID}},
			{cache.DeadLetterFilter{Upstream: "openai"}, []string{d1.ID}},
			{cache.DeadLetterFilter{Upstream: "azure"}, []string{d2.ID, d1.ID}},
			{cache.DeadLetterFilter{Class: "transient"}, []string{d2.ID}},
			{cache.DeadLetterFilter{Client: "acme"}, []string{d1.ID}},
			{cache.DeadLetterFilter{Client: "nobody"}, nil},
		} {
			assertDeadLetterIDs(t, s, tc.f, tc.want)
		}
		if err := s.DeleteDeadLetter(ctx, d1.ID); err != nil {
			t.Fatalf("DeleteDeadLetter: %v", err)
		}
		if _, err := s.GetDeadLetter(ctx, d1.ID); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("GetDeadLetter after delete: %v", err)
		}
		if err := s.DeleteDeadLetter(ctx, d1.ID); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("second DeleteDeadLetter: %v, want cache.ErrNotFound", err)
		}
		// After a delete the next failure starts afresh.
		if d := put(key1, cache.DeadLetter{Class: "transient"}); d.Failures != 1 {
			t.Fatalf("put after delete: failures %d", d.Failures)
		}
		clock.Advance(time.Hour)
		if list, _ := s.ListDeadLetters(ctx, cache.DeadLetterFilter{}); len(list) != 0 {
			t.Fatalf("expired dead letters listed: %+v", list)
		}
		if _, err := s.GetDeadLetter(ctx, d2.ID); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("GetDeadLetter of an expired one: %v", err)
		}
	})
}

// assertDeadLetterIDs checks that ListDeadLetters(f) lists the letters
// want, in that order, without their bodies.
func assertDeadLetterIDs(t *testing.T, s Store, f cache.DeadLetterFilter, want []string) {
	t.Helper()
	list, err := s.ListDeadLetters(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range list {
		ids = append(ids, d.ID)
		if d.Body != nil {
			t.Fatalf("listed dead letter keeps its body: %+v", d)
		}
	}
	if !reflect.DeepEqual(ids, want) {
		t.Fatalf("ListDeadLetters(%+v) = %v, want %v", f, ids, want)
	}
}

// runScanCommitted checks that ScanCommitted reports exactly one scope's
// live committed records.
func runScanCommitted(t *testing.T, open opener) {
	t.Run("scan committed", func(t *testing.T) {
		s, clock := setup(t, open)
		if got := scan(t, s, "acme"); len(got) != 0 {
			t.Fatalf("empty store: %v", got)
		}
		at := clock.Now()
		big := JSONRecord()
		big.Body = bytes.Repeat([]byte("x"), 5000)
		want := map[cache.CommittedRecord]int{}
		for _, c := range []struct {
			k   cache.Key
			rec *cache.Record
			ttl time.Duration
		}{
			{cache.Key{Scope: "acme", Endpoint: chatEP, ID: "json"}, JSONRecord(), ttl},
			{cache.Key{Scope: "acme", Endpoint: chatEP, ID: "stream"}, StreamRecord(), time.Hour},
			{cache.Key{Scope: "acme", Endpoint: "/v1/embeddings", ID: "big"}, big, 2 * time.Hour},
			{cache.Key{Scope: "acme", Endpoint: chatEP, ID: "again"}, JSONRecord(), ttl},
		} {
			r := commitAs(t, s, c.k, c.rec, c.ttl)
			want[cache.CommittedRecord{Size: r.StoredSize(), ExpiresAt: at.Add(c.ttl)}]++
		}
		claim(t, s, cache.Key{Scope: "acme", Endpoint: chatEP, ID: "in-flight"}, "fp", cache.Claimed)
		for _, sc := range neighbours {
			commitAs(t, s, cache.Key{Scope: sc, Endpoint: chatEP, ID: "json"}, JSONRecord(), ttl)
		}
		if got := scan(t, s, "acme"); !reflect.DeepEqual(got, want) {
			t.Fatalf("ScanCommitted(acme) = %v, want %v", got, want)
		}
		for _, sc := range neighbours {
			r := JSONRecord()
			r.Fingerprint = "fp-json"
			if got := scan(t, s, sc); len(got) != 1 || got[cache.CommittedRecord{Size: r.StoredSize(), ExpiresAt: at.Add(ttl)}] != 1 {
				t.Fatalf("ScanCommitted(%q) = %v, want its one record", sc, got)
			}
		}
		stop := errors.New("stop")
		calls := 0
		if err := s.ScanCommitted(ctx, "acme", func(cache.CommittedRecord) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
			t.Fatalf("ScanCommitted with fn failing: %v after %d calls, want stop after 1", err, calls)
		}
		// Expired by the store's clock: no longer reported.
		clock.Advance(time.Hour)
		for r := range want {
			if !r.ExpiresAt.After(clock.Now()) {
				delete(want, r)
			}
		}
		if got := scan(t, s, "acme"); !reflect.DeepEqual(got, want) || len(want) != 3 {
			t.Fatalf("ScanCommitted(acme) an hour later = %v, want %v", got, want)
		}
	})
}

// runPurgeScope checks that PurgeScope removes one scope's records,
// in-flight claims and dead letters, and wakes its waiters.
func runPurgeScope(t *testing.T, open opener) {
	t.Run("purge scope", func(t *testing.T) {
		s, _ := setup(t, open)
		if p, err := s.PurgeScope(ctx, "acme"); err != nil || p != (cache.Purged{}) {
			t.Fatalf("PurgeScope of an empty store = %+v, %v", p, err)
		}
		mine := []cache.Key{
			{Scope: "acme", Endpoint: chatEP, ID: "a"},
			{Scope: "acme", Endpoint: "/v1/embeddings", ID: "b"},
		}
		for _, k := range mine {
			commitAs(t, s, k, JSONRecord(), ttl)
		}
		flying := cache.Key{Scope: "acme", Endpoint: chatEP, ID: "flying"}
		fc := claim(t, s, flying, "fp", cache.Claimed)
		var theirs []cache.Key
		for _, sc := range neighbours {
			k := cache.Key{Scope: sc, Endpoint: chatEP, ID: "a"}
			commitAs(t, s, k, JSONRecord(), ttl)
			theirs = append(theirs, k)
		}
		dead := func(k cache.Key) {
			t.Helper()
			if err := s.PutDeadLetter(ctx, k, &cache.DeadLetter{Class: "transient"}, time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		dead(cache.Key{Scope: "acme", Endpoint: chatEP, ID: "failed"})
		dead(cache.Key{Scope: "acme2", Endpoint: chatEP, ID: "failed"})
		dead(cache.Key{Scope: "", Endpoint: chatEP, ID: "failed"})
		res := startWait(t, s, ctx, flying)

		p, err := s.PurgeScope(ctx, "acme")
		if err != nil || p != (cache.Purged{Records: 3, DeadLetters: 1}) {
			t.Fatalf("PurgeScope(acme) = %+v, %v; want 3 records and 1 dead letter", p, err)
		}
		if err := waitResult(t, res); err != nil {
			t.Fatalf("Wait on a purged in-flight key: %v", err)
		}
		for _, k := range append(mine, flying) {
			if _, err := s.Get(ctx, k); !errors.Is(err, cache.ErrNotFound) {
				t.Fatalf("Get(%v) after the purge: %v, want cache.ErrNotFound", k, err)
			}
		}
		if err := s.Commit(ctx, flying, fc.Owner, JSONRecord(), ttl); !errors.Is(err, cache.ErrNotOwner) {
			t.Fatalf("Commit of a purged in-flight key: %v, want cache.ErrNotOwner", err)
		}
		for _, k := range theirs {
			if got, err := s.Get(ctx, k); err != nil || got.State != cache.Committed {
				t.Fatalf("Get(%v) after acme's purge: %+v, %v", k, got, err)
			}
		}
		list, err := s.ListDeadLetters(ctx, cache.DeadLetterFilter{})
		if err != nil || len(list) != 2 {
			t.Fatalf("dead letters after acme's purge: %+v, %v; want the other two", list, err)
		}
		for _, d := range list {
			if d.Client == "acme" {
				t.Fatalf("acme's dead letter survived: %+v", d)
			}
		}
		if p, err := s.PurgeScope(ctx, "acme"); err != nil || p != (cache.Purged{}) {
			t.Fatalf("second PurgeScope(acme) = %+v, %v", p, err)
		}
		claim(t, s, mine[0], "another-fp", cache.Claimed)
	})
}

// runInvalidArguments checks that bad keys, leases, ttls, records and a done
// context are refused.
func runInvalidArguments(t *testing.T, open opener) {
	t.Run("invalid arguments", func(t *testing.T) {
		s, _ := setup(t, open)
		bad := cache.Key{Endpoint: chatEP, ID: "has\nnewline"}
		if _, err := s.Claim(ctx, bad, "fp", lease); !errors.Is(err, cache.ErrInvalidKey) {
			t.Fatalf("Claim with bad key: %v", err)
		}
		if _, err := s.Claim(ctx, key1, "fp", 0); err == nil {
			t.Fatal("Claim with zero lease: no error")
		}
		c := claim(t, s, key1, "fp", cache.Claimed)
		if err := s.Commit(ctx, key1, c.Owner, JSONRecord(), 0); err == nil {
			t.Fatal("Commit with zero ttl: no error")
		}
		if err := s.Commit(ctx, key1, c.Owner, nil, ttl); err == nil {
			t.Fatal("Commit of nil record: no error")
		}
		if _, err := s.Get(ctx, cache.Key{Scope: "a\x00b", Endpoint: chatEP, ID: "k"}); !errors.Is(err, cache.ErrInvalidKey) {
			t.Fatalf("Get of a scope with NUL: %v", err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := s.Claim(cctx, key1, "fp", lease); !errors.Is(err, context.Canceled) {
			t.Fatalf("Claim with done ctx: %v", err)
		}
	})
}

func waitResult(t *testing.T, res <-chan error) error {
	t.Helper()
	select {
	case err := <-res:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return within 10s")
		return nil
	}
}

// Clock is a fake store clock: its Now and After go in a store's options,
// and the test moves it with Advance, which fires the After timers that
// are due. Each After call is also reported on AfterCalls: a store's Wait
// makes one just before it blocks.
type Clock struct {
	mu         sync.Mutex
	now        time.Time
	timers     []fakeTimer
	afterCalls chan time.Duration
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

// NewClock returns a Clock at a fixed time.
func NewClock() *Clock {
	return &Clock{
		now:        time.Date(2025, 11, 29, 12, 0, 0, 0, time.UTC),
		afterCalls: make(chan time.Duration, 1024),
	}
}

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After is time.After on this clock.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
	} else {
		c.timers = append(c.timers, fakeTimer{at: c.now.Add(d), ch: ch})
	}
	select {
	case c.afterCalls <- d:
	default:
	}
	return ch
}

// AfterCalls receives the duration of each After call (up to 1024 unread).
func (c *Clock) AfterCalls() <-chan time.Duration { return c.afterCalls }

// Advance moves the clock by d and fires the timers that are due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, tm := range c.timers {
		if !tm.at.After(c.now) {
			tm.ch <- c.now
			continue
		}
		kept = append(kept, tm)
	}
	c.timers = kept
}

// JSONRecord is a sample non-stream response to commit.
func JSONRecord() *cache.Record {
	return &cache.Record{
		Status:   200,
		Header:   map[string][]string{"Content-Type": {"application/json"}, "X-Request-Id": {"req-1"}},
		Body:     []byte(`{"id":"chatcmpl-1","choices":[{"message":{"content":"hi"}}]}`),
		Upstream: "openai",
	}
}

// StreamRecord is a sample stream response to commit, with events framed
// in several ways.
func StreamRecord() *cache.Record {
	return &cache.Record{
		Status: 200,
		Header: map[string][]string{"Content-Type": {"text/event-stream"}},
		Stream: true,
		Events: [][]byte{
			[]byte("data: {\"choices\":[{\"delta\":{\"content\":\"he\"}}]}\n\n"),
			[]byte("event: message\ndata: {\"a\":1,\ndata: \"b\":2}\n\n"),
			[]byte(": keep-alive\r\n\r\n"),
			[]byte("data: [DONE]\n\n"),
		},
		Upstream: "azure",
	}
}

// AssertSameRecord compares what a client can observe: an empty body or
// header equals a missing one, times compare with Equal.
func AssertSameRecord(t *testing.T, got, want *cache.Record) {
	t.Helper()
	norm := func(r *cache.Record) cache.Record {
		c := *r
		if len(c.Body) == 0 {
			c.Body = nil
		}
		if len(c.Header) == 0 {
			c.Header = nil
		}
		for k, v := range c.Header {
			if len(v) == 0 {
				c.Header[k] = []string{}
			}
		}
		if len(c.Events) == 0 {
			c.Events = nil
		}
		c.Events = append([][]byte(nil), c.Events...)
		for i, e := range c.Events {
			if len(e) == 0 {
				c.Events[i] = nil
			}
		}
		c.LeaseUntil, c.CreatedAt, c.ExpiresAt = time.Time{}, time.Time{}, time.Time{}
		return c
	}
	g, w := norm(got), norm(want)
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("record differs:\n got %+v\nwant %+v", g, w)
	}
	for _, p := range [][2]time.Time{
		{got.LeaseUntil, want.LeaseUntil}, {got.CreatedAt, want.CreatedAt}, {got.ExpiresAt, want.ExpiresAt},
	} {
		if !p[0].Equal(p[1]) {
			t.Fatalf("time differs: got %v, want %v", p[0], p[1])
		}
	}
}
