// Package jsonscan reads JSON from a byte slice without decoding it into Go
// values: one pass validates the text, enforces a nesting limit and hands
// the caller the raw bytes of the members it asks for. The gateway routes
// every request body with it and classify reads every completion, error
// body and stream event with it, so a scan allocates nothing unless it
// fails (Unquote allocates the string it returns).
//
// What it accepts is what encoding/json accepts (FuzzScanObject holds it
// to that), and a string means what encoding/json decodes it to: escapes
// resolved, invalid UTF-8 and unpaired surrogates replaced by U+FFFD. Keys
// are matched after that decoding as encoding/json matches a struct
// field's name, which is how a Go upstream reads them: case-insensitively
// under Unicode simple folding. "mod\u0065l", "Model" and "MODEL" are all
// the key model; "\u017ftore" ('ſ') is store. The same key twice in one
// object, or two keys that fold alike, is valid JSON; Fields reports the
// repeat and the caller decides.
//
// The package imports nothing outside the standard library.
package jsonscan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"math/bits"
)

// DefaultMaxDepth is encoding/json's nesting limit.
const DefaultMaxDepth = 10000

// ErrTooDeep reports a text nested deeper than the Scanner's limit.
var ErrTooDeep = errors.New("JSON nested too deeply")

// SyntaxError is malformed JSON, with the byte offset where the scan
// stopped.
type SyntaxError struct {
	Msg    string
	Offset int
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("%s (at byte %d)", e.Msg, e.Offset) }

// A Scanner reads the JSON text in one byte slice, front to back. The
// first error stops it: from then on Peek returns 0, Value returns nil,
// the iterators yield nothing, and Err reports the error.
//
// A Scanner is not safe for concurrent use.
type Scanner struct {
	buf      []byte
	pos      int
	depth    int
	maxDepth int
	err      error
	key      []byte // the key of the member Fields last yielded, as written
}

// New returns a Scanner over buf that refuses objects and arrays nested
// more than maxDepth deep (the outermost one is depth 1). If maxDepth <= 0,
// DefaultMaxDepth is used.
func New(buf []byte, maxDepth int) *Scanner {
	if maxDepth <= 0 {
		maxDepth = DefaultMaxDepth
	}
	return &Scanner{buf: buf, maxDepth: maxDepth}
}

// Err returns the first error the scan met: a *SyntaxError, or ErrTooDeep.
func (s *Scanner) Err() error { return s.err }

// Pos returns the offset of the next unread byte.
func (s *Scanner) Pos() int { return s.pos }

// Peek skips whitespace and returns the next byte, which for a value tells
// its type: '{', '[', '"', 't', 'f', 'n', '-' or a digit. It returns 0 at
// the end of the input and after an error.
func (s *Scanner) Peek() byte {
	if s.err != nil {
		return 0
	}
	s.ws()
	if s.pos < len(s.buf) {
		return s.buf[s.pos]
	}
	return 0
}

// AtEnd skips whitespace and reports whether the input is used up.
func (s *Scanner) AtEnd() bool {
	s.ws()
	return s.pos == len(s.buf)
}

// Value consumes the next value and returns it as written, or nil if it is
// malformed.
func (s *Scanner) Value() []byte {
	s.Peek()
	start := s.pos
	if !s.value() {
		return nil
	}
	return s.buf[start:s.pos]
}

// Skip consumes the next value.
func (s *Scanner) Skip() {
	s.Peek()
	s.value()
}

// Members iterates over the object that is the next value, yielding each
// key as written (with its quotes and escapes: Unquote or Equal read it)
// with the Scanner at the member's value. The loop body may consume the
// value (Value, Skip, or a nested loop); a value it leaves is skipped. If
// the next value is not an object, Members yields nothing and consumes
// nothing. Breaking out of the loop leaves the Scanner inside the object:
// stop scanning then.
func (s *Scanner) Members() iter.Seq[[]byte] {
	return func(yield func(key []byte) bool) {
		if s.Peek() == '{' {
			s.object(nil, func(key []byte, _ int) bool { return yield(key) })
		}
	}
}

// Fields is Members for the keys a caller reads: it yields the name in
// keys that a member's key matches (see Keys), and whether an earlier
// member of this object matched the same name (a duplicate, which
// encoding/json and most other decoders resolve by keeping the last; an
// exact-case decoder may read neither "Model" nor "MODEL" as model).
// Members with other keys are skipped. The rules of Members apply.
func (s *Scanner) Fields(keys *Keys) iter.Seq2[string, bool] {
	return func(yield func(key string, dup bool) bool) {
		if s.Peek() != '{' {
			return
		}
		var seen uint64
		s.object(keys, func(key []byte, i int) bool {
			s.key = key
			bit := uint64(1) << i
			dup := seen&bit != 0
			seen |= bit
			return yield(keys.names[i], dup)
		})
	}
}

// Key is the key of the member Fields last yielded as written, quoted
// and with its escapes (Equal compares it with a name exactly).
func (s *Scanner) Key() []byte { return s.key }

// Elements iterates over the array that is the next value, yielding each
// element's index with the Scanner at the element. The rules of Members
// apply.
func (s *Scanner) Elements() iter.Seq[int] {
	return func(yield func(i int) bool) {
		if s.Peek() == '[' {
			s.array(yield)
		}
	}
}

// fail records a syntax error at offset off and returns false. It is not
// inlined, to keep the error path out of the scanning loops.
//
//go:noinline
func (s *Scanner) fail(msg string, off int) bool {
	if s.err == nil {
		s.err = &SyntaxError{Msg: msg, Offset: off}
	}
	return false
}

func (s *Scanner) ws() { s.pos = skipWS(s.buf, s.pos) }

// skipWS returns the offset of the first byte of b from i on that is not
// whitespace, or len(b).
func skipWS(b []byte, i int) int {
	for i < len(b) && b[i] <= ' ' && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// valueStart reports whether c can begin a value.
func valueStart(c byte) bool {
	switch c {
	case '"', '{', '[', 't', 'f', 'n', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return true
	}
	return false
}

// The scanning methods below take the offset they start at and return the
// one they end at, -1 on an error (which they record with fail); object
// and array start and end at s.pos. Keeping the offset in a local variable
// and not in s.pos lets it stay in a register: s.pos is stored only where
// a caller's loop body runs and where an object or array ends.

// value consumes one value, s at its first byte.
func (s *Scanner) value() bool {
	if s.err != nil {
		return false
	}
	end := s.skip(s.pos)
	if end < 0 {
		return false
	}
	s.pos = end
	return true
}

// skip consumes the value at offset i.
func (s *Scanner) skip(i int) int {
	b := s.buf
	if i >= len(b) {
		return s.failAt("invalid value", i)
	}
	switch c := b[i]; c {
	case '"':
		end, _ := s.str(i)
		return end
	case '{':
		s.pos = i
		if !s.object(nil, nil) {
			return -1
		}
		return s.pos
	case '[':
		s.pos = i
		if !s.array(nil) {
			return -1
		}
		return s.pos
	case 't':
		return s.literal(i, "true")
	case 'f':
		return s.literal(i, "false")
	case 'n':
		return s.literal(i, "null")
	default:
		if c == '-' || c >= '0' && c <= '9' {
			return s.number(i)
		}
		return s.failAt("invalid value", i)
	}
}

// failAt is fail for the methods that return an offset: it returns -1.
func (s *Scanner) failAt(msg string, off int) int {
	s.fail(msg, off)
	return -1
}

// object consumes an object, s at its '{'. For each member (if keys is
// nil) or each member whose key is in keys, member (if not nil) is called
// with the key token, its index in keys, and s at the value; the value is
// skipped if member leaves it. member returns false to stop.
func (s *Scanner) object(keys *Keys, member func(key []byte, i int) bool) bool {
	if s.depth++; s.depth > s.maxDepth {
		s.err = ErrTooDeep
		return false
	}
	b := s.buf
	i := skipWS(b, s.pos+1)
	if i < len(b) && b[i] == '}' {
		s.pos = i + 1
		s.depth--
		return true
	}
	for {
		i = skipWS(b, i)
		if i >= len(b) || b[i] != '"' {
			return s.fail("expected string", i)
		}
		kStart := i
		var escaped bool
		if i, escaped = s.str(i); i < 0 {
			return false
		}
		key := b[kStart:i]
		i = skipWS(b, i)
		if i >= len(b) || b[i] != ':' {
			return s.fail("expected ':' after object key", i)
		}
		i = skipWS(b, i+1)
		if i >= len(b) || !valueStart(b[i]) {
			return s.fail("invalid value", i)
		}
		vStart := i
		if member != nil {
			k := -1
			if keys != nil && keys.mayMatch(key[1:len(key)-1], escaped) {
				k = keys.match(key[1:len(key)-1], escaped)
			}
			if k >= 0 || keys == nil {
				s.pos = i
				if !member(key, k) || s.err != nil {
					return false
				}
				i = s.pos
			}
		}
		if i == vStart {
			if b[i] == '"' { // the most common value, a call the less
				i, _ = s.str(i)
			} else {
				i = s.skip(i)
			}
			if i < 0 {
				return false
			}
		}
		i = skipWS(b, i)
		if i < len(b) {
			switch b[i] {
			case ',':
				i++
				continue
			case '}':
				s.pos = i + 1
				s.depth--
				return true
			}
		}
		if s.depth == 1 {
			// The outermost object keeps the message, and the offset one
			// past the offending byte, that the gateway's routing scanner
			// has always reported to clients.
			return s.fail("expected ',' or '}' in object", i+1)
		}
		return s.fail("expected ',' or closing bracket", i)
	}
}

// array consumes an array, s at its '['. For each element, elem (if not
// nil) is called with its index and s at the element, which is skipped if
// elem leaves it. elem returns false to stop.
func (s *Scanner) array(elem func(i int) bool) bool {
	if s.depth++; s.depth > s.maxDepth {
		s.err = ErrTooDeep
		return false
	}
	b := s.buf
	i := skipWS(b, s.pos+1)
	if i < len(b) && b[i] == ']' {
		s.pos = i + 1
		s.depth--
		return true
	}
	for n := 0; ; n++ {
		i = skipWS(b, i)
		if i >= len(b) || !valueStart(b[i]) {
			return s.fail("invalid value", i)
		}
		vStart := i
		if elem != nil {
			s.pos = i
			if !elem(n) || s.err != nil {
				return false
			}
			i = s.pos
		}
		if i == vStart {
			if b[i] == '"' { // the most common value, a call the less
				i, _ = s.str(i)
			} else {
				i = s.skip(i)
			}
			if i < 0 {
				return false
			}
		}
		i = skipWS(b, i)
		if i < len(b) {
			switch b[i] {
			case ',':
				i++
				continue
			case ']':
				s.pos = i + 1
				s.depth--
				return true
			}
		}
		return s.fail("expected ',' or closing bracket", i)
	}
}

// literal consumes lit at offset i.
func (s *Scanner) literal(i int, lit string) int {
	if len(s.buf)-i < len(lit) || string(s.buf[i:i+len(lit)]) != lit {
		return s.failAt("invalid literal", i)
	}
	return i + len(lit)
}

// number consumes -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at
// offset i.
func (s *Scanner) number(i int) int {
	b := s.buf
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		return s.failAt("invalid number", i)
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return s.failAt("invalid number", j)
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return s.failAt("invalid number", j)
		}
		i = j
	}
	return i
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// str consumes the string at offset i, its '"', and reports whether it
// holds an escape.
func (s *Scanner) str(i int) (end int, escaped bool) {
	b := s.buf
	i++
	for {
		i = longRun(b, i)
		if i >= len(b) {
			return s.failAt("unterminated string", len(b)), escaped
		}
		switch b[i] {
		case '"':
			return i + 1, escaped
		case '\\':
			escaped = true
			i++
			if i >= len(b) {
				return s.failAt("invalid escape", i), escaped
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if i+5 > len(b) || !isHex(b[i+1]) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) {
					return s.failAt("invalid escape", i), escaped
				}
				i += 5
			default:
				return s.failAt("invalid escape", i), escaped
			}
		default: // below 0x20
			return s.failAt("control character in string", i), escaped
		}
	}
}

// special marks the bytes that end a run of string content: '"', '\\',
// and the control bytes, which JSON does not allow in a string.
var special = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// longRun returns the index of the first special byte in b[i:], or
// len(b), looking at eight bytes at a time.
func longRun(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		// b[i:i+8], not b[i:]: a slice that cannot be empty spares the
		// pointer masking and the second length check b[i:] compiles to.
		if m := specialMask(binary.LittleEndian.Uint64(b[i : i+8])); m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	for i < len(b) && !special[b[i]] {
		i++
	}
	return i
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// specialMask sets the top bit of the first byte of w (little-endian) that
// is '"', '\\' or below 0x20, and perhaps of later ones. It is the test of
// "Bit Twiddling Hacks" for a byte less than n: x-n borrows into the top
// bit of a byte only if that byte, or one below it, is less than n, so the
// lowest bit set is exact.
func specialMask(w uint64) uint64 {
	q := w ^ (lsb * '"')
	bs := w ^ (lsb * '\\')
	return ((q-lsb)&^q | (bs-lsb)&^bs | (w-lsb*0x20)&^w) & msb
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
