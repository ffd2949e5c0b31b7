package sse

// Recorder keeps the exact bytes of each event of a keyed stream, up to its
// limits. A stream over a limit is still relayed in full, but Over reports
// that it cannot be committed. A nil *Recorder records nothing.
//
// The events' bytes are carved out of a few chunks (2 KiB, then twice the
// last, up to 64 KiB; an event larger than that gets its own) rather than
// copied one allocation per event, and a chunk is never moved: a slice Add
// returned stays valid and unchanged.
type Recorder struct {
	// MaxBytes and MaxEvents bound what is kept.
	MaxBytes  int64
	MaxEvents int

	events [][]byte
	chunk  []byte
	size   int64
	seen   int64
	over   bool
}

const (
	firstChunk = 2 << 10
	maxChunk   = 64 << 10
)

// Add keeps a copy of ev and returns it (nil when nothing is kept: a nil
// Recorder, or a stream over a limit).
func (r *Recorder) Add(ev []byte) []byte {
	if r == nil {
		return nil
	}
	r.seen += int64(len(ev))
	if r.over {
		return nil
	}
	if len(r.events)+1 > r.MaxEvents || r.size+int64(len(ev)) > r.MaxBytes {
		r.over = true
		r.events, r.chunk = nil, nil
		return nil
	}
	r.size += int64(len(ev))
	if cap(r.chunk)-len(r.chunk) < len(ev) {
		next := min(max(2*cap(r.chunk), firstChunk), maxChunk)
		r.chunk = make([]byte, 0, max(next, len(ev)))
	}
	start := len(r.chunk)
	r.chunk = append(r.chunk, ev...)
	kept := r.chunk[start:len(r.chunk):len(r.chunk)]
	r.events = append(r.events, kept)
	return kept
}

// Events returns what was recorded, in order.
func (r *Recorder) Events() [][]byte { return r.events }

// Seen is the bytes of every event added, kept or not.
func (r *Recorder) Seen() int64 { return r.seen }

// Over reports whether the stream passed a limit (nothing is kept then);
// a nil Recorder, which keeps nothing, never does.
func (r *Recorder) Over() bool { return r != nil && r.over }
