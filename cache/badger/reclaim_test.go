package badgerstore

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

// TestPurgeGivesSpaceBack: a store filled to store.max_bytes by one
// tenant is full; purging that tenant takes it out of the full state at
// once, without a restart, and another tenant's commits succeed; the
// store then reclaims its disk by itself (Flatten, value-log GC), off
// the request path.
func TestPurgeGivesSpaceBack(t *testing.T) {
	clock := storetest.NewClock()
	disk := &fakeDisk{}
	disk.free.Store(1 << 40)
	const maxBytes = 40 << 20
	logs := &logBuffer{}
	s, err := Open(Options{Dir: t.TempDir(), Now: clock.Now, After: clock.After, Statfs: disk.statfs, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		MinFreeBytes: testFloor, MaxBytes: maxBytes, SpaceInterval: time.Hour, GCInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	rec := &cache.Record{Status: 200, Body: make([]byte, 64<<10)}
	commit := func(scope string, i int) error {
		k := cache.Key{Scope: scope, Endpoint: chatEP, ID: fmt.Sprint(i)}
		c := mustClaim(t, s, k, "fp", cache.Claimed)
		err := s.Commit(ctx, k, c.Owner, rec, ttl)
		if err != nil {
			s.Release(ctx, k, c.Owner)
		}
		return err
	}
	n := 0
	for ; !s.Space().Full; n++ {
		if err := commit("mallory", n); err != nil {
			t.Fatalf("commit %d: %v", n, err)
		}
		if n > 10_000 {
			t.Fatal("never full")
		}
		s.space.mu.Lock()
		s.space.last.At = time.Time{}
		s.space.mu.Unlock()
	}
	for i := range 20 {
		d := &cache.DeadLetter{Body: make([]byte, 32<<10), LastAt: clock.Now()}
		if err := s.PutDeadLetter(ctx, cache.Key{Scope: "mallory", Endpoint: chatEP, ID: fmt.Sprint("dl", i)}, d, ttl); err != nil {
			break // full: refused
		}
	}
	full := s.Space()
	if !full.Full || full.Reason != cache.FullOverCap {
		t.Fatalf("after %d commits: %+v, want full over the cap", n, full)
	}
	lsm, vlog := dirSizes(s.dir)
	before := lsm + vlog
	start := time.Now()
	p, err := s.PurgeScope(ctx, "mallory")
	if err != nil || p.Records != n {
		t.Fatalf("purge: %+v, %v; want %d records", p, err, n)
	}
	after := s.Space()
	left := time.Since(start)
	if after.Full || after.LiveBytes > maxBytes/100 {
		t.Fatalf("after the purge: %+v, want room at once", after)
	}
	for i := range 5 {
		if err := commit("alice", i); err != nil {
			t.Fatalf("alice's commit after the purge: %v", err)
		}
	}
	select {
	case <-s.reclaimed:
	case <-time.After(time.Minute):
		t.Fatal("the purge started no reclaim")
	}
	lsm, vlog = dirSizes(s.dir)
	t.Log(logs.String())
	t.Logf("%d commits of 64 KiB filled a %d-byte cap: live %d bytes, files %d bytes; purged (%v to leave the full state): live %d bytes; reclaimed: files %d bytes",
		n, maxBytes, full.LiveBytes, before, left, after.LiveBytes, lsm+vlog)
	for i := range 5 {
		k := cache.Key{Scope: "alice", Endpoint: chatEP, ID: fmt.Sprint(i)}
		if got, err := s.Get(ctx, k); err != nil || len(got.Body) != len(rec.Body) {
			t.Fatalf("alice's record %d after the reclaim: %v", i, err)
		}
	}
	if lsm+vlog > before/2 {
		t.Fatalf("files %d bytes after the reclaim, were %d: less than half given back", lsm+vlog, before)
	}
}

type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
