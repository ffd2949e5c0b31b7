package badgerstore

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

func TestBadgerDeadLetterBound(t *testing.T) {
	storetest.RunDeadLetterBound(t, func(t *testing.T, now func() time.Time, b cache.DeadLetterBound) storetest.DeadLetterStore {
		s, err := Open(Options{Dir: t.TempDir(), Now: now, DeadLetters: b})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestDeadLetterBoundAfterReopen: the index of each client's letters is
// read back at Open, so a restarted store keeps the bound on the letters
// written before it.
func TestDeadLetterBoundAfterReopen(t *testing.T) {
	dir := t.TempDir()
	clock := storetest.NewClock()
	open := func() *Store {
		s, err := Open(Options{Dir: dir, Now: clock.Now, DeadLetters: cache.DeadLetterBound{MaxCount: 2}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	put := func(s *Store, id string) *cache.DeadLetter {
		clock.Advance(time.Second)
		d := &cache.DeadLetter{Class: "transient", LastAt: clock.Now()}
		if err := s.PutDeadLetter(ctx, cache.Key{Scope: "mallory", Endpoint: chatEP, ID: id}, d, time.Hour); err != nil {
			t.Fatal(err)
		}
		return d
	}
	s := open()
	first := put(s, "m1")
	put(s, "m2")
	s.Close()
	s = open()
	defer s.Close()
	if d := put(s, "m3"); len(d.Dropped) != 1 || d.Dropped[0] != first.ID {
		t.Fatalf("after a reopen: dropped %v, want the oldest %s", d.Dropped, first.ID)
	}
}

// TestDeadLettersNeverPastTheCap: dead letters are written after a keyed
// request was admitted, so the cap is checked at the write: a store fills
// with letters up to store.max_bytes and refuses the next with
// cache.ErrFull, its live bytes never past the cap, and Space reports it
// full.
func TestDeadLettersNeverPastTheCap(t *testing.T) {
	clock := storetest.NewClock()
	disk := &fakeDisk{}
	disk.free.Store(1 << 40)
	const maxBytes = 512 << 10
	s := openSpaceStore(t, t.TempDir(), clock, disk, maxBytes)
	body := make([]byte, 64<<10)
	var err error
	n := 0
	for ; n < 100; n++ {
		d := &cache.DeadLetter{Body: body, Class: "transient", LastAt: clock.Now()}
		err = s.PutDeadLetter(ctx, cache.Key{Scope: fmt.Sprint("client-", n%3), Endpoint: chatEP, ID: fmt.Sprint(n)}, d, time.Hour)
		if err != nil {
			break
		}
	}
	if !errors.Is(err, cache.ErrFull) || n == 0 {
		t.Fatalf("after %d letters: %v, want cache.ErrFull", n, err)
	}
	if live := s.live.bytes(); live > maxBytes {
		t.Fatalf("live bytes %d past the cap %d", live, maxBytes)
	}
	if err := s.rescanLive(); err != nil {
		t.Fatal(err)
	}
	if live := s.live.bytes(); live > maxBytes || live < maxBytes-100<<10 {
		t.Fatalf("rescanned live bytes %d, want just under the cap %d", live, maxBytes)
	}
	t.Logf("%d letters of 64 KiB stored under a %d-byte cap; live %d bytes", n, maxBytes, s.live.bytes())
}

// TestChurnWithinTheBoundKeepsTheCap: a client whose failing keyed requests
// keep replacing its oldest letters stays within its bound, so what it
// holds in the store does not grow, and neither may the live figure the
// cap is checked against: the letters each new one drops are taken off at
// once, not at the next scan (SpaceInterval here is an hour). Otherwise its
// churn takes the cap from every client: their keyed requests get
// idempotency_store_full and their letters are refused.
func TestChurnWithinTheBoundKeepsTheCap(t *testing.T) {
	clock := storetest.NewClock()
	disk := &fakeDisk{}
	disk.free.Store(1 << 40)
	const maxBytes = 1 << 20
	s, err := Open(Options{Dir: t.TempDir(), Now: clock.Now, After: clock.After, Statfs: disk.statfs,
		MinFreeBytes: testFloor, MaxBytes: maxBytes, SpaceInterval: time.Hour,
		DeadLetters: cache.DeadLetterBound{MaxBytes: 256 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	body := make([]byte, 64<<10)
	for n := range 100 {
		clock.Advance(time.Millisecond)
		d := &cache.DeadLetter{Body: body, Class: "transient", LastAt: clock.Now()}
		if err := s.PutDeadLetter(ctx, cache.Key{Scope: "mallory", Endpoint: chatEP, ID: fmt.Sprint(n)}, d, time.Hour); err != nil {
			t.Fatalf("letter %d of a client within its bound: %v (live figure %d, cap %d)", n, err, s.live.bytes(), maxBytes)
		}
	}
	figure := s.live.bytes()
	if err := s.rescanLive(); err != nil {
		t.Fatal(err)
	}
	truth := s.live.bytes()
	// A few bytes under the scan are Badger's: its ValueSize of a value in
	// the value log is 5 bytes over what was written, as before.
	if figure < truth-1<<10 || figure > truth+100<<10 {
		t.Fatalf("live figure %d after the churn, %d when scanned: want it within a letter of the scan", figure, truth)
	}
	if sp := s.Space(); sp.Full {
		t.Fatalf("store full after one client's churn within its bound: %+v", sp)
	}
	d := &cache.DeadLetter{Body: body, Class: "transient", LastAt: clock.Now()}
	if err := s.PutDeadLetter(ctx, cache.Key{Scope: "alice", Endpoint: chatEP, ID: "a1"}, d, time.Hour); err != nil {
		t.Fatalf("another client's letter after the churn: %v", err)
	}
}
