package badgerstore

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"

	"github.com/llmgate/llmgate/cache"
)

// live is what the store's live entries — records, dead letters, owner
// entries that have not expired or been deleted — take: their keys and
// values, as Badger reports them to a key-only scan. This, not the size of
// the files, is what store.max_bytes caps (Options.MaxBytes): a purge or
// an expiry gives the cap back at the next scan, while the files shrink
// only when compaction and the value-log GC have rewritten them (see
// reclaim), which may take minutes and needs the disk's reserve.
//
// A scan costs a pass over the LSM tree's keys (no value is read), so the
// figure between scans is the last scan's sum plus every byte written
// since the scan began: it may be over (an overwrite, a delete or an
// expiry since counts until the next scan), never under, so a write
// checked against it never takes the store past its cap.
//
// Deletes the store knows the size of — the letters a new dead letter
// drops to keep its client within its bound, and the letter it replaces —
// are taken off at once (freed): otherwise a client churning its letters
// within its bound would raise the figure by its whole write rate until
// the next scan, and take the cap from every other client's keyed
// requests. A delete is taken off before its transaction commits, and
// freed's mark is read when a scan ends, so a delete the scan did not see
// is taken off at most once: still never under (a write that then fails
// gives its deletes back).
type live struct {
	written atomic.Int64 // bytes written since Open
	freed   atomic.Int64 // bytes of known live entries deleted since Open
	checks  atomic.Int64 // space checks, for maybeRescanLive

	mu        sync.Mutex
	base      int64 // the last scan's sum
	mark      int64 // written when it began
	freedMark int64 // freed when it ended
}

// bytes is the live figure now.
func (l *live) bytes() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.base + l.written.Load() - l.mark - (l.freed.Load() - l.freedMark)
}

// deleted takes n bytes of live entries being deleted off the figure
// (negative: gives them back).
func (l *live) deleted(n int64) { l.freed.Add(n) }

// wrote counts an entry of key and value bytes just written.
func (l *live) wrote(key, value int) { l.written.Add(int64(key + value)) }

// rescanLive sums the live entries afresh.
func (s *Store) rescanLive() error {
	mark := s.live.written.Load()
	var sum int64
	if err := s.eachKey(nil, func(item *badger.Item) { sum += item.KeySize() + item.ValueSize() }); err != nil {
		return err
	}
	s.live.mu.Lock()
	s.live.base, s.live.mark, s.live.freedMark = sum, mark, s.live.freed.Load()
	s.live.mu.Unlock()
	return nil
}

// roomUnderCap fails with cache.ErrFull when n more bytes would take the
// live entries past Options.MaxBytes. Dead letters are checked with it
// before they are written: they are what a client's failing keyed requests
// write after admission, so Space's Full alone would not stop them.
func (s *Store) roomUnderCap(n int64) error {
	if s.space == nil || s.space.maxBytes <= 0 {
		return nil
	}
	if used := s.live.bytes(); used+n > s.space.maxBytes {
		return fmt.Errorf("%d live bytes and %d more would pass store.max_bytes (%d): %w", used, n, s.space.maxBytes, cache.ErrFull)
	}
	return nil
}

// liveRescanEvery is how many space checks pass between rescans of the
// live entries while they are under half of MaxBytes; over it, every check
// rescans, so an expiry or a purge gives the cap back within one
// SpaceInterval (1s by default).
const liveRescanEvery = 30

// maybeRescanLive is the space check's rescan of the live entries (see
// liveRescanEvery).
func (s *Store) maybeRescanLive() {
	if s.space.maxBytes <= 0 {
		return
	}
	n := s.live.checks.Add(1)
	if s.live.bytes()*2 < s.space.maxBytes && n%liveRescanEvery != 0 {
		return
	}
	unlock, err := s.begin(context.Background())
	if err != nil {
		return
	}
	defer unlock()
	if err := s.rescanLive(); err != nil {
		s.log.Warn("sizing the store's live entries", slog.Any("err", err))
	}
}
