package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strings"
	"sync"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/classify/jsonscan"
)

// Fingerprint hashes a request body for idempotency: same key with another
// fingerprint is a 422. What counts: every value, as written. What does not:
// insignificant whitespace and the order of object keys, so a retry from an
// SDK (or another process of the same workflow) that serialises the same
// call differently still matches. Numbers and strings are compared as
// written ("1.0" and "1" differ, as do "\u0041" and "A"). body must already
// be one valid JSON value (the gateway parses it first).
//
// It holds the body's canonical form (at most the body's size) and the
// members of the objects it is inside; a body whose open objects hold more
// than MaxMembers members at once is refused (ErrTooManyMembers) rather
// than sorted: a 30 MB object of millions of one-byte members would take
// twenty times its size.
func Fingerprint(body []byte) (string, error) {
	c := canonPool.Get().(*canonicalizer)
	c.out, c.live, c.over = slices.Grow(c.out[:0], len(body)), 0, false
	if c.sum == nil {
		c.sum = sha256.New()
	}
	c.sum.Reset()
	s := jsonscan.New(body, 0)
	if s.Peek() == '{' {
		c.object(s, true) // written to c.sum as it is sorted: no copy of the body's form
	} else {
		c.value(s)
		c.sum.Write(c.out)
	}
	var dst [2 * sha256.Size]byte
	hex.Encode(dst[:], c.sum.Sum(c.digest[:0]))
	over := c.over
	if cap(c.out) <= maxPooledCanon && cap(c.scratch) <= maxPooledCanon {
		canonPool.Put(c)
	}
	if over {
		return "", ErrTooManyMembers
	}
	return string(dst[:]), nil
}

// MaxMembers bounds the members of the objects a body's fingerprint is
// inside at once (an object's, and those of every object it is nested
// in): far above any request an API takes (OpenAI's structured outputs
// allow 5,000 properties in all, logit_bias 300 entries), it keeps the
// members' positions and the check for keys read alike to a few MiB.
const MaxMembers = 100_000

// ErrTooManyMembers: the body's objects hold more than MaxMembers
// members at once.
var ErrTooManyMembers = fmt.Errorf("the body's objects hold more than %d members at once (counting those of every object an object is nested in)", MaxMembers)

// maxPooledCanon bounds the buffers a pooled canonicalizer keeps: a 20 MiB
// body is canonicalised once in a fresh one rather than pinned for good.
const maxPooledCanon = 256 << 10

var canonPool = sync.Pool{New: func() any { return new(canonicalizer) }}

// canonicalizer writes a JSON value with whitespace removed and object keys
// sorted (stably: a repeated key keeps its order), into one buffer. An
// object's members are written as they come, each "key":value, then moved
// into key order through scratch; nested objects are finished before their
// parent sorts, so one scratch serves every level. The outermost object is
// not moved: its members go to sum in key order.
type canonicalizer struct {
	out, scratch []byte
	sum          hash.Hash
	digest       [sha256.Size]byte // sum's, without an allocation
	live         int               // members of the objects open
	over         bool              // live passed MaxMembers: the form is abandoned
}

// member is one object member in canonicalizer.out: the key (quotes
// included, as written) is out[start:colon] and the member out[start:end].
type member struct{ start, colon, end int }

func (c *canonicalizer) value(s *jsonscan.Scanner) {
	switch s.Peek() {
	case '{':
		c.object(s, false)
	case '[':
		c.out = append(c.out, '[')
		for i := range s.Elements() {
			if i > 0 {
				c.out = append(c.out, ',')
			}
			c.value(s)
			if c.over {
				return
			}
		}
		c.out = append(c.out, ']')
	default:
		c.out = append(c.out, s.Value()...)
	}
}

// object writes the object at s in canonical form: into c.out, or, for
// the outermost (last), to c.sum.
func (c *canonicalizer) object(s *jsonscan.Scanner, last bool) {
	var stack [16]member
	members := stack[:0]
	base := len(c.out)
	for key := range s.Members() {
		if c.live++; c.live > MaxMembers {
			c.over = true
		}
		if c.over {
			return
		}
		start := len(c.out)
		c.out = append(c.out, key...)
		colon := len(c.out)
		c.out = append(c.out, ':')
		c.value(s)
		members = append(members, member{start, colon, len(c.out)})
	}
	if c.over {
		return
	}
	c.live -= len(members)
	out := c.out
	alike := sameKeys(out, members)
	if alike == nil {
		slices.SortStableFunc(members, func(a, b member) int {
			return bytes.Compare(out[a.start:a.colon], out[b.start:b.colon])
		})
	} else {
		slices.SortStableFunc(members, func(a, b member) int { return strings.Compare(alike[a.start], alike[b.start]) })
	}
	if last {
		c.hashSorted(members, alike != nil)
		return
	}
	c.scratch = append(c.scratch[:0], c.out[base:]...)
	c.out = append(c.out[:base], '{')
	if alike != nil {
		c.out = append(c.out, 0) // never in valid JSON: no body without such keys canonicalises alike
	}
	for i, m := range members {
		if i > 0 {
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, c.scratch[m.start-base:m.end-base]...)
	}
	c.out = append(c.out, '}')
}

// hashSorted writes to c.sum what object writes to c.out for an object
// whose members, in c.out, are sorted: the same bytes.
func (c *canonicalizer) hashSorted(members []member, alike bool) {
	open := canonBytes[:1] // {
	if alike {
		open = canonBytes[:2] // {, then the marker object writes
	}
	c.sum.Write(open)
	for i, m := range members {
		if i > 0 {
			c.sum.Write(canonBytes[2:3])
		}
		c.sum.Write(c.out[m.start:m.end])
	}
	c.sum.Write(canonBytes[3:])
}

// canonBytes are the bytes hashSorted writes besides members.
var canonBytes = []byte{'{', 0, ',', '}'}

// sameKeys reports an object whose members include two keys spelled apart
// that an upstream reads as one: the same once their escapes are decoded
// ("messages" and "\u006dessages", which every JSON parser reads alike) or
// their case folded ("messages" and "Messages", which Go's encoding/json
// reads alike; jsonscan.FoldedKey). Such an upstream reads the last of
// them, so their order is the request: it returns each member's key so
// read (by member start) for the members to be ordered by it, keeping the
// order of keys read alike; nil for an object without (almost every body:
// a scan of its keys' bytes).
func sameKeys(out []byte, members []member) map[int]string {
	if len(members) < 2 {
		return nil
	}
	plain := true
	for _, m := range members {
		for _, b := range out[m.start+1 : m.colon-1] {
			if b == '\\' || b >= 0x80 || 'A' <= b && b <= 'Z' {
				plain = false
			}
		}
	}
	if plain {
		return nil // lower-case ASCII keys without escapes: read alike only if written alike
	}
	read := make(map[int]string, len(members))
	spelled := make(map[string]string, len(members))
	alike := false
	for _, m := range members {
		raw := out[m.start:m.colon]
		k := jsonscan.FoldedKey(raw)
		read[m.start] = k
		if prev, ok := spelled[k]; ok && prev != string(raw) {
			alike = true
		}
		spelled[k] = string(raw)
	}
	if !alike {
		return nil
	}
	return read
}

// ParseKey accepts the header as a plain token or as an RFC 8941
// sf-string ("..." with \" and \\ escapes), per
// draft-ietf-httpapi-idempotency-key-header. The key is 1–255 printable
// ASCII characters.
func ParseKey(h string) (string, error) {
	h = strings.Trim(h, " \t")
	if h == "" {
		return "", errors.New("Idempotency-Key is empty")
	}
	key := h
	if h[0] == '"' {
		var b strings.Builder
		i := 1
		closed := false
		for i < len(h) {
			c := h[i]
			if c == '\\' {
				if i+1 >= len(h) || (h[i+1] != '"' && h[i+1] != '\\') {
					return "", errors.New(`Idempotency-Key: invalid escape in quoted string (only \" and \\ are allowed)`)
				}
				b.WriteByte(h[i+1])
				i += 2
				continue
			}
			if c == '"' {
				closed = true
				i++
				break
			}
			b.WriteByte(c)
			i++
		}
		if !closed || i != len(h) {
			return "", errors.New("Idempotency-Key: malformed quoted string")
		}
		key = b.String()
		if key == "" {
			return "", errors.New("Idempotency-Key is empty")
		}
	}
	if len(key) > cache.MaxIDLen {
		return "", fmt.Errorf("Idempotency-Key is %d characters long; at most %d are allowed", len(key), cache.MaxIDLen)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return "", errors.New("Idempotency-Key must be printable ASCII characters")
		}
	}
	if reserved(key) {
		return "", errors.New("Idempotency-Key has the form of the gateway's own keys (cache:[<tenant>:]<hex>, derived:<hex>): choose another")
	}
	return key, nil
}

// reserved reports a key of the form the gateway gives the records it
// keys itself, in the same scope and endpoint as a client's keys: a
// content-cache entry's ("cache:" [<tenant> ":"] <64 hex>, contentCacheID,
// with the tenant a chained gateway forwarded) and a derived key's
// ("derived:" <64 hex>, DerivedKey). A client sending one would take that
// record's place: its body under a cached body's key makes every request
// of that body a 422 (and that body would replay the cached answer).
func reserved(key string) bool {
	if rest, ok := strings.CutPrefix(key, "derived:"); ok {
		return isHex(rest, 64)
	}
	rest, ok := strings.CutPrefix(key, "cache:")
	if !ok || len(rest) < 64 || !isHex(rest[len(rest)-64:], 64) {
		return false
	}
	return len(rest) == 64 || len(rest) > 65 && rest[len(rest)-65] == ':'
}

// isHex reports whether s is n lower-case hex digits.
func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// DerivedHeader marks the answers to a request whose key was derived
// (DerivedKey) rather than sent: its value is "derived".
const DerivedHeader = "X-Llmgate-Idempotency-Key"

// DerivedKey is the idempotency key of a request that sent none, derived
// from its session — the values of the header its client names
// (clients[].derive_idempotency_key) — and its fingerprint fp, narrowed
// to the tenant a chained gateway forwarded ("" for none). The same
// session sending the same request again gets the same key; another
// request, or another session, another key, so a derived key never meets
// a second fingerprint (never a 422). The caller scopes it to its client,
// as every key. Each part is length-prefixed, so no two sessions run
// together into one.
func DerivedKey(tenant string, session []string, fp string) string {
	h := sha256.New()
	part := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	part("llmgate derived key v1")
	part(tenant)
	part(fp)
	for _, v := range session {
		part(v)
	}
	return "derived:" + hex.EncodeToString(h.Sum(nil))
}

// RawFingerprint is the hash that fingerprints a body that is neither JSON
// nor a multipart form: its bytes, after a prefix naming the kind and the
// body's media type (mediaType, as parsed: lower case, no parameters). The
// prefix starts with a byte 0xff, with which neither a JSON body's hashed
// bytes (canonical JSON, ASCII) nor a form's (a part name's 8-byte length
// first) can start, so no JSON body or form shares a raw body's
// fingerprint; nor do the same bytes sent as another media type.
func RawFingerprint(mediaType string) hash.Hash {
	h := sha256.New()
	h.Write([]byte{0xff})
	writeString(h, "raw body")
	writeString(h, mediaType)
	return h
}
