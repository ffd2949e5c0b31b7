package cache

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"time"
)

// DeadLetter is a keyed request that finally failed: its retries ended on
// transient failures, its upstream's breaker was open with no fallback, or
// its deadline ran out. It is kept for diagnosis and replay, one record per
// key: a later failure of the same key updates it, a later success removes
// it. Headers are not stored — the body is the client's, headers may carry
// secrets — but for those the key's fingerprint covers (Header).
// BodyNotKept says the body was not stored at all (a
// multipart or binary passthrough body is spooled as it comes, not held
// whole), and BodySize is then its length: such a letter cannot be
// replayed, only the client can send the body again. Letters recorded
// before BodyNotKept existed read as false.
type DeadLetter struct {
	ID       string `json:"id"`
	Client   string `json:"client"`
	Endpoint string `json:"endpoint"`
	// Query is the request's query string (a passthrough endpoint's; the
	// completion endpoints take none), replayed with it: the key's
	// fingerprint covers it. Empty in letters recorded before it was kept,
	// which replay to Endpoint alone, as they did.
	Query         string    `json:"query,omitempty"`
	Key           string    `json:"idempotency_key"`
	Model         string    `json:"model,omitempty"`
	Body          []byte    `json:"-"`
	BodySize      int       `json:"body_size"`
	BodyTruncated bool      `json:"body_truncated,omitempty"`
	BodyNotKept   bool      `json:"body_not_kept,omitempty"`
	Upstreams     []string  `json:"upstreams"`
	Attempts      int       `json:"attempts"`
	Failures      int       `json:"failures"`
	Class         string    `json:"class"`
	Message       string    `json:"message"`
	Status        int       `json:"status,omitempty"`
	FirstAt       time.Time `json:"first_at"`
	LastAt        time.Time `json:"last_at"`
	ExpiresAt     time.Time `json:"expires_at"`

	// Header holds the request headers the key's fingerprint covers
	// (anthropic-version, anthropic-beta on /v1/messages), replayed with
	// it; none of them carries a secret. Empty in letters recorded before
	// it was kept, and for endpoints whose fingerprint covers no header.
	Header map[string][]string `json:"header,omitempty"`
	// Dropped is set by PutDeadLetter: the ids of the client's oldest
	// letters it deleted to keep the client within its DeadLetterBound.
	// Not stored.
	Dropped []string `json:"-"`
	// Stored is what the letter counts against its client's
	// DeadLetterBound (DeadLetterSize), set by ListDeadLetters and
	// GetDeadLetter. Not stored.
	Stored int64 `json:"-"`
}

// DeadLetterID is the stable id of the dead letter for a key.
func DeadLetterID(k Key) string {
	in := make([]byte, 0, 2*MaxIDLen) // on the stack for any key that fits
	in = append(append(in, k.Scope...), 0)
	in = append(append(in, k.Endpoint...), 0)
	sum := sha256.Sum256(append(in, k.ID...))
	var out [24]byte
	hex.Encode(out[:], sum[:12])
	return string(out[:])
}

// DeadLetterFilter selects dead letters for listing. Empty fields match all.
type DeadLetterFilter struct {
	Upstream, Class, Client string
}

// Match reports whether d is selected by f.
func (f DeadLetterFilter) Match(d *DeadLetter) bool {
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

// MergeDeadLetter folds prev, the dead letter already stored for d's key
// (nil if none), into d before d replaces it: Failures counts the failures
// so far, and FirstAt is the earliest.
func MergeDeadLetter(d, prev *DeadLetter) {
	d.Failures = 1
	if prev == nil {
		return
	}
	d.Failures = prev.Failures + 1
	if !prev.FirstAt.IsZero() && prev.FirstAt.Before(d.FirstAt) {
		d.FirstAt = prev.FirstAt
	}
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

// DeadLetterBound is the most dead letters one client keeps, in count and
// in bytes (DeadLetterSize), so that one client's outage — or one client
// sending failing keyed requests on purpose — cannot fill the store the
// other clients' keyed requests need. A store given a bound keeps each
// client within it at every PutDeadLetter: the new letter is stored and
// the client's own oldest letters (by LastAt) are deleted in the same
// step until the client is within the bound again; another client's
// letters are never touched. A letter alone over MaxBytes is kept alone.
// A zero field bounds nothing.
type DeadLetterBound struct {
	MaxCount int
	MaxBytes int64
}

// DeadLetterSize is what a dead letter counts against its client's
// DeadLetterBound and its store's size cap: its storage key and encoded
// value, which the store measures.
func DeadLetterSize(key, value int) int64 { return int64(key + value) }

// Over reports whether count letters of bytes in all are over b.
func (b DeadLetterBound) Over(count int, bytes int64) bool {
	return (b.MaxCount > 0 && count > b.MaxCount) || (b.MaxBytes > 0 && bytes > b.MaxBytes)
}
