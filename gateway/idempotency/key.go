package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

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
func Fingerprint(body []byte) string {
	var canon bytes.Buffer
	canon.Grow(len(body))
	canonical(jsonscan.New(body, 0), &canon)
	sum := sha256.Sum256(canon.Bytes())
	return hex.EncodeToString(sum[:])
}

// canonical writes the value at s to out with whitespace removed and object
// keys sorted. The input is valid JSON.
func canonical(s *jsonscan.Scanner, out *bytes.Buffer) {
	switch s.Peek() {
	case '{':
		type member struct{ key, val []byte }
		var members []member
		for key := range s.Members() {
			var val []byte
			if c := s.Peek(); c == '{' || c == '[' {
				var v bytes.Buffer
				canonical(s, &v)
				val = v.Bytes()
			} else {
				val = s.Value()
			}
			members = append(members, member{key, val})
		}
		slices.SortStableFunc(members, func(a, b member) int { return bytes.Compare(a.key, b.key) })
		out.WriteByte('{')
		for i, m := range members {
			if i > 0 {
				out.WriteByte(',')
			}
			out.Write(m.key)
			out.WriteByte(':')
			out.Write(m.val)
		}
		out.WriteByte('}')
	case '[':
		out.WriteByte('[')
		for i := range s.Elements() {
			if i > 0 {
				out.WriteByte(',')
			}
			canonical(s, out)
		}
		out.WriteByte(']')
	default:
		out.Write(s.Value())
	}
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
	return key, nil
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
