package badgerstore

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"
)

// commitGroup writes concurrent Commits to Badger together, in one
// transaction, the way LevelDB's writers queue: each commit joins the
// queue; the one at its front (the leader) writes every entry queued by
// then, up to maxGroup, marks them done and hands the front to the next
// waiting commit. A commit that arrives alone is written alone, at once.
//
// What it saves is Badger's work per transaction, not per entry: a
// transaction's read and commit timestamps (the oracle's lock, its two
// watermarks, each mark a channel send to a goroutine of Badger's), its
// write request and the wait for it. At 16 clients of new keys on two
// cores most commits overlap, and those costs were a fifth of a keyed
// request's extra CPU (issue 26).
//
// Durability is unchanged: every commit returns only once the transaction
// that holds its entry is in Badger's write-ahead log, as before; a
// transaction that fails fails every commit in it, and each stays in
// flight for its owner to release, as a failed commit of its own would
// (one whose write panicked may have reached Badger all the same, as a
// single commit's could: it is released and its retry runs again).
// An entry Badger refuses on its own (too big for a transaction) fails
// only itself: the entries before it are written, and the rest wait for
// the next transaction.
type commitGroup struct {
	// flush writes one transaction's entries, the first n of batch (n ≥ 1
	// when batch is not empty), and reports n and the outcome for them.
	flush func(batch []*groupWrite) (n int, err error)

	mu    sync.Mutex
	queue []*groupWrite // queue[0] is writing or about to
	// flushes counts the transactions written (benchmarks report commits
	// per transaction).
	flushes atomic.Int64
}

// maxGroup and maxGroupBytes bound one transaction: its entries, and the
// bytes of their values (the first entry goes in whatever its size).
// Records above the value
// threshold count in Badger's batch limit as a pointer each, so the count
// stays far below it; the bytes matter because Badger starts a new
// value-log file only between transactions, so one transaction's values
// all land in one file — the file's size (ValueLogFileSize), which the
// space reserve, the GC and the rotation's msync are sized by, may be
// passed by one transaction's bytes, as it always could by one record's.
// Both bounds also keep a leader's write, which every commit in it waits
// for, short.
const (
	maxGroup      = 64
	maxGroupBytes = 1 << 20
)

// batchAt is the longest prefix of queue within the bounds, the first
// entry always included.
func batchAt(queue []*groupWrite) []*groupWrite {
	n, size := 1, len(queue[0].e.Value)
	for n < min(len(queue), maxGroup) {
		size += len(queue[n].e.Value)
		if size > maxGroupBytes {
			break
		}
		n++
	}
	return queue[:n]
}

type groupWrite struct {
	e    *badger.Entry
	err  error
	done bool
	wake chan struct{} // one slot: done, or now at the front
}

var groupWrites = sync.Pool{New: func() any { return &groupWrite{wake: make(chan struct{}, 1)} }}

// write stores e through the group: it returns once e is written, in a
// transaction of its own or with others, with that transaction's outcome.
func (g *commitGroup) write(e *badger.Entry) error {
	w := groupWrites.Get().(*groupWrite)
	w.e = e
	g.mu.Lock()
	g.queue = append(g.queue, w)
	for !w.done && g.queue[0] != w {
		g.mu.Unlock()
		<-w.wake
		g.mu.Lock()
	}
	if !w.done {
		g.lead(w)
	}
	err := w.err
	g.mu.Unlock()
	*w = groupWrite{wake: w.wake}
	groupWrites.Put(w)
	return err
}

// errFlushPanicked is what the commits a panicking flush was writing get
// (the leader's own goroutine panics on).
var errFlushPanicked = errors.New("the store's write panicked")

// errNothingWritten is what a leader gets from a flush that wrote none of
// its batch and said no more.
var errNothingWritten = errors.New("the store's write took no entry")

// lead writes the batch at the queue's front, w's, settles it and hands
// the front on. Called and returns with g.mu held. Should the write panic,
// the batch is settled as failed and the front handed on all the same, so
// that no later commit waits for ever behind it.
func (g *commitGroup) lead(w *groupWrite) {
	batch := batchAt(g.queue)
	g.mu.Unlock()
	n, err := len(batch), errFlushPanicked
	returned := false
	defer func() {
		g.mu.Lock()
		g.settle(w, batch[:n], err)
		if !returned {
			g.mu.Unlock() // panicking: write's Unlock does not run
		}
	}()
	n, err = g.flush(batch)
	g.flushes.Add(1)
	if n < 1 && err == nil {
		err = errNothingWritten // never report unwritten as written
	}
	n = max(1, min(n, len(batch))) // the leader's own entry is always settled
	returned = true
}

// settle marks done the batch at the queue's front, wakes its commits but
// the leader w, and wakes the next front. The caller holds g.mu.
func (g *commitGroup) settle(w *groupWrite, done []*groupWrite, err error) {
	for _, o := range done {
		o.err, o.done = err, true
		if o != w {
			o.wake <- struct{}{}
		}
	}
	rest := copy(g.queue, g.queue[len(done):])
	clear(g.queue[rest:])
	g.queue = g.queue[:rest]
	if rest > 0 {
		g.queue[0].wake <- struct{}{}
	}
}

// writeGroup is the store's commitGroup.flush: one transaction with the
// batch's entries. An entry SetEntry refuses ends the batch before it; if
// it is the first, it alone fails. A failure before any entry is set (no
// room to write, the store closing) fails the whole batch.
func (s *Store) writeGroup(batch []*groupWrite) (n int, err error) {
	err = s.update(func(txn *badger.Txn) error {
		for i, w := range batch {
			if err := txn.SetEntry(w.e); err != nil {
				if i == 0 {
					n = 1
					return err
				}
				n = i
				return nil
			}
		}
		n = len(batch)
		return nil
	})
	if n == 0 {
		n = len(batch)
	}
	return n, err
}
