package cache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// DeadLetter is a keyed request that finally failed: its retries ended on
// transient failures, its upstream's breaker was open with no fallback, or
// its deadline ran out. It is kept for diagnosis and replay, one record per
// key: a later failure of the same key updates it, a later success removes
// it. Headers are never stored — the body is the client's, headers may
// carry secrets.
type DeadLetter struct {
	ID            string    `json:"id"`
	Client        string    `json:"client"`
	Endpoint      string    `json:"endpoint"`
	Key           string    `json:"idempotency_key"`
	Model         string    `json:"model,omitempty"`
	Body          []byte    `json:"-"`
	BodySize      int       `json:"body_size"`
	BodyTruncated bool      `json:"body_truncated,omitempty"`
	Upstreams     []string  `json:"upstreams"`
	Attempts      int       `json:"attempts"`
	Failures      int       `json:"failures"`
	Class         string    `json:"class"`
	Message       string    `json:"message"`
	Status        int       `json:"status,omitempty"`
	FirstAt       time.Time `json:"first_at"`
	LastAt        time.Time `json:"last_at"`
	ExpiresAt     time.Time `json:"expires_at"`
}

// DeadLetterID is the stable id of the dead letter for a key.
func DeadLetterID(k Key) string {
	h := sha256.New()
	h.Write([]byte(k.Scope))
	h.Write([]byte{0})
	h.Write([]byte(k.Endpoint))
	h.Write([]byte{0})
	h.Write([]byte(k.ID))
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// DeadLetterFilter selects dead letters for listing. Empty fields match all.
type DeadLetterFilter struct {
	Upstream, Class, Client string
}

func (f DeadLetterFilter) match(d *DeadLetter) bool {
	if f.Class != "" && d.Class != f.Class {
		return false
	}
	if f.Client != "" && d.Client != f.Client {
		return false
	}
	if f.Upstream != "" && !slices.Contains(d.Upstreams, f.Upstream) {
		return false
	}
	return true
}

// maxDeadLetters bounds how many dead letters a listing reads; a queue
// that long needs an operator, and the alert says so long before.
const maxDeadLetters = 100_000

const deadLetterNS = 'd'

const deadLetterVersion = 1

func deadLetterKey(id string) []byte { return append([]byte{deadLetterNS, 0}, id...) }

// deadLetterRecord is the stored form: the JSON fields plus the body.
type deadLetterRecord struct {
	DeadLetter
	Body []byte `json:"body"`
}

func encodeDeadLetter(d *DeadLetter) ([]byte, error) {
	b, err := json.Marshal(deadLetterRecord{DeadLetter: *d, Body: d.Body})
	if err != nil {
		return nil, err
	}
	return append([]byte{deadLetterVersion}, b...), nil
}

func decodeDeadLetter(b []byte) (*DeadLetter, error) {
	if len(b) == 0 || b[0] != deadLetterVersion {
		return nil, fmt.Errorf("dead letter: %w", errUnknownVersion)
	}
	var r deadLetterRecord
	if err := json.Unmarshal(b[1:], &r); err != nil {
		return nil, fmt.Errorf("dead letter: %w", err)
	}
	d := r.DeadLetter
	d.Body = r.Body
	return &d, nil
}

// mergeDeadLetter folds an earlier record of the same key into d: the first
// failure time and the failure count carry over.
func mergeDeadLetter(d, prev *DeadLetter) {
	d.Failures = 1
	if prev == nil {
		return
	}
	d.Failures = prev.Failures + 1
	if !prev.FirstAt.IsZero() && prev.FirstAt.Before(d.FirstAt) {
		d.FirstAt = prev.FirstAt
	}
}

// PutDeadLetter records d (its ID is set from its key), merging with an
// earlier record of the same key. It expires after ttl.
func (s *Badger) PutDeadLetter(ctx context.Context, k Key, d *DeadLetter, ttl time.Duration) error {
	d.ID = DeadLetterID(k)
	d.Client, d.Endpoint, d.Key = k.Scope, k.Endpoint, k.ID
	key := deadLetterKey(d.ID)
	unlock, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	sh := s.flights.lock(key)
	defer sh.mu.Unlock()
	// Added before the write: the set may name a dead letter that is not
	// there (the write failed), never miss one that is.
	exp := badgerExpiry(ttl)
	s.deadMu.Lock()
	s.dead[d.ID] = max(s.dead[d.ID], exp)
	s.deadMu.Unlock()
	return s.update(func(txn *badger.Txn) error {
		prev, err := s.loadDeadLetter(txn, key)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		rec := *d
		mergeDeadLetter(&rec, prev)
		rec.ExpiresAt = s.now().Add(ttl)
		v, err := encodeDeadLetter(&rec)
		if err != nil {
			return err
		}
		e := badger.NewEntry(key, v)
		e.ExpiresAt = exp
		if err := txn.SetEntry(e); err != nil {
			return err
		}
		*d = rec
		return nil
	})
}

func (s *Badger) loadDeadLetter(txn *badger.Txn, key []byte) (*DeadLetter, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return nil, err
	}
	d, err := decodeDeadLetter(v)
	if err != nil {
		return nil, err
	}
	if !d.ExpiresAt.IsZero() && !s.now().Before(d.ExpiresAt) {
		return nil, ErrNotFound
	}
	return d, nil
}

// GetDeadLetter returns the dead letter with id, body included.
func (s *Badger) GetDeadLetter(ctx context.Context, id string) (*DeadLetter, error) {
	unlock, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var d *DeadLetter
	err = s.db.View(func(txn *badger.Txn) error {
		var err error
		d, err = s.loadDeadLetter(txn, deadLetterKey(id))
		return err
	})
	return d, mapClosed(err)
}

// DeleteDeadLetter removes a dead letter; ErrNotFound if there is none.
// Resolving the dead letter of a key that succeeded is on every keyed
// request's path and usually finds none, so that case is answered from the
// in-memory set of ids without touching Badger.
func (s *Badger) DeleteDeadLetter(ctx context.Context, id string) error {
	unlock, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	key := deadLetterKey(id)
	sh := s.flights.lock(key)
	defer sh.mu.Unlock()
	s.deadMu.Lock()
	_, ok := s.dead[id]
	s.deadMu.Unlock()
	if !ok {
		return ErrNotFound
	}
	err = s.update(func(txn *badger.Txn) error {
		if _, err := s.loadDeadLetter(txn, key); err != nil {
			return err
		}
		return txn.Delete(key)
	})
	if err == nil || errors.Is(err, ErrNotFound) {
		s.deadMu.Lock()
		delete(s.dead, id)
		s.deadMu.Unlock()
	}
	return err
}

// loadDeadLetterIDs returns the ids of the dead letters in Badger and their
// Badger expiry, with a key-only scan, for the set DeleteDeadLetter
// consults.
func (s *Badger) loadDeadLetterIDs() (map[string]uint64, error) {
	ids := make(map[string]uint64)
	prefix := []byte{deadLetterNS, 0}
	err := s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		opts.Prefix = prefix
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			ids[string(it.Item().Key()[len(prefix):])] = it.Item().ExpiresAt()
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list dead-letter ids: %w", err)
	}
	return ids, nil
}

// forgetExpiredDeadLetters drops from the set the ids whose Badger TTL has
// run out by the real clock (Badger's own): Badger no longer returns them,
// so they need no delete.
func (s *Badger) forgetExpiredDeadLetters() {
	now := uint64(time.Now().Unix())
	s.deadMu.Lock()
	defer s.deadMu.Unlock()
	for id, exp := range s.dead {
		if exp != 0 && exp <= now {
			delete(s.dead, id)
		}
	}
}

// ListDeadLetters returns the dead letters matching f, newest first
// (by last failure), without bodies.
func (s *Badger) ListDeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error) {
	unlock, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var out []DeadLetter
	now := s.now()
	err = s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = []byte{deadLetterNS, 0}
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid() && len(out) < maxDeadLetters; it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			d, err := decodeDeadLetter(v)
			if err != nil {
				s.log.Warn("skipping unreadable dead letter", "err", err)
				continue
			}
			if !d.ExpiresAt.IsZero() && !now.Before(d.ExpiresAt) {
				continue
			}
			if f.match(d) {
				d.Body = nil
				out = append(out, *d)
			}
		}
		return nil
	})
	if err != nil {
		return nil, mapClosed(err)
	}
	SortDeadLetters(out)
	return out, nil
}

// SortDeadLetters orders dead letters newest first, by id on ties.
func SortDeadLetters(ds []DeadLetter) {
	slices.SortFunc(ds, func(a, b DeadLetter) int {
		if c := b.LastAt.Compare(a.LastAt); c != 0 {
			return c
		}
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
}
