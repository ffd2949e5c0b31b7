package cache

import "time"

// ErrFull: the store has no room for new records — its disk is below the
// free-space floor, it is over its size cap, it is open read-only because
// it started on a full disk, or Redis is at maxmemory. Reads still work.
// An error wrapping it reports StoreFull() == true, which is how the
// gateway, which does not import the stores, maps it to a 503
// idempotency_store_full.
var ErrFull error = fullError{}

type fullError struct{}

func (fullError) Error() string   { return "cache: store full" }
func (fullError) StoreFull() bool { return true }

// Why a store is full (Space.Reason).
const (
	// FullDiskLow: the filesystem's free space is below the store's floor.
	FullDiskLow = "disk_low"
	// FullOverCap: the store's live entries are at store.max_bytes.
	FullOverCap = "over_cap"
	// FullReadOnly: the store is open read-only (it started below the floor
	// and has not reopened read-write yet).
	FullReadOnly = "read_only"
)

// Space is a store's room for new records, for the gateway's admission of
// keyed requests, /readyz and metrics.
type Space struct {
	// At is when the figures were taken.
	At time.Time
	// Full: new records are refused (Reason says why); replays still work.
	Full   bool
	Reason string
	// ReadOnly: the store is open read-only.
	ReadOnly bool
	// FreeBytes is what the filesystem has free for the store's directory;
	// MinFreeBytes the floor below which the store is full.
	FreeBytes, MinFreeBytes int64
	// UsedBytes is the size of the store's files. LiveBytes is what its
	// live entries take (keys and values not expired or deleted), which
	// MaxBytes caps (0: none): a purge or an expiry gives the cap back at
	// once, the files shrink later, as the store reclaims them.
	UsedBytes, LiveBytes, MaxBytes int64
}
