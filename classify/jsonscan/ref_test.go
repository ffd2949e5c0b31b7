package jsonscan

import (
	"fmt"
	"testing"
)

// refScanner is the Scanner's validating skip as it was written before it
// kept its offset in local variables (commit 0d154e1 and its successors):
// byte at a time, s.pos updated as it goes. FuzzSkipAsBefore holds the
// Scanner to it, error message and offset included, since the gateway
// reports those to clients.
type refScanner struct {
	buf      []byte
	pos      int
	depth    int
	maxDepth int
	err      error
}

func (s *refScanner) fail(msg string, off int) bool {
	if s.err == nil {
		s.err = &SyntaxError{Msg: msg, Offset: off}
	}
	return false
}

func (s *refScanner) ws() {
	for s.pos < len(s.buf) {
		if c := s.buf[s.pos]; c > ' ' || c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return
		}
		s.pos++
	}
}

func (s *refScanner) value() bool {
	if s.err != nil {
		return false
	}
	if s.pos >= len(s.buf) {
		return s.fail("invalid value", s.pos)
	}
	switch c := s.buf[s.pos]; c {
	case '"':
		return s.str()
	case '{':
		return s.object()
	case '[':
		return s.array()
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		if c == '-' || c >= '0' && c <= '9' {
			return s.number()
		}
		return s.fail("invalid value", s.pos)
	}
}

func (s *refScanner) object() bool {
	if s.depth++; s.depth > s.maxDepth {
		s.err = ErrTooDeep
		return false
	}
	s.pos++
	s.ws()
	if s.pos < len(s.buf) && s.buf[s.pos] == '}' {
		s.pos++
		s.depth--
		return true
	}
	for {
		s.ws()
		if s.pos >= len(s.buf) || s.buf[s.pos] != '"' {
			return s.fail("expected string", s.pos)
		}
		if !s.str() {
			return false
		}
		s.ws()
		if s.pos >= len(s.buf) || s.buf[s.pos] != ':' {
			return s.fail("expected ':' after object key", s.pos)
		}
		s.pos++
		s.ws()
		if s.pos >= len(s.buf) || !valueStart(s.buf[s.pos]) {
			return s.fail("invalid value", s.pos)
		}
		if !s.value() {
			return false
		}
		s.ws()
		if s.pos < len(s.buf) {
			switch s.buf[s.pos] {
			case ',':
				s.pos++
				continue
			case '}':
				s.pos++
				s.depth--
				return true
			}
		}
		if s.depth == 1 {
			return s.fail("expected ',' or '}' in object", s.pos+1)
		}
		return s.fail("expected ',' or closing bracket", s.pos)
	}
}

func (s *refScanner) array() bool {
	if s.depth++; s.depth > s.maxDepth {
		s.err = ErrTooDeep
		return false
	}
	s.pos++
	s.ws()
	if s.pos < len(s.buf) && s.buf[s.pos] == ']' {
		s.pos++
		s.depth--
		return true
	}
	for {
		s.ws()
		if s.pos >= len(s.buf) || !valueStart(s.buf[s.pos]) {
			return s.fail("invalid value", s.pos)
		}
		if !s.value() {
			return false
		}
		s.ws()
		if s.pos < len(s.buf) {
			switch s.buf[s.pos] {
			case ',':
				s.pos++
				continue
			case ']':
				s.pos++
				s.depth--
				return true
			}
		}
		return s.fail("expected ',' or closing bracket", s.pos)
	}
}

func (s *refScanner) literal(lit string) bool {
	if len(s.buf)-s.pos < len(lit) || string(s.buf[s.pos:s.pos+len(lit)]) != lit {
		return s.fail("invalid literal", s.pos)
	}
	s.pos += len(lit)
	return true
}

func (s *refScanner) number() bool {
	b, i := s.buf, s.pos
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		return s.fail("invalid number", i)
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return s.fail("invalid number", j)
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
			return s.fail("invalid number", j)
		}
		i = j
	}
	s.pos = i
	return true
}

// str checks a string byte by byte against the grammar, with no fast path.
func (s *refScanner) str() bool {
	b := s.buf
	for i := s.pos + 1; ; {
		if i >= len(b) {
			return s.fail("unterminated string", len(b))
		}
		switch c := b[i]; {
		case c == '"':
			s.pos = i + 1
			return true
		case c < 0x20:
			return s.fail("control character in string", i)
		case c != '\\':
			i++
			continue
		}
		i++
		if i >= len(b) {
			return s.fail("invalid escape", i)
		}
		switch b[i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i++
		case 'u':
			if i+5 > len(b) || !isHex(b[i+1]) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) {
				return s.fail("invalid escape", i)
			}
			i += 5
		default:
			return s.fail("invalid escape", i)
		}
	}
}

// FuzzSkipAsBefore holds Skip to refScanner on arbitrary bytes and nesting
// limits: the same error (message and offset), or none and the same end.
func FuzzSkipAsBefore(f *testing.F) {
	for _, s := range []string{
		`{}`, ` [ 1 , { "a" : [ ] } ] `, `{"a":1`, `{"a":{"b":1 "c":2}}`, `[1,]`, `{"a":tru}`, `-`, `1e+`,
		`"\u12g4"`, "\"abcdefghijklmnop\x1f", `"abcdefghijklmnop`, `[[[[1]]]]`, `{"a":{"b":{"c":{}}}}`,
		`{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","choices":[{"delta":{"content":" brown"},"finish_reason":null}]}`,
	} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, body []byte, depth uint8) {
		maxDepth := int(depth % 8) // 0 is DefaultMaxDepth
		ref := refScanner{buf: body, maxDepth: maxDepth}
		if ref.maxDepth <= 0 {
			ref.maxDepth = DefaultMaxDepth
		}
		ref.ws()
		ref.value()
		s := New(body, maxDepth)
		s.Skip()
		if got, want := fmt.Sprint(s.Err()), fmt.Sprint(ref.err); got != want {
			t.Fatalf("Skip(%q, depth %d): error %s, before %s", body, maxDepth, got, want)
		}
		if s.Err() == nil && s.Pos() != ref.pos {
			t.Fatalf("Skip(%q, depth %d): at %d, before at %d", body, maxDepth, s.Pos(), ref.pos)
		}
	})
}
