package badgerstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/internal/codec"
	"github.com/llmgate/llmgate/cache/storetest"
)

func TestBadgerStoreSuite(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) storetest.Store {
		var o *storetest.Observed
		s, err := Open(Options{
			Dir: t.TempDir(),
			Now: now,
			// Wait calls After just before it blocks.
			After: func(d time.Duration) <-chan time.Time {
				o.SignalBlocked()
				return time.After(d)
			},
		})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		o = storetest.NewObserved(s)
		return o
	})
}

// blocked waits until a Wait call has reached its select, which it does
// right after calling the clock's After.
func blocked(t *testing.T, clock *storetest.Clock) {
	t.Helper()
	select {
	case <-clock.AfterCalls():
	case <-time.After(10 * time.Second):
		t.Fatal("no Wait call blocked within 10s")
	}
}

func openStore(t testing.TB, dir string, clock *storetest.Clock) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir, Now: clock.Now, After: clock.After})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
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

func mustClaim(t *testing.T, s *Store, k cache.Key, fp string, want cache.ClaimStatus) cache.Claim {
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

func TestCommitReplay(t *testing.T) {
	for name, rec := range map[string]*cache.Record{"json": storetest.JSONRecord(), "stream": storetest.StreamRecord()} {
		t.Run(name, func(t *testing.T) {
			clock := storetest.NewClock()
			s := openStore(t, t.TempDir(), clock)
			c := mustClaim(t, s, key1, "fp-"+name, cache.Claimed)
			clock.Advance(2 * time.Second)
			committedAt := clock.Now()
			orig := *rec
			if err := s.Commit(ctx, key1, c.Owner, rec, ttl); err != nil {
				t.Fatalf("Commit: %v", err)
			}
			if !reflect.DeepEqual(*rec, orig) {
				t.Fatal("Commit modified the caller's record")
			}
			want := orig
			want.State = cache.Committed
			want.Fingerprint = "fp-" + name
			want.CreatedAt = committedAt
			want.ExpiresAt = committedAt.Add(ttl)

			got, err := s.Get(ctx, key1)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			storetest.AssertSameRecord(t, got, &want)
			if !got.CreatedAt.Equal(committedAt) || !got.ExpiresAt.Equal(committedAt.Add(ttl)) {
				t.Fatalf("times = %v..%v, want %v..%v", got.CreatedAt, got.ExpiresAt, committedAt, committedAt.Add(ttl))
			}
			if got.Owner != "" || !got.LeaseUntil.IsZero() {
				t.Fatalf("committed record keeps owner %q lease %v", got.Owner, got.LeaseUntil)
			}
			var gotBytes, wantBytes []byte
			for i := range want.Events {
				gotBytes = append(gotBytes, got.Events[i]...)
				wantBytes = append(wantBytes, want.Events[i]...)
			}
			gotBytes = append(gotBytes, got.Body...)
			wantBytes = append(wantBytes, want.Body...)
			if !bytes.Equal(gotBytes, wantBytes) {
				t.Fatalf("replayed bytes differ:\n got %q\nwant %q", gotBytes, wantBytes)
			}
			if got.Size() != len(wantBytes) {
				t.Fatalf("Size = %d, want %d", got.Size(), len(wantBytes))
			}

			// A second request with the same body replays; it does not run.
			c2 := mustClaim(t, s, key1, "fp-"+name, cache.Done)
			storetest.AssertSameRecord(t, c2.Record, &want)
		})
	}
}

func TestLeaseExpiryAndRenew(t *testing.T) {
	clock := storetest.NewClock()
	s := openStore(t, t.TempDir(), clock)
	c := mustClaim(t, s, key1, "fp", cache.Claimed)

	clock.Advance(lease - time.Second)
	busy := mustClaim(t, s, key1, "fp", cache.Busy)
	if busy.Record.State != cache.InFlight || !busy.Record.LeaseUntil.Equal(clock.Now().Add(time.Second)) {
		t.Fatalf("busy record = %+v", busy.Record)
	}
	if err := s.Renew(ctx, key1, c.Owner, lease); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	clock.Advance(lease - time.Second)
	mustClaim(t, s, key1, "fp", cache.Busy)
	clock.Advance(time.Second)
	mustClaim(t, s, key1, "fp", cache.Claimed)
}

func TestRelease(t *testing.T) {
	s := openStore(t, t.TempDir(), storetest.NewClock())
	c := mustClaim(t, s, key1, "fp", cache.Claimed)
	if err := s.Release(ctx, key1, c.Owner); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := s.Get(ctx, key1); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Get after Release: %v, want cache.ErrNotFound", err)
	}
	// The client may retry, even with another body.
	mustClaim(t, s, key1, "other-fp", cache.Claimed)
}

func TestReopen(t *testing.T) {
	dir := t.TempDir()
	clock := storetest.NewClock()
	inflight := cache.Key{Endpoint: chatEP, ID: "in-flight"}
	done := cache.Key{Endpoint: chatEP, ID: "committed"}

	s, err := Open(Options{Dir: dir, Now: clock.Now, After: clock.After})
	if err != nil {
		t.Fatal(err)
	}
	old := mustClaim(t, s, inflight, "fp", cache.Claimed)
	c := mustClaim(t, s, done, "fp2", cache.Claimed)
	if err := s.Commit(ctx, done, c.Owner, storetest.StreamRecord(), ttl); err != nil {
		t.Fatal(err)
	}
	before, err := s.Get(ctx, done)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	// Same clock: the lease is still current, yet its owner is dead.
	s = openStore(t, dir, clock)
	taken := mustClaim(t, s, inflight, "fp", cache.Claimed)
	if taken.Owner == old.Owner {
		t.Fatal("owner token reused across processes")
	}
	// And a claim by this process is respected.
	mustClaim(t, s, inflight, "fp", cache.Busy)

	replay := mustClaim(t, s, done, "fp2", cache.Done)
	if !reflect.DeepEqual(replay.Record, before) {
		t.Fatalf("replay after reopen differs:\n got %+v\nwant %+v", replay.Record, before)
	}
}

// startWait runs Wait in a goroutine and returns its result channel once the
// call is blocked.
func startWait(t *testing.T, s *Store, clock *storetest.Clock, wctx context.Context, k cache.Key) <-chan error {
	t.Helper()
	res := make(chan error, 1)
	go func() { res <- s.Wait(wctx, k) }()
	blocked(t, clock)
	return res
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

func TestWait(t *testing.T) {
	wakers := map[string]func(s *Store, clock *storetest.Clock, owner string) error{
		"commit": func(s *Store, _ *storetest.Clock, owner string) error {
			return s.Commit(ctx, key1, owner, storetest.JSONRecord(), ttl)
		},
		"release": func(s *Store, _ *storetest.Clock, owner string) error { return s.Release(ctx, key1, owner) },
		"delete":  func(s *Store, _ *storetest.Clock, _ string) error { return s.Delete(ctx, key1) },
		"lease timer": func(_ *Store, clock *storetest.Clock, _ string) error {
			clock.Advance(lease)
			return nil
		},
	}
	for name, wake := range wakers {
		t.Run("woken by "+name, func(t *testing.T) {
			clock := storetest.NewClock()
			s := openStore(t, t.TempDir(), clock)
			c := mustClaim(t, s, key1, "fp", cache.Claimed)
			res := startWait(t, s, clock, ctx, key1)
			if err := wake(s, clock, c.Owner); err != nil {
				t.Fatal(err)
			}
			if err := waitResult(t, res); err != nil {
				t.Fatalf("Wait: %v", err)
			}
			if s.waiters.Len() != 0 {
				t.Fatalf("%d waiter entries left", s.waiters.Len())
			}
		})
	}

	t.Run("returns at once when not in flight", func(t *testing.T) {
		clock := storetest.NewClock()
		s := openStore(t, t.TempDir(), clock)
		if err := s.Wait(ctx, key1); err != nil {
			t.Fatalf("Wait on absent key: %v", err)
		}
		c := mustClaim(t, s, key1, "fp", cache.Claimed)
		clock.Advance(lease)
		if err := s.Wait(ctx, key1); err != nil {
			t.Fatalf("Wait on an expired lease: %v", err)
		}
		c = mustClaim(t, s, key1, "fp", cache.Claimed)
		if err := s.Commit(ctx, key1, c.Owner, storetest.JSONRecord(), ttl); err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(ctx, key1); err != nil {
			t.Fatalf("Wait on committed key: %v", err)
		}
		if len(clock.AfterCalls()) != 0 {
			t.Fatal("Wait blocked although the key was not in flight")
		}
	})

	t.Run("ctx cancel", func(t *testing.T) {
		clock := storetest.NewClock()
		s := openStore(t, t.TempDir(), clock)
		mustClaim(t, s, key1, "fp", cache.Claimed)
		wctx, cancel := context.WithCancel(ctx)
		res := startWait(t, s, clock, wctx, key1)
		cancel()
		if err := waitResult(t, res); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait after cancel: %v, want context.Canceled", err)
		}
		if err := s.Wait(wctx, key1); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait with a done ctx: %v", err)
		}
	})
}

// TestWaitNoMissedWakeup races a commit with the waiter's Claim → Wait: the
// waiter must never block past the commit (it would hit the 10s guard, as
// the fake lease timer never fires).
func TestWaitNoMissedWakeup(t *testing.T) {
	clock := storetest.NewClock()
	s := openStore(t, t.TempDir(), clock)
	for i := range 200 {
		k := cache.Key{Endpoint: chatEP, ID: fmt.Sprintf("race-%d", i)}
		c := mustClaim(t, s, k, "fp", cache.Claimed)
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
		if err := s.Commit(ctx, k, c.Owner, storetest.JSONRecord(), ttl); err != nil {
			t.Fatal(err)
		}
		if err := waitResult(t, res); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
}

func TestTTL(t *testing.T) {
	clock := storetest.NewClock()
	s := openStore(t, t.TempDir(), clock)
	c := mustClaim(t, s, key1, "fp", cache.Claimed)
	const short = 90 * time.Second
	realBefore := time.Now()
	if err := s.Commit(ctx, key1, c.Owner, storetest.JSONRecord(), short); err != nil {
		t.Fatal(err)
	}
	// Badger's own TTL is set (real time, whole seconds, never early), so
	// the record leaves the disk even if nobody asks for it again.
	var badgerExp uint64
	if err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(storageKey(key1))
		if err != nil {
			return err
		}
		badgerExp = item.ExpiresAt()
		if item.UserMeta() != byte(cache.Committed) {
			t.Errorf("user meta = %d, want cache.Committed", item.UserMeta())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	lo, hi := realBefore.Add(short).Unix(), time.Now().Add(short).Unix()+1
	if int64(badgerExp) < lo || int64(badgerExp) > hi {
		t.Fatalf("badger ExpiresAt = %d, want in [%d, %d]", badgerExp, lo, hi)
	}

	clock.Advance(short - time.Nanosecond)
	if _, err := s.Get(ctx, key1); err != nil {
		t.Fatalf("Get just before expiry: %v", err)
	}
	clock.Advance(time.Nanosecond)
	if _, err := s.Get(ctx, key1); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Get at expiry: %v, want cache.ErrNotFound", err)
	}
	// Expired means absent: the key can be claimed afresh, with any body.
	mustClaim(t, s, key1, "another-fp", cache.Claimed)
}

// TestRecordBytes: a committed record is stored as codec.EncodeRecord
// writes it, the same bytes the Redis store keeps (its TestRecordBytes).
func TestRecordBytes(t *testing.T) {
	clock := storetest.NewClock()
	s := openStore(t, t.TempDir(), clock)
	c := mustClaim(t, s, key1, "fp", cache.Claimed)
	if err := s.Commit(ctx, key1, c.Owner, storetest.StreamRecord(), ttl); err != nil {
		t.Fatal(err)
	}
	want := storetest.StreamRecord()
	want.State, want.Fingerprint = cache.Committed, "fp"
	want.CreatedAt, want.ExpiresAt = clock.Now(), clock.Now().Add(ttl)
	var got []byte
	if err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(storageKey(key1))
		if err != nil {
			return err
		}
		got, err = item.ValueCopy(nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, codec.EncodeRecord(want)) {
		t.Fatalf("stored bytes differ from the codec's:\n got %q\nwant %q", got, codec.EncodeRecord(want))
	}
}

// TestInFlightInMemory: in-flight records never reach Badger (a keyed
// request writes once, at Commit), and an orphan is swept lease+grace after
// its lease.
func TestInFlightInMemory(t *testing.T) {
	clock := storetest.NewClock()
	s := openStore(t, t.TempDir(), clock)
	onDisk := func(k cache.Key) bool {
		t.Helper()
		err := s.db.View(func(txn *badger.Txn) error {
			_, err := txn.Get(storageKey(k))
			return err
		})
		if err != nil && !errors.Is(err, badger.ErrKeyNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	c := mustClaim(t, s, key1, "fp", cache.Claimed)
	if err := s.Renew(ctx, key1, c.Owner, lease); err != nil {
		t.Fatal(err)
	}
	if onDisk(key1) {
		t.Fatal("an in-flight record was written to Badger")
	}
	if err := s.Commit(ctx, key1, c.Owner, storetest.JSONRecord(), ttl); err != nil {
		t.Fatal(err)
	}
	if !onDisk(key1) {
		t.Fatal("the committed record is not in Badger")
	}

	// An orphan: claimed, never committed or released.
	orphan := cache.Key{Endpoint: chatEP, ID: "orphan"}
	mustClaim(t, s, orphan, "fp", cache.Claimed)
	res := startWait(t, s, clock, ctx, orphan)
	clock.Advance(lease + inFlightGrace - time.Nanosecond)
	if err := waitResult(t, res); err != nil { // the lease timer
		t.Fatal(err)
	}
	s.sweep()
	if rec, err := s.Get(ctx, orphan); err != nil || rec.State != cache.InFlight {
		t.Fatalf("orphan swept before lease+grace: %+v, %v", rec, err)
	}
	clock.Advance(time.Nanosecond)
	s.sweep()
	if _, err := s.Get(ctx, orphan); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("orphan after lease+grace: %v, want cache.ErrNotFound", err)
	}
	if st := s.flights.n.Load(); st != 0 {
		t.Fatalf("%d in-flight records counted after the sweep", st)
	}
	clock.Advance(statsMaxAge)
	if st := s.Stats(); st.Records != 1 || st.InFlight != 0 {
		t.Fatalf("Stats = %+v, want the 1 committed record", st)
	}
}

// TestDeadLetterIDs: the set DeleteDeadLetter consults is loaded at Open, so
// a dead letter written by an earlier process is still resolved.
func TestDeadLetterIDs(t *testing.T) {
	dir := t.TempDir()
	clock := storetest.NewClock()
	s, err := Open(Options{Dir: dir, Now: clock.Now, After: clock.After})
	if err != nil {
		t.Fatal(err)
	}
	d := cache.DeadLetter{Class: "transient"}
	if err := s.PutDeadLetter(ctx, key1, &d, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, clock)
	if !s.MayHaveDeadLetter(d.ID) {
		t.Fatal("MayHaveDeadLetter after reopen = false for a stored letter: a later success would not resolve it")
	}
	if s.MayHaveDeadLetter(cache.DeadLetterID(cache.Key{Endpoint: chatEP, ID: "none"})) {
		t.Fatal("MayHaveDeadLetter = true for a key that never failed")
	}
	if err := s.DeleteDeadLetter(ctx, cache.DeadLetterID(cache.Key{Endpoint: chatEP, ID: "none"})); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("DeleteDeadLetter of none: %v, want cache.ErrNotFound", err)
	}
	if err := s.DeleteDeadLetter(ctx, d.ID); err != nil {
		t.Fatalf("DeleteDeadLetter after reopen: %v", err)
	}
	if _, err := s.GetDeadLetter(ctx, d.ID); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("GetDeadLetter after delete: %v", err)
	}
	if len(s.dead) != 0 {
		t.Fatalf("dead-letter ids left: %v", s.dead)
	}
	if s.MayHaveDeadLetter(d.ID) {
		t.Fatal("MayHaveDeadLetter after delete = true")
	}
	// Ids whose Badger TTL ran out are forgotten; the others are kept.
	if err := s.PutDeadLetter(ctx, key1, &d, time.Hour); err != nil {
		t.Fatal(err)
	}
	s.dead["expired"] = uint64(time.Now().Unix()) - 1
	s.forgetExpiredDeadLetters()
	if _, ok := s.dead[d.ID]; len(s.dead) != 1 || !ok {
		t.Fatalf("dead-letter ids after forgetting the expired: %v, want only %s", s.dead, d.ID)
	}
}

func TestDelete(t *testing.T) {
	s := openStore(t, t.TempDir(), storetest.NewClock())
	if err := s.Delete(ctx, key1); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Delete absent: %v, want cache.ErrNotFound", err)
	}
	c := mustClaim(t, s, key1, "fp", cache.Claimed)
	if err := s.Commit(ctx, key1, c.Owner, storetest.JSONRecord(), ttl); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, key1); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := s.Get(ctx, key1); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
	// An undecodable record can still be deleted by an admin. Written
	// past Commit, so added to the key filter as Commit would.
	s.filter.noteCommit(storageKey(key1))
	if err := s.db.Update(func(txn *badger.Txn) error {
		return txn.Set(storageKey(key1), []byte{99, 1, 2})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, key1); !errors.Is(err, codec.ErrUnknownVersion) {
		t.Fatalf("Get of an unknown version: %v, want codec.ErrUnknownVersion", err)
	}
	if err := s.Delete(ctx, key1); err != nil {
		t.Fatalf("Delete of an unknown version: %v", err)
	}
}

func TestCloseWakesWaitersAndRefusesCalls(t *testing.T) {
	clock := storetest.NewClock()
	s := openStore(t, t.TempDir(), clock)
	c := mustClaim(t, s, key1, "fp", cache.Claimed)
	res := startWait(t, s, clock, ctx, key1)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := waitResult(t, res); !errors.Is(err, cache.ErrClosed) {
		t.Fatalf("Wait across Close: %v, want cache.ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, claimErr := s.Claim(ctx, key1, "fp", lease)
	_, getErr := s.Get(ctx, key1)
	for name, err := range map[string]error{
		"Claim":   claimErr,
		"Get":     getErr,
		"Renew":   s.Renew(ctx, key1, c.Owner, lease),
		"Commit":  s.Commit(ctx, key1, c.Owner, storetest.JSONRecord(), ttl),
		"Release": s.Release(ctx, key1, c.Owner),
		"Delete":  s.Delete(ctx, key1),
		"Wait":    s.Wait(ctx, key1),
		"Ping":    s.Ping(ctx),
	} {
		if !errors.Is(err, cache.ErrClosed) {
			t.Errorf("%s after Close: %v, want cache.ErrClosed", name, err)
		}
	}
	_ = s.Stats() // does not panic
}

func TestOpenLockedDirectory(t *testing.T) {
	dir := t.TempDir()
	openStore(t, dir, storetest.NewClock())
	s2, err := Open(Options{Dir: dir})
	if err == nil {
		s2.Close()
		t.Fatal("second Open on the same directory succeeded")
	}
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("err = %v, want ErrLocked", err)
	}
	if msg := err.Error(); !strings.Contains(msg, dir) || !strings.Contains(msg, "another gateway process is using") {
		t.Fatalf("message %q does not name the directory and the other process", msg)
	}
}

func TestOpenOptions(t *testing.T) {
	if _, err := Open(Options{}); err == nil {
		t.Fatal("Open without Dir: no error")
	}
	// A non-lock failure is not reported as ErrLocked.
	file := t.TempDir() + "/file"
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Dir: file}); err == nil || errors.Is(err, ErrLocked) {
		t.Fatalf("Open on a file: %v", err)
	}
	// In memory, with the real clock, and a GC goroutine that stops on Close.
	m, err := Open(Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.Claim(ctx, key1, "fp", lease)
	if err != nil || c.Status != cache.Claimed {
		t.Fatalf("in-memory Claim: %+v %v", c, err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	d, err := Open(Options{Dir: t.TempDir(), GCInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestInvalidArguments(t *testing.T) {
	s := openStore(t, t.TempDir(), storetest.NewClock())
	bad := cache.Key{Endpoint: chatEP, ID: "has\nnewline"}
	if _, err := s.Claim(ctx, bad, "fp", lease); !errors.Is(err, cache.ErrInvalidKey) {
		t.Fatalf("Claim with bad key: %v", err)
	}
	if _, err := s.Claim(ctx, key1, "fp", 0); err == nil {
		t.Fatal("Claim with zero lease: no error")
	}
	c := mustClaim(t, s, key1, "fp", cache.Claimed)
	if err := s.Commit(ctx, key1, c.Owner, storetest.JSONRecord(), 0); err == nil {
		t.Fatal("Commit with zero ttl: no error")
	}
	if err := s.Commit(ctx, key1, c.Owner, nil, ttl); err == nil {
		t.Fatal("Commit of nil record: no error")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Claim(cctx, key1, "fp", lease); !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim with done ctx: %v", err)
	}
}

func TestStats(t *testing.T) {
	clock := storetest.NewClock()
	dir := t.TempDir()
	s := openStore(t, dir, clock)
	for i := range 5 {
		k := cache.Key{Scope: "acme", Endpoint: chatEP, ID: fmt.Sprintf("k%d", i)}
		c := mustClaim(t, s, k, "fp", cache.Claimed)
		if i < 3 {
			if err := s.Commit(ctx, k, c.Owner, storetest.JSONRecord(), ttl); err != nil {
				t.Fatal(err)
			}
		}
	}
	mustClaim(t, s, cache.Key{Scope: "acme2", Endpoint: chatEP, ID: "x"}, "fp", cache.Claimed)

	st := s.Stats()
	if st.Records != 6 || st.InFlight != 3 {
		t.Fatalf("Stats = %+v, want 6 records, 3 in flight", st)
	}
	if st.VLogBytes <= 0 {
		t.Fatalf("Stats.VLogBytes = %d on disk", st.VLogBytes)
	}
	mustClaim(t, s, cache.Key{Scope: "acme3", Endpoint: chatEP, ID: "y"}, "fp", cache.Claimed)
	if s.Stats().Records != 6 {
		t.Fatal("Stats not cached")
	}
	clock.Advance(statsMaxAge)
	if got := s.Stats().Records; got != 7 {
		t.Fatalf("Stats after cache expiry: %d records, want 7", got)
	}
}

func BenchmarkClaimCommit(b *testing.B) {
	s, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	rec := storetest.JSONRecord()
	rec.Body = incompressible(1024)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := cache.Key{Endpoint: chatEP, ID: fmt.Sprintf("bench-%d", i)}
		i++
		c, err := s.Claim(ctx, k, "fp", lease)
		if err != nil || c.Status != cache.Claimed {
			b.Fatal(c.Status, err)
		}
		if err := s.Commit(ctx, k, c.Owner, rec, ttl); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGet(b *testing.B) {
	s, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	rec := storetest.JSONRecord()
	rec.Body = incompressible(1024)
	c, err := s.Claim(ctx, key1, "fp", lease)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Commit(ctx, key1, c.Owner, rec, ttl); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Get(ctx, key1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKeyedRequest is the store's share of one keyed request that
// succeeds: Claim, Commit, and resolving the key's dead letter (none).
func BenchmarkKeyedRequest(b *testing.B) {
	s, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	rec := storetest.JSONRecord()
	rec.Body = incompressible(1024)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := cache.Key{Endpoint: chatEP, ID: fmt.Sprintf("bench-%d", i)}
		i++
		c, err := s.Claim(ctx, k, "fp", lease)
		if err != nil || c.Status != cache.Claimed {
			b.Fatal(c.Status, err)
		}
		if err := s.Commit(ctx, k, c.Owner, rec, ttl); err != nil {
			b.Fatal(err)
		}
		if err := s.DeleteDeadLetter(ctx, cache.DeadLetterID(k)); !errors.Is(err, cache.ErrNotFound) {
			b.Fatal(err)
		}
	}
}

// BenchmarkBurstHeap commits a burst of 30,000 keyed records of 1 KiB under
// random keys and reports the heap in use just after it, after a GC: mostly
// Badger's memtables and the table builders it pools (it frees one per 2 s
// of idleness).
func BenchmarkBurstHeap(b *testing.B) {
	rec := storetest.JSONRecord()
	rec.Body = incompressible(1024)
	for b.Loop() {
		s, err := Open(Options{Dir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		var id [12]byte
		for range 30_000 {
			rand.Read(id[:])
			k := cache.Key{Endpoint: chatEP, ID: hex.EncodeToString(id[:])}
			c, err := s.Claim(ctx, k, "fp", lease)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Commit(ctx, k, c.Owner, rec, ttl); err != nil {
				b.Fatal(err)
			}
		}
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
