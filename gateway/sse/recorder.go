package sse

// Recorder keeps the exact bytes of each event of a keyed stream, up to its
// limits. A stream over a limit is still relayed in full, but Over reports
// that it cannot be committed. A nil *Recorder records nothing.
type Recorder struct {
	// MaxBytes and MaxEvents bound what is kept.
	MaxBytes  int64
	MaxEvents int

	events [][]byte
	size   int64
	seen   int64
	over   bool
}

// Add keeps a copy of ev.
func (r *Recorder) Add(ev []byte) {
	if r == nil {
		return
	}
	r.seen += int64(len(ev))
	if r.over {
		return
	}
	if len(r.events)+1 > r.MaxEvents || r.size+int64(len(ev)) > r.MaxBytes {
		r.over = true
		r.events = nil
		return
	}
	r.size += int64(len(ev))
	r.events = append(r.events, append([]byte(nil), ev...))
}

// Events returns what was recorded, in order.
func (r *Recorder) Events() [][]byte { return r.events }

// Seen is the bytes of every event added, kept or not.
func (r *Recorder) Seen() int64 { return r.seen }

// Over reports whether the stream passed a limit (nothing is kept then).
func (r *Recorder) Over() bool { return r.over }
