package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"
)

// store is what Badger and Redis share and the suite exercises.
type store interface {
	Claim(ctx context.Context, k Key, fingerprint string, lease time.Duration) (Claim, error)
	Renew(ctx context.Context, k Key, owner string, lease time.Duration) error
	Commit(ctx context.Context, k Key, owner string, rec *Record, ttl time.Duration) error
	Release(ctx context.Context, k Key, owner string) error
	Wait(ctx context.Context, k Key) error
	Get(ctx context.Context, k Key) (*Record, error)
	Delete(ctx context.Context, k Key) error
	List(ctx context.Context, scope string, limit int) ([]ListedKey, error)
	PutDeadLetter(ctx context.Context, k Key, d *DeadLetter, ttl time.Duration) error
	GetDeadLetter(ctx context.Context, id string) (*DeadLetter, error)
	DeleteDeadLetter(ctx context.Context, id string) error
	ListDeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error)
}

// observed is a store under test plus what the suite needs to watch it:
// blocked receives each time a Wait call is about to block.
type observed struct {
	store
	blocked chan struct{}
	// ttlOf, if set, returns the real (Redis) TTL of k's record.
	ttlOf func(k Key) time.Duration
}

func newObserved(s store) *observed {
	return &observed{store: s, blocked: make(chan struct{}, 1024)}
}

// waitBlocked waits until a Wait call on o blocks. res is that call's
// result, so that a Wait that returns instead fails the test rather than
// leaving it waiting for a signal that never comes.
func waitBlocked(t *testing.T, o *observed, res <-chan error) {
	t.Helper()
	select {
	case <-o.blocked:
	case err := <-res:
		t.Fatalf("Wait returned %v instead of blocking", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not block within 10s")
	}
}

// signalBlocked is the hook a store calls when Wait is about to block.
func (o *observed) signalBlocked() {
	select {
	case o.blocked <- struct{}{}:
	default:
	}
}

func TestBadgerStoreSuite(t *testing.T) {
	runStoreSuite(t, func(t *testing.T, now func() time.Time) store {
		var o *observed
		b, err := OpenBadger(BadgerOptions{
			Dir: t.TempDir(),
			Now: now,
			// Badger's Wait calls After just before it blocks.
			After: func(d time.Duration) <-chan time.Time {
				o.signalBlocked()
				return time.After(d)
			},
		})
		if err != nil {
			t.Fatalf("OpenBadger: %v", err)
		}
		t.Cleanup(func() { b.Close() })
		o = newObserved(b)
		return o
	})
}

// runStoreSuite runs the behaviour both stores must share. open returns a
// fresh, empty store on the given clock, closed when t ends; it may return
// an *observed to let the suite see Wait block.
func runStoreSuite(t *testing.T, open func(t *testing.T, now func() time.Time) store) {
	setup := func(t *testing.T) (*observed, *fakeClock) {
		t.Helper()
		clock := newClock()
		s := open(t, clock.Now)
		o, ok := s.(*observed)
		if !ok {
			o = newObserved(s)
		}
		return o, clock
	}
	claim := func(t *testing.T, s store, k Key, fp string, want ClaimStatus) Claim {
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
	startWait := func(t *testing.T, s *observed, wctx context.Context, k Key) <-chan error {
		t.Helper()
		res := make(chan error, 1)
		go func() { res <- s.Wait(wctx, k) }()
		select {
		case <-s.blocked:
		case err := <-res:
			t.Fatalf("Wait returned %v instead of blocking", err)
		case <-time.After(10 * time.Second):
			t.Fatal("Wait did not block within 10s")
		}
		return res
	}

	t.Run("claim race", func(t *testing.T) {
		s, _ := setup(t)
		const n = 64
		var wg sync.WaitGroup
		results := make([]Claim, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() { results[i], errs[i] = s.Claim(ctx, key1, "fp", lease) })
		}
		wg.Wait()
		counts := map[ClaimStatus]int{}
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("Claim %d: %v", i, errs[i])
			}
			counts[results[i].Status]++
		}
		if counts[Claimed] != 1 || counts[Busy] != n-1 {
			t.Fatalf("claims = %v, want 1 claimed and %d busy", counts, n-1)
		}
	})

	for name, newRec := range map[string]func() *Record{"json": jsonRecord, "stream": streamRecord} {
		t.Run("commit replay "+name, func(t *testing.T) {
			s, clock := setup(t)
			fp := "fp-" + name
			c := claim(t, s, key1, fp, Claimed)
			if s.ttlOf != nil {
				if d := s.ttlOf(key1); d <= lease || d > lease+inFlightGrace {
					t.Fatalf("in-flight TTL = %v, want in (%v, %v]", d, lease, lease+inFlightGrace)
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
			want.State, want.Fingerprint = Committed, fp
			want.CreatedAt, want.ExpiresAt = at, at.Add(ttl)

			got, err := s.Get(ctx, key1)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			assertSameRecord(t, got, want)
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
			if s.ttlOf != nil {
				if d := s.ttlOf(key1); d <= ttl-time.Minute || d > ttl {
					t.Fatalf("committed TTL = %v, want about %v", d, ttl)
				}
			}
			replay := claim(t, s, key1, fp, Done)
			assertSameRecord(t, replay.Record, want)
		})
	}

	t.Run("not owner", func(t *testing.T) {
		s, clock := setup(t)
		if err := s.Commit(ctx, key1, "nobody", jsonRecord(), ttl); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("Commit of absent key: %v, want ErrNotOwner", err)
		}
		c := claim(t, s, key1, "fp", Claimed)
		for name, err := range map[string]error{
			"commit":  s.Commit(ctx, key1, "other", jsonRecord(), ttl),
			"release": s.Release(ctx, key1, "other"),
			"renew":   s.Renew(ctx, key1, "other", lease),
			"empty":   s.Release(ctx, key1, ""),
		} {
			if !errors.Is(err, ErrNotOwner) {
				t.Errorf("%s by a non-owner: %v, want ErrNotOwner", name, err)
			}
		}
		clock.Advance(lease)
		c2 := claim(t, s, key1, "fp", Claimed)
		if c2.Owner == c.Owner {
			t.Fatal("takeover kept the old owner token")
		}
		if err := s.Renew(ctx, key1, c.Owner, lease); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("old owner's Renew after takeover: %v", err)
		}
		if err := s.Commit(ctx, key1, c.Owner, jsonRecord(), ttl); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("old owner's Commit after takeover: %v", err)
		}
		if err := s.Release(ctx, key1, c.Owner); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("old owner's Release after takeover: %v", err)
		}
		if err := s.Commit(ctx, key1, c2.Owner, jsonRecord(), ttl); err != nil {
			t.Fatalf("new owner's Commit: %v", err)
		}
		if err := s.Release(ctx, key1, c2.Owner); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("Release after Commit: %v", err)
		}
		if err := s.Commit(ctx, key1, c2.Owner, jsonRecord(), ttl); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("second Commit: %v", err)
		}
		if err := s.Renew(ctx, key1, c2.Owner, lease); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("Renew after Commit: %v", err)
		}
	})

	t.Run("lease expiry takeover", func(t *testing.T) {
		s, clock := setup(t)
		c := claim(t, s, key1, "fp", Claimed)
		clock.Advance(lease - time.Second)
		busy := claim(t, s, key1, "fp", Busy)
		if busy.Record.State != InFlight || !busy.Record.LeaseUntil.Equal(clock.Now().Add(time.Second)) {
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
		claim(t, s, key1, "fp", Busy)
		clock.Advance(time.Nanosecond)
		taken := claim(t, s, key1, "fp", Claimed)
		if taken.Owner == c.Owner {
			t.Fatal("takeover kept the old owner token")
		}
		// A lease that ran out is still renewed if nobody took it over.
		clock.Advance(2 * lease)
		if err := s.Renew(ctx, key1, taken.Owner, lease); err != nil {
			t.Fatalf("Renew of a lapsed lease: %v", err)
		}
		claim(t, s, key1, "fp", Busy)
	})

	t.Run("mismatch", func(t *testing.T) {
		s, _ := setup(t)
		c := claim(t, s, key1, "fp-a", Claimed)
		m := claim(t, s, key1, "fp-b", Mismatch)
		if m.Record == nil || m.Record.State != InFlight || m.Record.Fingerprint != "fp-a" {
			t.Fatalf("mismatch while in flight: record %+v", m.Record)
		}
		if err := s.Commit(ctx, key1, c.Owner, jsonRecord(), ttl); err != nil {
			t.Fatal(err)
		}
		m = claim(t, s, key1, "fp-b", Mismatch)
		if m.Record == nil || m.Record.State != Committed || m.Record.Fingerprint != "fp-a" {
			t.Fatalf("mismatch after commit: record %+v", m.Record)
		}
	})

	wakers := map[string]func(s store, owner string) error{
		"commit":  func(s store, owner string) error { return s.Commit(ctx, key1, owner, jsonRecord(), ttl) },
		"release": func(s store, owner string) error { return s.Release(ctx, key1, owner) },
		"delete":  func(s store, _ string) error { return s.Delete(ctx, key1) },
	}
	for name, wake := range wakers {
		t.Run("wait woken by "+name, func(t *testing.T) {
			s, _ := setup(t)
			c := claim(t, s, key1, "fp", Claimed)
			res := startWait(t, s, ctx, key1)
			if err := wake(s, c.Owner); err != nil {
				t.Fatal(err)
			}
			if err := waitResult(t, res); err != nil {
				t.Fatalf("Wait: %v", err)
			}
		})
	}

	t.Run("wait returns at once when not in flight", func(t *testing.T) {
		s, clock := setup(t)
		if err := s.Wait(ctx, key1); err != nil {
			t.Fatalf("Wait on absent key: %v", err)
		}
		claim(t, s, key1, "fp", Claimed)
		clock.Advance(lease)
		if err := s.Wait(ctx, key1); err != nil {
			t.Fatalf("Wait on an expired lease: %v", err)
		}
		c := claim(t, s, key1, "fp", Claimed)
		if err := s.Commit(ctx, key1, c.Owner, jsonRecord(), ttl); err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(ctx, key1); err != nil {
			t.Fatalf("Wait on committed key: %v", err)
		}
		if len(s.blocked) != 0 {
			t.Fatal("Wait blocked although the key was not in flight")
		}
	})

	t.Run("wait ctx cancel", func(t *testing.T) {
		s, _ := setup(t)
		claim(t, s, key1, "fp", Claimed)
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

	// A commit racing with a waiter's Claim → Wait must never leave the
	// waiter blocked (it would hit waitResult's 10s guard: the lease is
	// 30s and the fake clock does not move).
	t.Run("wait no missed wakeup", func(t *testing.T) {
		s, _ := setup(t)
		for i := range 50 {
			k := Key{Endpoint: chatEP, ID: fmt.Sprintf("race-%d", i)}
			c := claim(t, s, k, "fp", Claimed)
			res := make(chan error, 1)
			go func() {
				for {
					cl, err := s.Claim(ctx, k, "fp", lease)
					if err != nil || cl.Status == Done {
						res <- err
						return
					}
					if err := s.Wait(ctx, k); err != nil {
						res <- err
						return
					}
				}
			}()
			if err := s.Commit(ctx, k, c.Owner, jsonRecord(), ttl); err != nil {
				t.Fatal(err)
			}
			if err := waitResult(t, res); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
	})

	t.Run("tenant scoping", func(t *testing.T) {
		s, _ := setup(t)
		a := Key{Scope: "acme", Endpoint: chatEP, ID: "same-id"}
		b := Key{Scope: "globex", Endpoint: chatEP, ID: "same-id"}
		shared := Key{Endpoint: chatEP, ID: "same-id"}
		embed := Key{Scope: "acme", Endpoint: "/v1/embeddings", ID: "same-id"}
		ca := claim(t, s, a, "fp-a", Claimed)
		cb := claim(t, s, b, "fp-b", Claimed)
		claim(t, s, shared, "fp-c", Claimed)
		claim(t, s, embed, "fp-d", Claimed)
		if err := s.Commit(ctx, a, ca.Owner, jsonRecord(), ttl); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, b, ca.Owner, jsonRecord(), ttl); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("Commit of another scope's key with this owner: %v", err)
		}
		if got, err := s.Get(ctx, b); err != nil || got.State != InFlight || got.Fingerprint != "fp-b" {
			t.Fatalf("other scope's record = %+v, %v", got, err)
		}
		if err := s.Delete(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, b, cb.Owner); err != nil {
			t.Fatalf("Release in the other scope: %v", err)
		}
		for scope, want := range map[string]int{"acme": 1, "globex": 0, "": 1} {
			list, err := s.List(ctx, scope, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != want {
				t.Fatalf("List(%q) = %+v, want %d keys", scope, list, want)
			}
			for _, lk := range list {
				if lk.Key.Scope != scope {
					t.Fatalf("List(%q) returned %+v", scope, lk.Key)
				}
			}
		}
	})

	t.Run("list", func(t *testing.T) {
		s, clock := setup(t)
		for _, id := range []string{"k3", "k1", "k0", "k2", "k4"} {
			k := Key{Scope: "acme", Endpoint: chatEP, ID: id}
			c := claim(t, s, k, "fp", Claimed)
			if id < "k3" {
				if err := s.Commit(ctx, k, c.Owner, jsonRecord(), ttl); err != nil {
					t.Fatal(err)
				}
			}
		}
		claim(t, s, Key{Scope: "acme", Endpoint: "/v1/completions", ID: "z"}, "fp", Claimed)
		claim(t, s, Key{Scope: "acme2", Endpoint: chatEP, ID: "x"}, "fp", Claimed)
		list, err := s.List(ctx, "acme", 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 6 || list[0].Key.Endpoint != chatEP || list[5].Key.Endpoint != "/v1/completions" {
			t.Fatalf("List = %+v, want 6 keys, /v1/chat/completions first", list)
		}
		for i, lk := range list[:5] {
			wantState, wantSize := InFlight, 0
			if i < 3 {
				wantState, wantSize = Committed, len(jsonRecord().Body)
			}
			if lk.Key.ID != fmt.Sprintf("k%d", i) || lk.State != wantState || lk.Size != wantSize || lk.Fingerprint != "fp" {
				t.Fatalf("List[%d] = %+v, want k%d state %v size %d", i, lk, i, wantState, wantSize)
			}
		}
		if list, _ := s.List(ctx, "acme", 2); len(list) != 2 || list[1].Key.ID != "k1" {
			t.Fatalf("List with limit 2: %+v", list)
		}
		clock.Advance(ttl)
		if list, _ := s.List(ctx, "acme", 10); len(list) != 3 {
			t.Fatalf("List after expiry = %d keys, want the 3 in flight", len(list))
		}
	})

	t.Run("delete", func(t *testing.T) {
		s, _ := setup(t)
		if err := s.Delete(ctx, key1); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Delete absent: %v, want ErrNotFound", err)
		}
		c := claim(t, s, key1, "fp", Claimed)
		if err := s.Commit(ctx, key1, c.Owner, jsonRecord(), ttl); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, key1); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, err := s.Get(ctx, key1); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get after Delete: %v", err)
		}
		claim(t, s, key1, "another-fp", Claimed)
	})

	t.Run("ttl", func(t *testing.T) {
		s, clock := setup(t)
		c := claim(t, s, key1, "fp", Claimed)
		const short = 90 * time.Second
		if err := s.Commit(ctx, key1, c.Owner, jsonRecord(), short); err != nil {
			t.Fatal(err)
		}
		if s.ttlOf != nil {
			if d := s.ttlOf(key1); d <= short-10*time.Second || d > short {
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
		claim(t, s, key1, "fp", Done)
		clock.Advance(time.Nanosecond)
		if _, err := s.Get(ctx, key1); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get at expiry: %v, want ErrNotFound", err)
		}
		if list, _ := s.List(ctx, key1.Scope, 0); len(list) != 0 {
			t.Fatalf("List at expiry: %+v", list)
		}
		// Expired means absent: the key can be claimed afresh, with any body.
		claim(t, s, key1, "another-fp", Claimed)
	})

	t.Run("dead letters", func(t *testing.T) {
		s, clock := setup(t)
		first := clock.Now()
		k2 := Key{Scope: "globex", Endpoint: chatEP, ID: "key-2"}
		put := func(k Key, d DeadLetter) DeadLetter {
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
		d1 := put(key1, DeadLetter{Body: []byte(`{"model":"m"}`), Upstreams: []string{"openai"}, Class: "transient", Attempts: 3, Message: "502"})
		if d1.ID != DeadLetterID(key1) || d1.Client != "acme" || d1.Key != "key-1" || d1.Failures != 1 {
			t.Fatalf("first put = %+v", d1)
		}
		clock.Advance(time.Minute)
		d1 = put(key1, DeadLetter{Body: []byte(`{"model":"m2"}`), Upstreams: []string{"openai", "azure"}, Class: "open", Attempts: 1, Message: "breaker"})
		if d1.Failures != 2 || !d1.FirstAt.Equal(first) || !d1.LastAt.Equal(clock.Now()) {
			t.Fatalf("merged = failures %d first %v last %v; want 2, %v, %v", d1.Failures, d1.FirstAt, d1.LastAt, first, clock.Now())
		}
		clock.Advance(time.Minute)
		d2 := put(k2, DeadLetter{Upstreams: []string{"azure"}, Class: "transient"})

		got, err := s.GetDeadLetter(ctx, d1.ID)
		if err != nil || string(got.Body) != `{"model":"m2"}` || got.Failures != 2 || got.Class != "open" {
			t.Fatalf("GetDeadLetter = %+v, %v", got, err)
		}
		for _, tc := range []struct {
			f    DeadLetterFilter
			want []string
		}{
			{DeadLetterFilter{}, []string{d2.ID, d1.ID}},
			{DeadLetterFilter{Upstream: "openai"}, []string{d1.ID}},
			{DeadLetterFilter{Upstream: "azure"}, []string{d2.ID, d1.ID}},
			{DeadLetterFilter{Class: "transient"}, []string{d2.ID}},
			{DeadLetterFilter{Client: "acme"}, []string{d1.ID}},
			{DeadLetterFilter{Client: "nobody"}, nil},
		} {
			list, err := s.ListDeadLetters(ctx, tc.f)
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
			if !reflect.DeepEqual(ids, tc.want) {
				t.Fatalf("ListDeadLetters(%+v) = %v, want %v", tc.f, ids, tc.want)
			}
		}
		if err := s.DeleteDeadLetter(ctx, d1.ID); err != nil {
			t.Fatalf("DeleteDeadLetter: %v", err)
		}
		if _, err := s.GetDeadLetter(ctx, d1.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GetDeadLetter after delete: %v", err)
		}
		if err := s.DeleteDeadLetter(ctx, d1.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second DeleteDeadLetter: %v, want ErrNotFound", err)
		}
		// After a delete the next failure starts afresh.
		if d := put(key1, DeadLetter{Class: "transient"}); d.Failures != 1 {
			t.Fatalf("put after delete: failures %d", d.Failures)
		}
		clock.Advance(time.Hour)
		if list, _ := s.ListDeadLetters(ctx, DeadLetterFilter{}); len(list) != 0 {
			t.Fatalf("expired dead letters listed: %+v", list)
		}
		if _, err := s.GetDeadLetter(ctx, d2.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GetDeadLetter of an expired one: %v", err)
		}
	})

	t.Run("invalid arguments", func(t *testing.T) {
		s, _ := setup(t)
		bad := Key{Endpoint: chatEP, ID: "has\nnewline"}
		if _, err := s.Claim(ctx, bad, "fp", lease); !errors.Is(err, ErrInvalidKey) {
			t.Fatalf("Claim with bad key: %v", err)
		}
		if _, err := s.Claim(ctx, key1, "fp", 0); err == nil {
			t.Fatal("Claim with zero lease: no error")
		}
		c := claim(t, s, key1, "fp", Claimed)
		if err := s.Commit(ctx, key1, c.Owner, jsonRecord(), 0); err == nil {
			t.Fatal("Commit with zero ttl: no error")
		}
		if err := s.Commit(ctx, key1, c.Owner, nil, ttl); err == nil {
			t.Fatal("Commit of nil record: no error")
		}
		if _, err := s.List(ctx, "a\x00b", 0); !errors.Is(err, ErrInvalidKey) {
			t.Fatalf("List of a scope with NUL: %v", err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := s.Claim(cctx, key1, "fp", lease); !errors.Is(err, context.Canceled) {
			t.Fatalf("Claim with done ctx: %v", err)
		}
	})
}
