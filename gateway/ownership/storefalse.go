package ownership

import "github.com/llmgate/llmgate/classify/jsonscan"

var storeKeys = jsonscan.NewKeys("store")

// StoreFalse returns body with its top-level "store" set to false, for an
// upstream with force_store_false: the value of every member whose key is
// store, in any case (a Go upstream's decoder folds keys), is replaced,
// and unless one is spelled store exactly (all an exact-case upstream
// reads), "store":false is added as the first member. Every other byte is
// kept as the client wrote it. body has been validated as one JSON object
// with no repeated store (the gateway refuses a repeat); a body that is
// not an object is returned unchanged, and the upstream will refuse it.
func StoreFalse(body []byte) []byte {
	s := jsonscan.New(body, 0)
	if s.Peek() != '{' {
		return body
	}
	open := s.Pos()
	out := make([]byte, 0, len(body)+15)
	exact, last := false, 0
	for key := range s.Members() {
		if storeKeys.Index(key) < 0 {
			continue
		}
		exact = exact || jsonscan.Equal(key, "store")
		s.Peek()
		start := s.Pos()
		s.Skip()
		out = append(append(out, body[last:start]...), "false"...)
		last = s.Pos()
	}
	if s.Err() != nil {
		return body
	}
	out = append(out, body[last:]...)
	if exact {
		return out
	}
	rest := out[open+1:]
	add := `"store":false`
	if !emptyObject(rest) {
		add += ","
	}
	return append(append(append(make([]byte, 0, len(out)+len(add)), out[:open+1]...), add...), rest...)
}

// emptyObject reports whether rest, what follows an object's '{', holds no
// member: only whitespace before its '}'.
func emptyObject(rest []byte) bool {
	for _, c := range rest {
		switch c {
		case ' ', '\t', '\n', '\r':
		default:
			return c == '}'
		}
	}
	return false
}

// Stored reports whether a Responses request body asks the provider to
// store the response: unless its top-level "store" is false (OpenAI's
// default is true). A response not stored cannot be named later, so its
// owner need not be recorded. In doubt it is stored: "STORE":false is
// false to a Go upstream but no store at all to an exact-case one.
func Stored(body []byte) bool {
	s := jsonscan.New(body, 0)
	exactFalse := false
	for key := range s.Members() {
		if storeKeys.Index(key) < 0 {
			continue
		}
		if string(s.Value()) != "false" {
			return true
		}
		exactFalse = exactFalse || jsonscan.Equal(key, "store")
	}
	return !exactFalse
}
