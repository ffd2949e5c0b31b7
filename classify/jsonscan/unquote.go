package jsonscan

import (
	"bytes"
	"math"
	"unicode/utf16"
	"unicode/utf8"
)

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

// FoldedKey is tok, a string token (with its quotes), as encoding/json
// matches an object key to a struct field: decoded as Unquote decodes it,
// then folded (ASCII letters to upper case, every other rune to the
// smallest of its simple-fold orbit). Two keys a Go upstream reads as one
// field fold alike ("model", "MODEL", "mod\u0065l"); every other JSON
// decoder reads two keys as one only if they decode alike, which fold
// alike too.
func FoldedKey(tok []byte) string {
	return string(foldName([]byte(Unquote(tok))))
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
