package badgerstore

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/llmgate/llmgate/cache"
)

// gatedFlush is a commitGroup.flush that records each batch and, while
// held, blocks until released: the test decides who queues behind whom.
type gatedFlush struct {
	mu      sync.Mutex
	batches [][]string
	hold    chan struct{} // nil: no hold
	entered chan struct{}
	// result decides each batch's outcome; nil: all written.
	result func(keys []string) (int, error)
}

func (f *gatedFlush) flush(batch []*groupWrite) (int, error) {
	keys := make([]string, len(batch))
	for i, w := range batch {
		keys[i] = string(w.e.Key)
	}
	f.mu.Lock()
	f.batches = append(f.batches, keys)
	hold := f.hold
	f.mu.Unlock()
	if hold != nil {
		f.entered <- struct{}{}
		<-hold
	}
	if f.result != nil {
		return f.result(keys)
	}
	return len(batch), nil
}

// waitQueued waits until n commits are in g's queue.
func waitQueued(t *testing.T, g *commitGroup, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g.mu.Lock()
		got := len(g.queue)
		g.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue holds %d commits, want %d", got, n)
		}
		runtime.Gosched()
	}
}

// groupOf starts a leader ("a") whose flush blocks, queues the others
// behind it, releases the leader and returns each commit's error ("<key>
// panicked: …" for one whose write panicked on its goroutine).
func groupOf(t *testing.T, f *gatedFlush, others ...string) map[string]error {
	t.Helper()
	entries := make([]*badger.Entry, len(others))
	for i, k := range others {
		entries[i] = badger.NewEntry([]byte(k), []byte("v"))
	}
	errs, _ := groupOfEntries(t, f, entries...)
	return errs
}

// groupOfEntries is groupOf with the others' entries given, and the group
// returned for later commits.
func groupOfEntries(t *testing.T, f *gatedFlush, others ...*badger.Entry) (map[string]error, *commitGroup) {
	t.Helper()
	g := &commitGroup{flush: f.flush}
	f.hold, f.entered = make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	errs := map[string]error{}
	var wg sync.WaitGroup
	commit := func(e *badger.Entry) {
		defer wg.Done()
		key := string(e.Key)
		defer func() {
			if p := recover(); p != nil {
				mu.Lock()
				errs[key] = fmt.Errorf("%s panicked: %v", key, p)
				mu.Unlock()
			}
		}()
		err := g.write(e)
		mu.Lock()
		errs[key] = err
		mu.Unlock()
	}
	wg.Add(1)
	go commit(badger.NewEntry([]byte("a"), []byte("v")))
	<-f.entered
	for i, e := range others {
		wg.Add(1)
		go commit(e)
		waitQueued(t, g, i+2)
	}
	f.mu.Lock()
	hold := f.hold
	f.hold = nil // the next leaders write at once
	f.mu.Unlock()
	close(hold)
	wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) != 0 {
		t.Fatalf("queue left with %d commits", len(g.queue))
	}
	return errs, g
}

func TestCommitGroupWritesQueuedCommitsTogether(t *testing.T) {
	f := &gatedFlush{}
	errs := groupOf(t, f, "b", "c", "d")
	for k, err := range errs {
		if err != nil {
			t.Errorf("commit %s: %v", k, err)
		}
	}
	// The leader wrote alone; the three that queued behind it went in one
	// transaction, in arrival order.
	want := [][]string{{"a"}, {"b", "c", "d"}}
	if !slices.EqualFunc(f.batches, want, slices.Equal) {
		t.Fatalf("batches %v, want %v", f.batches, want)
	}
}

func TestCommitGroupFailedTransactionFailsEachCommitInIt(t *testing.T) {
	full := errors.New("no room to write")
	f := &gatedFlush{result: func(keys []string) (int, error) {
		if keys[0] == "a" {
			return 1, nil
		}
		return len(keys), full
	}}
	errs := groupOf(t, f, "b", "c")
	if errs["a"] != nil {
		t.Errorf("a, written alone: %v", errs["a"])
	}
	for _, k := range []string{"b", "c"} {
		if !errors.Is(errs[k], full) {
			t.Errorf("commit %s: %v, want the transaction's error", k, errs[k])
		}
	}
}

func TestCommitGroupRefusedEntryFailsOnlyItself(t *testing.T) {
	tooBig := errors.New("value too big")
	f := &gatedFlush{result: func(keys []string) (int, error) {
		// Like writeGroup: "c" is refused; before it, the batch ends; as
		// the first, it fails alone.
		if i := slices.Index(keys, "c"); i > 0 {
			return i, nil
		} else if i == 0 {
			return 1, tooBig
		}
		return len(keys), nil
	}}
	errs := groupOf(t, f, "b", "c", "d")
	for _, k := range []string{"a", "b", "d"} {
		if errs[k] != nil {
			t.Errorf("commit %s: %v", k, errs[k])
		}
	}
	if !errors.Is(errs["c"], tooBig) {
		t.Errorf("commit c: %v, want its own refusal", errs["c"])
	}
	want := [][]string{{"a"}, {"b", "c", "d"}, {"c", "d"}, {"d"}}
	if !slices.EqualFunc(f.batches, want, slices.Equal) {
		t.Fatalf("batches %v, want %v", f.batches, want)
	}
}

// Many committers, no hold: every entry is flushed exactly once and every
// commit returns (run with -race).
func TestCommitGroupEveryEntryOnce(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	g := &commitGroup{flush: func(batch []*groupWrite) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, w := range batch {
			seen[string(w.e.Key)]++
		}
		runtime.Gosched() // let others queue
		return len(batch), nil
	}}
	const writers, each = 16, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if err := g.write(badger.NewEntry(fmt.Appendf(nil, "%d-%d", w, i), nil)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if len(seen) != writers*each {
		t.Fatalf("%d entries flushed, want %d", len(seen), writers*each)
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("entry %s flushed %d times", k, n)
		}
	}
}

// writeGroup on real Badger: an entry Badger refuses ends the transaction
// before it, and fails alone when it comes first; the others are stored.
func TestWriteGroupRefusedEntry(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	entry := func(key string, size int) *groupWrite {
		return &groupWrite{e: badger.NewEntry([]byte(key), make([]byte, size))}
	}
	huge := entry("huge", valueLogFileSize+1) // above Badger's limit for one value
	batch := []*groupWrite{entry("one", 10), huge, entry("two", 10)}
	n, err := s.writeGroup(batch)
	if n != 1 || err != nil {
		t.Fatalf("first transaction: n=%d err=%v, want 1 and nil", n, err)
	}
	n, err = s.writeGroup(batch[1:])
	if n != 1 || err == nil {
		t.Fatalf("refused entry alone: n=%d err=%v, want 1 and Badger's refusal", n, err)
	}
	if n, err = s.writeGroup(batch[2:]); n != 1 || err != nil {
		t.Fatalf("last: n=%d err=%v", n, err)
	}
	for key, want := range map[string]bool{"one": true, "huge": false, "two": true} {
		err := s.db.View(func(txn *badger.Txn) error { _, err := txn.Get([]byte(key)); return err })
		if got := err == nil; got != want {
			t.Errorf("%s stored: %v (%v), want %v", key, got, err, want)
		}
	}
}

// Concurrent Commits on real Badger all land, grouped or not, and survive a
// reopen.
func TestConcurrentCommitsAllDurable(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			k := cache.Key{Endpoint: chatEP, ID: fmt.Sprintf("group-%d", i)}
			c, err := s.Claim(ctx, k, "fp", lease)
			if err != nil || c.Status != cache.Claimed {
				t.Errorf("claim %d: %v %v", i, c.Status, err)
				return
			}
			rec := &cache.Record{Status: 200, Body: fmt.Appendf(nil, "body %d", i)}
			if err := s.Commit(ctx, k, c.Owner, rec, ttl); err != nil {
				t.Errorf("commit %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range n {
		r, err := s.Get(ctx, cache.Key{Endpoint: chatEP, ID: fmt.Sprintf("group-%d", i)})
		if err != nil || r.State != cache.Committed || string(r.Body) != fmt.Sprintf("body %d", i) {
			t.Fatalf("record %d after reopen: %+v %v", i, r, err)
		}
	}
}

// A write that panics fails the commits queued in its batch, panics on the
// leader's goroutine, and leaves the group working for later commits.
func TestCommitGroupSurvivesPanickingFlush(t *testing.T) {
	f := &gatedFlush{result: func(keys []string) (int, error) {
		if keys[0] == "b" {
			panic("badger broke")
		}
		return len(keys), nil
	}}
	errs, g := groupOfEntries(t, f, badger.NewEntry([]byte("b"), nil), badger.NewEntry([]byte("c"), nil))
	if errs["a"] != nil {
		t.Errorf("a, written alone: %v", errs["a"])
	}
	if err := errs["b"]; err == nil || err.Error() != "b panicked: badger broke" {
		t.Errorf("b, the leader of the panicking write: %v, want its panic", err)
	}
	if !errors.Is(errs["c"], errFlushPanicked) {
		t.Errorf("c, in the panicking write: %v, want errFlushPanicked", errs["c"])
	}
	if err := g.write(badger.NewEntry([]byte("d"), nil)); err != nil {
		t.Fatalf("a commit after the panic: %v", err)
	}
}

// A group takes no more than maxGroupBytes of values (one transaction's
// values all go into one value-log file); an entry larger than that goes
// alone.
func TestCommitGroupBoundsBytes(t *testing.T) {
	big := make([]byte, maxGroupBytes/3+1)
	var others []*badger.Entry
	for _, k := range []string{"b", "c", "d", "e", "huge", "f"} {
		v := big
		if k == "huge" {
			v = make([]byte, 2*maxGroupBytes)
		}
		others = append(others, badger.NewEntry([]byte(k), v))
	}
	f := &gatedFlush{}
	errs, _ := groupOfEntries(t, f, others...)
	for k, err := range errs {
		if err != nil {
			t.Errorf("commit %s: %v", k, err)
		}
	}
	want := [][]string{{"a"}, {"b", "c"}, {"d", "e"}, {"huge"}, {"f"}}
	if !slices.EqualFunc(f.batches, want, slices.Equal) {
		t.Fatalf("batches %v, want %v (b to f hold %d bytes each but huge, %d)", f.batches, want, len(big), 2*maxGroupBytes)
	}
}

// A flush that reports no entry written and no error does not pass for a
// write: the leader gets an error.
func TestCommitGroupNothingWrittenIsAnError(t *testing.T) {
	g := &commitGroup{flush: func([]*groupWrite) (int, error) { return 0, nil }}
	if err := g.write(badger.NewEntry([]byte("a"), nil)); !errors.Is(err, errNothingWritten) {
		t.Fatalf("write: %v, want errNothingWritten", err)
	}
}
