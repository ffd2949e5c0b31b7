package jsonscan

import (
	"bytes"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Keys is a set of object keys a caller reads with Fields. Build it once,
// with NewKeys or NewExactKeys, in a package variable.
//
// A key of NewKeys matches a name as encoding/json matches a struct
// field's name: after unescaping, case-insensitively under Unicode simple
// folding, so "MODEL", "mod\u0045l" and "Model" are all model, "\u017ftore"
// ('ſ') is store and "bac\u212aground" (the Kelvin sign) is background. A
// Go upstream reads every one of them as that field, so a reader of
// request bodies must too. A key of NewExactKeys matches after unescaping,
// exactly, as an exact-case client reads an answer.
type Keys struct {
	names  []string
	folded []string // each name folded as encoding/json folds it; names if exact
	fold   bool
	maxLen int       // the longest of folded, in bytes
	ascii  bool      // every one of folded is ASCII
	lens   uint64    // bit n set: an unescaped key n bytes long may match (n < 64)
	first  [4]uint64 // bit c set: an unescaped key may begin with byte c (if ascii)
}

// NewKeys returns the set of names, matched with folding: at most 64,
// valid UTF-8, no two the same under folding. It panics otherwise, as
// regexp.MustCompile does: the names are constants of the caller.
func NewKeys(names ...string) *Keys { return newKeys(names, true) }

// NewExactKeys is NewKeys for names matched exactly: no two the same.
func NewExactKeys(names ...string) *Keys { return newKeys(names, false) }

func newKeys(names []string, fold bool) *Keys {
	if len(names) > 64 {
		panic(fmt.Sprintf("jsonscan.NewKeys: %d names, at most 64", len(names)))
	}
	k := &Keys{names: names, folded: make([]string, len(names)), fold: fold, ascii: true}
	for i, n := range names {
		if !utf8.ValidString(n) {
			panic(fmt.Sprintf("jsonscan.NewKeys: %q is not valid UTF-8", n))
		}
		f := n
		if fold {
			f = string(foldName([]byte(n)))
		}
		for j, g := range k.folded[:i] {
			if g == f {
				panic(fmt.Sprintf("jsonscan.NewKeys: %q and %q are one name", names[j], n))
			}
		}
		k.folded[i] = f
		k.maxLen = max(k.maxLen, len(f))
		k.addLens(f)
	}
	return k
}

// addLens marks the lengths an unescaped key matching f may have, and the
// bytes it may begin with. With folding, an ASCII byte of f is one byte as
// written, or two for an S ('ſ'), or three for a K (the Kelvin sign); no
// other rune folds to ASCII.
func (k *Keys) addLens(f string) {
	longest := len(f)
	for j := 0; j < len(f); j++ {
		switch c := f[j]; {
		case c >= utf8.RuneSelf:
			k.ascii = false
		case k.fold && c == 'S':
			longest++
		case k.fold && c == 'K':
			longest += 2
		}
	}
	for n := len(f); n <= longest && n < 64; n++ {
		k.lens |= 1 << n
	}
	if len(f) == 0 {
		return
	}
	c := f[0]
	k.addFirst(c)
	if k.fold && 'A' <= c && c <= 'Z' {
		k.addFirst(c + 'a' - 'A')
		switch c {
		case 'S':
			k.addFirst("ſ"[0])
		case 'K':
			k.addFirst("\u212a"[0])
		}
	}
}

func (k *Keys) addFirst(c byte) { k.first[c>>6] |= 1 << (c & 63) }

// mayMatch is the inlined first test of match on the key text inner:
// most keys of an object are unescaped, and no name has their length and
// first byte.
func (k *Keys) mayMatch(inner []byte, escaped bool) bool {
	n := len(inner)
	if escaped || !k.ascii || n >= 64 {
		return true
	}
	return k.lens&(1<<n) != 0 && (n == 0 || k.first[inner[0]>>6]&(1<<(inner[0]&63)) != 0)
}

// Index returns the index in the set of the name that the key token tok
// (with its quotes, as Members yields it) matches, or -1.
func (k *Keys) Index(tok []byte) int {
	if len(tok) < 2 || tok[0] != '"' {
		return -1
	}
	inner := tok[1 : len(tok)-1]
	escaped := bytes.IndexByte(inner, '\\') >= 0
	if !k.mayMatch(inner, escaped) {
		return -1
	}
	return k.match(inner, escaped)
}

// match returns the index of the name that the key text inner (a string
// token without its quotes) matches, or -1.
func (k *Keys) match(inner []byte, escaped bool) int {
	if !k.fold {
		return k.matchExact(inner, escaped)
	}
	if !escaped {
		if i := k.matchPlain(inner); i >= 0 {
			return i
		}
		// An ASCII key folds byte by byte: matchPlain compared it in full.
		if ascii(inner) {
			return -1
		}
	}
	// A folded byte comes from at most six bytes as written ("\u212a" is
	// K), so a key longer than that cannot match; and from at most three
	// decoded ones, so a longer decoding is cut short.
	if len(inner) > 6*k.maxLen {
		return -1
	}
	var buf [foldBuf]byte
	dec, ok := appendUnquoted(buf[:0], inner, 3*k.maxLen)
	if !ok {
		return -1
	}
	dec = foldName(dec)
	for i, f := range k.folded {
		if string(dec) == f {
			return i
		}
	}
	return -1
}

// foldBuf is the size of the stack buffer a key is decoded into to be
// folded: three decoded bytes for each byte of a name up to 64 bytes, and
// the rune that takes a decoding over that.
const foldBuf = 3*64 + utf8.UTFMax

// matchPlain matches an unescaped key by its bytes: ASCII letters folded to
// upper case, every other byte as written. That finds every match of an
// ASCII key, and of a key already folded but for its ASCII letters.
func (k *Keys) matchPlain(inner []byte) int {
	for i, f := range k.folded {
		if len(f) != len(inner) {
			continue
		}
		j := 0
		for j < len(f) {
			c := inner[j]
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			if c != f[j] {
				break
			}
			j++
		}
		if j == len(f) {
			return i
		}
	}
	return -1
}

// matchExact is match for NewExactKeys.
func (k *Keys) matchExact(inner []byte, escaped bool) int {
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

func ascii(b []byte) bool {
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// foldName folds text, valid UTF-8, in place, as encoding/json (v1, and
// v2 with its v1 options) folds a key to look up a struct field: ASCII
// letters to upper case, every other rune to the smallest rune of its
// unicode.SimpleFold orbit ('ſ' to S, the Kelvin sign to K). Two texts
// fold alike exactly when bytes.EqualFold says they are equal. No rune
// folds to a longer encoding, so the result fits where the text was.
func foldName(text []byte) []byte {
	out := text[:0]
	for i := 0; i < len(text); {
		c := text[i]
		if c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			out = append(out, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(text[i:])
		i += n
		out = utf8.AppendRune(out, foldRune(r))
	}
	return out
}

// foldRune returns the smallest rune of r's fold orbit.
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}
