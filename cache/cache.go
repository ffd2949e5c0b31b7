// Package cache is the contract of llmgate's idempotency store: the records
// behind the Idempotency-Key header and the dead letters of keyed requests
// that finally failed. A keyed completion is claimed by one request,
// committed once with the exact bytes the client received, and replayed
// byte for byte until its TTL runs out; it is never run twice.
//
// A key's life in the store:
//
//	(absent)  ──Claim──►            in flight {owner, lease until, fingerprint}
//	in flight ──Commit(owner)──►    committed {status, headers, body | SSE events, upstream, times}
//	in flight ──Release(owner)──►   (absent)
//	in flight ──lease runs out / owner is a dead process──► claimable again (Claim takes it over)
//	committed ──ttl──►              (absent)
//
// Every transition is compared and set atomically on the owner token, and
// every method's contract can be met by Redis too (SET NX PX, a Lua
// compare-and-set on the owner, pub/sub for wake-ups), so the gateway can
// hold either behind the small interface it declares.
//
// This package owns the types of that contract (Key, Record, State, Claim,
// Stats, DeadLetter and its filter and order), its sentinel errors, and
// nothing that runs: the stores are cache/badger (embedded, one process)
// and cache/redis (shared by replicas), they hold the same bytes
// (cache/internal/codec), and cache/storetest is the behaviour suite both
// must pass.
//
// It knows nothing of HTTP, echo or upstreams: the caller computes the
// fingerprint, chooses the headers worth keeping and frames the SSE events.
package cache

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Other errors are wrapped with what the store was doing.
var (
	// ErrNotFound: no record (or only an expired one) under the key.
	ErrNotFound = errors.New("cache: record not found")
	// ErrNotOwner: the key is not in flight under the given owner token —
	// released, committed, deleted, or its lease ran out and another request
	// took it over.
	ErrNotOwner = errors.New("cache: not the owner of the in-flight record")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("cache: store closed")
	// ErrInvalidKey: a Key that cannot be stored (see Key.Validate).
	ErrInvalidKey = errors.New("cache: invalid key")
	// ErrNotReplicated: a store that waits for replicas (Redis with
	// WaitReplicas) could not confirm that enough of them have a record:
	// a commit of it fails, and a replay of it is held back, since a
	// failover could still lose it.
	ErrNotReplicated = errors.New("redis store: commit not acknowledged by enough replicas")
)

// MaxIDLen is the longest Idempotency-Key accepted.
const MaxIDLen = 255

// Key identifies one record: the tenant scope (client name, "" = shared), the
// endpoint path ("/v1/chat/completions"), and the client's Idempotency-Key.
type Key struct {
	Scope, Endpoint, ID string
}

// Validate reports whether k can be stored: ID is 1–255 printable ASCII
// characters (0x20–0x7E) and neither Scope nor Endpoint contains a NUL byte,
// which separates the parts in the storage key.
func (k Key) Validate() error {
	if n := len(k.ID); n == 0 || n > MaxIDLen {
		return fmt.Errorf("%w: id must be 1–%d characters, got %d", ErrInvalidKey, MaxIDLen, n)
	}
	for i := 0; i < len(k.ID); i++ {
		if c := k.ID[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: id byte %d is %#02x, not printable ASCII", ErrInvalidKey, i, c)
		}
	}
	for _, s := range [...]string{k.Scope, k.Endpoint} {
		for i := 0; i < len(s); i++ {
			if s[i] == 0 {
				return fmt.Errorf("%w: scope and endpoint must not contain NUL", ErrInvalidKey)
			}
		}
	}
	return nil
}

// String is a short form for errors and logs. The ID is truncated: it is
// the client's, and logs need only enough of it to correlate.
func (k Key) String() string {
	id := k.ID
	if len(id) > 16 {
		id = id[:16] + "…"
	}
	return fmt.Sprintf("%s%s#%s", scopePrefix(k.Scope), k.Endpoint, id)
}

func scopePrefix(scope string) string {
	if scope == "" {
		return ""
	}
	return scope + ":"
}

// State of a record.
type State uint8

const (
	// InFlight: claimed by an owner whose upstream call has not finished.
	InFlight State = 1
	// Committed: the response is stored and is replayed until ExpiresAt.
	Committed State = 2
)

func (s State) String() string {
	switch s {
	case InFlight:
		return "in_flight"
	case Committed:
		return "committed"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Record is what the store keeps under a Key.
type Record struct {
	State       State
	Fingerprint string              // hash of the request body, computed by the caller
	Owner       string              // in flight: the owner token
	LeaseUntil  time.Time           // in flight: claimable by others from then on, unless renewed
	Status      int                 // committed: HTTP status
	Header      map[string][]string // committed: the response headers a client relies on
	Body        []byte              // committed, non-stream: exact body bytes
	Stream      bool
	// Events: committed stream: the exact bytes of each SSE event as the client
	// received them, in order, each including its trailing blank line.
	Events    [][]byte
	Upstream  string // which upstream served it
	CreatedAt time.Time
	ExpiresAt time.Time
}

// Size is the number of body or event bytes, for admin listings.
func (r *Record) Size() int {
	n := len(r.Body)
	for _, e := range r.Events {
		n += len(e)
	}
	return n
}

// ClaimStatus is the outcome of Claim.
type ClaimStatus int

const (
	// Claimed: the caller owns the key and must Commit or Release it.
	Claimed ClaimStatus = iota
	// Busy: in flight elsewhere with the same fingerprint; Wait, then Claim again.
	Busy
	// Done: committed with the same fingerprint; replay Claim.Record.
	Done
	// Mismatch: a record exists with another fingerprint.
	Mismatch
)

func (c ClaimStatus) String() string {
	switch c {
	case Claimed:
		return "claimed"
	case Busy:
		return "busy"
	case Done:
		return "done"
	case Mismatch:
		return "mismatch"
	}
	return fmt.Sprintf("ClaimStatus(%d)", int(c))
}

// Claim is the result of a Claim call.
type Claim struct {
	Status ClaimStatus
	// Owner (Claimed): the token to pass to Renew, Commit and Release.
	Owner string
	// Record: Done: the full committed record; Busy and Mismatch: the
	// existing record; Claimed: nil.
	Record *Record
}

// Stats describes the store for admin and metrics.
type Stats struct {
	Records  int64 // committed and in-flight records
	InFlight int64 // of which in flight
	LSMBytes int64 // apparent size of the LSM tree's files (0 in memory)
	// VLogBytes is the apparent size of the value-log files (0 in memory).
	// Badger sizes the active file at twice its 16 MiB limit up front, so this
	// is not the disk actually used.
	VLogBytes int64
	At        time.Time // when the figures were taken (store clock)
}
