package storetest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
)

// DeadLetterStore is what RunDeadLetterBound exercises.
type DeadLetterStore interface {
	PutDeadLetter(ctx context.Context, k cache.Key, d *cache.DeadLetter, ttl time.Duration) error
	GetDeadLetter(ctx context.Context, id string) (*cache.DeadLetter, error)
	DeleteDeadLetter(ctx context.Context, id string) error
	ListDeadLetters(ctx context.Context, f cache.DeadLetterFilter) ([]cache.DeadLetter, error)
	PurgeScope(ctx context.Context, scope string) (cache.Purged, error)
}

// openBound opens a fresh, empty store on the given clock with the given
// bound on dead letters.
type openBound func(t *testing.T, now func() time.Time, b cache.DeadLetterBound) DeadLetterStore

// RunDeadLetterBound runs the per-client bound on dead letters every store
// must keep (cache.DeadLetterBound), each case on a fresh, empty store
// that open returns on the given clock with the given bound.
func RunDeadLetterBound(t *testing.T, open func(t *testing.T, now func() time.Time, b cache.DeadLetterBound) DeadLetterStore) {
	t.Run("over the count the client's own oldest go", func(t *testing.T) { boundCount(t, open) })
	t.Run("over the bytes the client's own oldest go", func(t *testing.T) { boundBytes(t, open) })
	t.Run("a letter alone over the bytes is kept alone", func(t *testing.T) { boundAloneOver(t, open) })
	t.Run("a key failing again replaces its letter", func(t *testing.T) { boundReplace(t, open) })
	t.Run("resolved and purged letters stop counting", func(t *testing.T) { boundResolved(t, open) })
}

// letterWeek is a dead letter's ttl in these cases.
const letterWeek = 7 * 24 * time.Hour

// letterBody is every case's letter body.
var letterBody = bytes.Repeat([]byte("x"), 10<<10)

// putLetter records a letter for client's key id, a second after the last.
func putLetter(t *testing.T, s DeadLetterStore, clock *Clock, client, id string) *cache.DeadLetter {
	t.Helper()
	clock.Advance(time.Second)
	d := &cache.DeadLetter{Body: letterBody, BodySize: len(letterBody), Class: "transient", LastAt: clock.Now(), FirstAt: clock.Now()}
	if err := s.PutDeadLetter(ctx, cache.Key{Scope: client, Endpoint: chatEP, ID: id}, d, letterWeek); err != nil {
		t.Fatalf("PutDeadLetter %s %s: %v", client, id, err)
	}
	return d
}

// wantLetters checks client's letters are those of ids, in order.
func wantLetters(t *testing.T, s DeadLetterStore, client string, ids ...string) {
	t.Helper()
	ds, err := s.ListDeadLetters(ctx, cache.DeadLetterFilter{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range ds {
		got = append(got, d.Key)
	}
	slices.Sort(got)
	if !slices.Equal(got, ids) {
		t.Fatalf("%s's letters = %v, want %v", client, got, ids)
	}
}

// boundCount: over the count the client's own oldest go.
func boundCount(t *testing.T, open openBound) {
	clock := NewClock()
	s := open(t, clock.Now, cache.DeadLetterBound{MaxCount: 3})
	putLetter(t, s, clock, "alice", "a1")
	putLetter(t, s, clock, "alice", "a2")
	var dropped []string
	for i := 1; i <= 5; i++ {
		d := putLetter(t, s, clock, "mallory", fmt.Sprintf("m%d", i))
		dropped = append(dropped, d.Dropped...)
	}
	wantLetters(t, s, "mallory", "m3", "m4", "m5")
	wantLetters(t, s, "alice", "a1", "a2")
	m1 := cache.DeadLetterID(cache.Key{Scope: "mallory", Endpoint: chatEP, ID: "m1"})
	m2 := cache.DeadLetterID(cache.Key{Scope: "mallory", Endpoint: chatEP, ID: "m2"})
	if !slices.Equal(dropped, []string{m1, m2}) {
		t.Fatalf("Dropped = %v, want %v", dropped, []string{m1, m2})
	}
	if _, err := s.GetDeadLetter(ctx, m1); err == nil {
		t.Fatal("a dropped letter is still readable")
	}
}

// boundBytes: over the bytes the client's own oldest go.
func boundBytes(t *testing.T, open openBound) {
	clock := NewClock()
	probe := open(t, clock.Now, cache.DeadLetterBound{})
	d := putLetter(t, probe, clock, "x", "probe")
	got, err := probe.GetDeadLetter(ctx, d.ID)
	if err != nil || got.Stored < int64(len(letterBody)) {
		t.Fatalf("Stored = %+v, %v; want at least the body", got, err)
	}
	s := open(t, clock.Now, cache.DeadLetterBound{MaxBytes: got.Stored*5/2 + 16})
	putLetter(t, s, clock, "alice", "a1")
	for i := 1; i <= 4; i++ {
		putLetter(t, s, clock, "mallory", fmt.Sprintf("m%d", i))
	}
	wantLetters(t, s, "mallory", "m3", "m4")
	wantLetters(t, s, "alice", "a1")
	var sum int64
	ds, _ := s.ListDeadLetters(ctx, cache.DeadLetterFilter{Client: "mallory"})
	for _, d := range ds {
		sum += d.Stored
	}
	if sum > got.Stored*5/2+16 {
		t.Fatalf("mallory keeps %d bytes, over the bound", sum)
	}
}

// boundAloneOver: a letter alone over the bytes is kept alone.
func boundAloneOver(t *testing.T, open openBound) {
	clock := NewClock()
	s := open(t, clock.Now, cache.DeadLetterBound{MaxBytes: 100})
	putLetter(t, s, clock, "mallory", "m1")
	wantLetters(t, s, "mallory", "m1")
	putLetter(t, s, clock, "mallory", "m2")
	wantLetters(t, s, "mallory", "m2")
}

// boundReplace: a key failing again replaces its letter.
func boundReplace(t *testing.T, open openBound) {
	clock := NewClock()
	s := open(t, clock.Now, cache.DeadLetterBound{MaxCount: 2})
	putLetter(t, s, clock, "mallory", "m1")
	putLetter(t, s, clock, "mallory", "m2")
	if d := putLetter(t, s, clock, "mallory", "m2"); len(d.Dropped) != 0 || d.Failures != 2 {
		t.Fatalf("again: dropped %v, failures %d", d.Dropped, d.Failures)
	}
	wantLetters(t, s, "mallory", "m1", "m2")
}

// boundResolved: resolved and purged letters stop counting.
func boundResolved(t *testing.T, open openBound) {
	clock := NewClock()
	s := open(t, clock.Now, cache.DeadLetterBound{MaxCount: 2})
	d1 := putLetter(t, s, clock, "mallory", "m1")
	putLetter(t, s, clock, "mallory", "m2")
	if err := s.DeleteDeadLetter(ctx, d1.ID); err != nil {
		t.Fatal(err)
	}
	if d := putLetter(t, s, clock, "mallory", "m3"); len(d.Dropped) != 0 {
		t.Fatalf("after a resolve: dropped %v", d.Dropped)
	}
	wantLetters(t, s, "mallory", "m2", "m3")
	if _, err := s.PurgeScope(ctx, "mallory"); err != nil {
		t.Fatal(err)
	}
	putLetter(t, s, clock, "mallory", "m4")
	if d := putLetter(t, s, clock, "mallory", "m5"); len(d.Dropped) != 0 {
		t.Fatalf("after a purge: dropped %v", d.Dropped)
	}
	wantLetters(t, s, "mallory", "m4", "m5")
}
