package jsonscan

import (
	"bytes"
	"fmt"
	"math"
	"unicode/utf16"
	"unicode/utf8"
)

// Keys is a set of object keys a caller reads with Fields. Build it once,
// with NewKeys, in a package variable.
type Keys struct {
	names  []string
	maxLen int
	ascii  bool
	lens   uint64 // bit n set: a name is n bytes long (n < 64)
}

// NewKeys returns the set of names: at most 64, distinct, each valid
// UTF-8. It panics otherwise, as regexp.MustCompile does: the names are
// constants of the caller.
func NewKeys(names ...string) *Keys {
	if len(names) > 64 {
		panic(fmt.Sprintf("jsonscan.NewKeys: %d names, at most 64", len(names)))
	}
	k := &Keys{names: names, ascii: true}
	for i, n := range names {
		if !utf8.ValidString(n) {
			panic(fmt.Sprintf("jsonscan.NewKeys: %q is not valid UTF-8", n))
		}
		for _, m := range names[:i] {
			if m == n {
				panic(fmt.Sprintf("jsonscan.NewKeys: %q twice", n))
			}
		}
		k.maxLen = max(k.maxLen, len(n))
		if len(n) < 64 {
			k.lens |= 1 << len(n)
		}
		for j := 0; j < len(n); j++ {
			k.ascii = k.ascii && n[j] < utf8.RuneSelf
		}
	}
	return k
}

// mayMatch is the inlined first test of match: most keys of an object
// are unescaped, and no name has their length.
func (k *Keys) mayMatch(n int, escaped bool) bool {
	return escaped || !k.ascii || n >= 64 || k.lens&(1<<n) != 0
}

// match returns the index of the name that the key text inner (a string
// token without its quotes) decodes to, or -1.
func (k *Keys) match(inner []byte, escaped bool) int {
	if !escaped {
		for i, n := range k.names {
			if string(inner) == n {
				return i
			}
		}
		// Unescaped text decodes to itself unless it holds invalid UTF-8,
		// which decodes to U+FFFD: never part of an ASCII name.
		if k.ascii || utf8.Valid(inner) {
			return -1
		}
	}
	// A decoded byte comes from at most six bytes as written, so a key
	// longer than that cannot match, and a longer decoding is cut short.
	if len(inner) > 6*k.maxLen {
		return -1
	}
	var buf [decodeBuf]byte
	dec, ok := appendUnquoted(buf[:0], inner, k.maxLen)
	if !ok {
		return -1
	}
	for i, n := range k.names {
		if string(dec) == n {
			return i
		}
	}
	return -1
}

// Unquote returns the text of a string token as Value returns it (with its
// quotes), decoded as encoding/json decodes it: escapes resolved, invalid
// UTF-8 and unpaired surrogates replaced by U+FFFD. It returns "" for a
// value that is not a string.
func Unquote(tok []byte) string {
	if len(tok) < 2 || tok[0] != '"' {
		return ""
	}
	inner := tok[1 : len(tok)-1]
	if plain(inner) {
		return string(inner)
	}
	var buf [decodeBuf]byte
	dec, _ := appendUnquoted(buf[:0], inner, math.MaxInt)
	return string(dec)
}

// Equal reports whether tok is a string token whose text, decoded as
// Unquote decodes it, is want. It does not allocate for want up to 64
// bytes.
func Equal(tok []byte, want string) bool {
	if len(tok) < 2 || tok[0] != '"' {
		return false
	}
	inner := tok[1 : len(tok)-1]
	if plain(inner) {
		return string(inner) == want
	}
	if len(inner) > 6*len(want) {
		return false
	}
	var buf [decodeBuf]byte
	dec, ok := appendUnquoted(buf[:0], inner, len(want))
	return ok && string(dec) == want
}

// decodeBuf is the size of the stack buffers text is decoded into: 64
// bytes, and the rune that takes a decoding over a limit of 64.
const decodeBuf = 64 + utf8.UTFMax

// plain reports whether text as written is its own decoding.
func plain(inner []byte) bool {
	return bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner)
}

// appendUnquoted appends the decoding of inner, the text of a string token
// the Scanner accepted, to dst. It gives up, returning false, once the
// decoding is longer than limit bytes.
func appendUnquoted(dst, inner []byte, limit int) ([]byte, bool) {
	base := len(dst)
	for i := 0; i < len(inner); {
		if len(dst)-base > limit {
			return dst, false
		}
		c := inner[i]
		switch {
		case c == '\\' && i+1 < len(inner):
			i += 2
			switch e := inner[i-1]; e {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				r := hex4(inner, i)
				if r < 0 {
					return dst, false // not from the Scanner
				}
				i += 4
				if utf16.IsSurrogate(r) {
					// As encoding/json: a valid pair is one rune; any other
					// surrogate is U+FFFD, and what follows it is read anew.
					if r2 := escapedRune(inner, i); r2 >= 0 {
						if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
							dst = utf8.AppendRune(dst, d)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				dst = utf8.AppendRune(dst, r)
			default: // '"', '\\', '/'
				dst = append(dst, e)
			}
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			r, size := utf8.DecodeRune(inner[i:])
			dst = utf8.AppendRune(dst, r)
			i += size
		}
	}
	return dst, len(dst)-base <= limit
}

// escapedRune returns the rune of a \uXXXX escape at b[i:], or -1.
func escapedRune(b []byte, i int) rune {
	if i+1 < len(b) && b[i] == '\\' && b[i+1] == 'u' {
		return hex4(b, i+2)
	}
	return -1
}

// hex4 returns the value of the four hex digits at b[i:], or -1.
func hex4(b []byte, i int) rune {
	if i+4 > len(b) {
		return -1
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}
