package cache

import "time"

// What a store keeps under one scope (one client) as a whole: what its
// committed records count against the client's storage quota, and how
// to forget all of it. The stores add two methods to the contract:
//
//	ScanCommitted(ctx, scope, fn func(CommittedRecord) error) error
//	    calls fn, from one goroutine, for each record committed under
//	    scope and not expired by the store's clock (every endpoint; not
//	    in-flight records, which store nothing yet). An error from fn ends
//	    the scan and is returned. Neither store reports expiries, so this
//	    is how a client's stored bytes are counted at start.
//
//	PurgeScope(ctx, scope) (Purged, error)
//	    deletes every record (committed or in flight: its owner's Commit
//	    then fails with ErrNotOwner) and every dead letter of scope, wakes
//	    the waiters of the deleted keys, and counts what it deleted. What is
//	    written under scope while it runs may be left. Purging an empty
//	    scope deletes nothing and is no error.
//
// Each kind of data a store keeps per client is one namespace that
// PurgeScope walks and one field of Purged. Records and the ownership
// entries of provider objects a client created (cache.Owner: Badger
// 'o' 0 scope 0 id, Redis P o:{scope:id}), whose storage keys start with
// the scope, are deleted by prefix or SCAN pattern; dead letters, keyed by a hash of
// the whole key, are read and matched on their Client.

// RecordOverhead is what StoredSize counts for the parts of a record that
// are not its content: times, status, the key, the store's own framing.
const RecordOverhead = 128

// StoredSize is what a committed record counts against its client's
// storage quota: its body or event bytes, its header names and values,
// upstream and fingerprint, plus RecordOverhead. It depends on the record
// alone, so the gateway counting a commit and a store's ScanCommitted
// reporting the same record agree exactly.
func (r *Record) StoredSize() int64 {
	n := int64(RecordOverhead + r.Size() + len(r.Upstream) + len(r.Fingerprint))
	for k, vs := range r.Header {
		n += int64(len(k))
		for _, v := range vs {
			n += int64(len(v))
		}
	}
	return n
}

// CommittedRecord is what ScanCommitted reports of one committed record.
type CommittedRecord struct {
	Size      int64     // its StoredSize
	ExpiresAt time.Time // store clock
}

// Purged counts what PurgeScope deleted, by kind.
type Purged struct {
	// Records are idempotency records and content-cache entries,
	// committed or in flight.
	Records     int `json:"records"`
	DeadLetters int `json:"dead_letters"`
	// Owners are ownership entries of provider objects (cache.Owner): the
	// purged client's objects become unknown to llmgate, refused even to
	// it under a shared upstream key.
	Owners int `json:"owners"`
}
