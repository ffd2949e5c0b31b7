package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// routing is what the gateway reads from a request body to route it. The
// body itself is forwarded untouched: it is never re-encoded.
type routing struct {
	Model  string
	Stream bool
}

// errDepth reports a body nested deeper than the configured limit.
var errDepth = errors.New("JSON nested too deeply")

// parseRouting validates body as one JSON object no deeper than maxDepth and
// returns its top-level "model" and "stream". It is a small hand-written
// scanner rather than json.Unmarshal: it runs on every request, checks the
// nesting limit in the same pass, and allocates only the model string.
func parseRouting(body []byte, maxDepth int) (routing, error) {
	s := scanner{buf: body, maxDepth: maxDepth}
	var r routing
	s.skipSpace()
	if s.pos >= len(s.buf) || s.buf[s.pos] != '{' {
		return r, s.fail("the request body must be a JSON object")
	}
	s.pos++
	s.depth = 1
	s.skipSpace()
	if s.peek() == '}' {
		s.pos++
	} else {
		for {
			s.skipSpace()
			kStart := s.pos
			if err := s.str(); err != nil {
				return r, err
			}
			key := s.buf[kStart:s.pos]
			s.skipSpace()
			if s.peek() != ':' {
				return r, s.fail("expected ':' after object key")
			}
			s.pos++
			s.skipSpace()
			vStart := s.pos
			if err := s.value(); err != nil {
				return r, err
			}
			val := s.buf[vStart:s.pos]
			switch string(key) {
			case `"model"`:
				if len(val) == 0 || val[0] != '"' {
					return r, &fieldError{Param: "model", Msg: "model must be a string"}
				}
				m, err := unquote(val)
				if err != nil {
					return r, s.fail("invalid string")
				}
				r.Model = m
			case `"stream"`:
				switch string(val) {
				case "true":
					r.Stream = true
				case "false", "null":
					r.Stream = false
				default:
					return r, &fieldError{Param: "stream", Msg: "stream must be a boolean"}
				}
			}
			s.skipSpace()
			c := s.peek()
			s.pos++
			if c == '}' {
				break
			}
			if c != ',' {
				return r, s.fail("expected ',' or '}' in object")
			}
		}
	}
	s.skipSpace()
	if s.pos != len(s.buf) {
		return r, s.fail("unexpected data after the JSON object")
	}
	return r, nil
}

// fieldError is a well-formed body with a field of the wrong type.
type fieldError struct{ Param, Msg string }

func (e *fieldError) Error() string { return e.Msg }

// syntaxError is a malformed body, with the byte offset where it went wrong.
type syntaxError struct {
	Msg    string
	Offset int
}

func (e *syntaxError) Error() string { return fmt.Sprintf("%s (at byte %d)", e.Msg, e.Offset) }

func unquote(raw []byte) (string, error) {
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

type scanner struct {
	buf      []byte
	pos      int
	depth    int
	maxDepth int
}

func (s *scanner) fail(msg string) error { return &syntaxError{Msg: msg, Offset: s.pos} }

func (s *scanner) peek() byte {
	if s.pos < len(s.buf) {
		return s.buf[s.pos]
	}
	return 0
}

func (s *scanner) skipSpace() {
	for s.pos < len(s.buf) {
		switch s.buf[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *scanner) value() error {
	switch c := s.peek(); {
	case c == '"':
		return s.str()
	case c == '{', c == '[':
		return s.container()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number()
	default:
		return s.fail("invalid value")
	}
}

func (s *scanner) literal(lit string) error {
	if !bytes.HasPrefix(s.buf[s.pos:], []byte(lit)) {
		return s.fail("invalid literal")
	}
	s.pos += len(lit)
	return nil
}

func (s *scanner) number() error {
	start := s.pos
	if s.peek() == '-' {
		s.pos++
	}
	digits := func() int {
		n := 0
		for s.pos < len(s.buf) && s.buf[s.pos] >= '0' && s.buf[s.pos] <= '9' {
			s.pos++
			n++
		}
		return n
	}
	if s.peek() == '0' {
		s.pos++
	} else if digits() == 0 {
		return s.fail("invalid number")
	}
	if s.peek() == '.' {
		s.pos++
		if digits() == 0 {
			return s.fail("invalid number")
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.pos++
		if c := s.peek(); c == '+' || c == '-' {
			s.pos++
		}
		if digits() == 0 {
			return s.fail("invalid number")
		}
	}
	if s.pos == start {
		return s.fail("invalid number")
	}
	return nil
}

func (s *scanner) str() error {
	if s.peek() != '"' {
		return s.fail("expected string")
	}
	s.pos++
	for s.pos < len(s.buf) {
		c := s.buf[s.pos]
		switch {
		case c == '"':
			s.pos++
			return nil
		case c == '\\':
			s.pos++
			switch s.peek() {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.pos++
			case 'u':
				if s.pos+5 > len(s.buf) {
					return s.fail("invalid escape")
				}
				for _, h := range s.buf[s.pos+1 : s.pos+5] {
					if !isHex(h) {
						return s.fail("invalid escape")
					}
				}
				s.pos += 5
			default:
				return s.fail("invalid escape")
			}
		case c < 0x20:
			return s.fail("control character in string")
		default:
			s.pos++
		}
	}
	return s.fail("unterminated string")
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func (s *scanner) container() error {
	open := s.buf[s.pos]
	closeCh := byte('}')
	if open == '[' {
		closeCh = ']'
	}
	s.depth++
	if s.maxDepth > 0 && s.depth > s.maxDepth {
		return errDepth
	}
	s.pos++
	s.skipSpace()
	if s.peek() == closeCh {
		s.pos++
		s.depth--
		return nil
	}
	for {
		s.skipSpace()
		if open == '{' {
			if err := s.str(); err != nil {
				return err
			}
			s.skipSpace()
			if s.peek() != ':' {
				return s.fail("expected ':' after object key")
			}
			s.pos++
			s.skipSpace()
		}
		if err := s.value(); err != nil {
			return err
		}
		s.skipSpace()
		c := s.peek()
		if c == closeCh {
			s.pos++
			s.depth--
			return nil
		}
		if c != ',' {
			return s.fail("expected ',' or closing bracket")
		}
		s.pos++
	}
}

// fingerprint hashes a request body for idempotency: same key with another
// fingerprint is a 422. What counts: every value, as written. What does not:
// insignificant whitespace and the order of object keys, so a retry from an
// SDK (or another process of the same workflow) that serialises the same
// call differently still matches. Numbers and strings are compared as
// written ("1.0" and "1" differ, as do "\u0041" and "A"). body must already
// have passed parseRouting.
func fingerprint(body []byte) string {
	var canon bytes.Buffer
	canon.Grow(len(body))
	s := scanner{buf: body}
	s.skipSpace()
	canonical(&s, &canon)
	sum := sha256.Sum256(canon.Bytes())
	return hex.EncodeToString(sum[:])
}

// canonical writes the value at s to out with whitespace removed and object
// keys sorted. The input is valid JSON.
func canonical(s *scanner, out *bytes.Buffer) {
	switch s.peek() {
	case '{':
		s.pos++
		type member struct{ key, val []byte }
		var members []member
		for {
			s.skipSpace()
			if s.peek() == '}' {
				s.pos++
				break
			}
			if s.peek() == ',' {
				s.pos++
				continue
			}
			kStart := s.pos
			_ = s.str()
			key := s.buf[kStart:s.pos]
			s.skipSpace()
			s.pos++ // ':'
			s.skipSpace()
			var v bytes.Buffer
			canonical(s, &v)
			members = append(members, member{key, v.Bytes()})
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
		s.pos++
		out.WriteByte('[')
		first := true
		for {
			s.skipSpace()
			if s.peek() == ']' {
				s.pos++
				break
			}
			if s.peek() == ',' {
				s.pos++
				continue
			}
			if !first {
				out.WriteByte(',')
			}
			first = false
			canonical(s, out)
		}
		out.WriteByte(']')
	default:
		start := s.pos
		_ = s.value()
		out.Write(s.buf[start:s.pos])
	}
}

// maxKeyLen is the longest Idempotency-Key accepted.
const maxKeyLen = 255

// parseIdempotencyKey accepts the header as a plain token or as an RFC 8941
// sf-string ("..." with \" and \\ escapes), per
// draft-ietf-httpapi-idempotency-key-header. The key is 1–255 printable
// ASCII characters.
func parseIdempotencyKey(h string) (string, error) {
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
	if len(key) > maxKeyLen {
		return "", fmt.Errorf("Idempotency-Key is %d characters long; at most %d are allowed", len(key), maxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return "", errors.New("Idempotency-Key must be printable ASCII characters")
		}
	}
	return key, nil
}
