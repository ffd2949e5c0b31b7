package ownership

import "github.com/llmgate/llmgate/classify/jsonscan"

var storeKeys = jsonscan.NewKeys("store")

// StoreFalse returns body with its top-level "store" set to false, for an
// upstream with force_store_false: the value of an existing store member is
// replaced, or "store":false is added as the first member. Every other byte
// is kept as the client wrote it. body has been validated as one JSON
// object with no repeated store (the gateway refuses a repeat); a body that
// is not an object is returned unchanged, and the upstream will refuse it.
func StoreFalse(body []byte) []byte {
	s := jsonscan.New(body, 0)
	if s.Peek() != '{' {
		return body
	}
	open := s.Pos()
	for range s.Fields(storeKeys) {
		s.Peek()
		start := s.Pos()
		s.Skip()
		end := s.Pos()
		if s.Err() != nil {
			return body
		}
		out := make([]byte, 0, len(body)-(end-start)+5)
		out = append(out, body[:start]...)
		out = append(out, "false"...)
		return append(out, body[end:]...)
	}
	if s.Err() != nil {
		return body
	}
	out := make([]byte, 0, len(body)+15)
	out = append(out, body[:open+1]...)
	out = append(out, `"store":false`...)
	if !emptyObject(body[open+1:]) {
		out = append(out, ',')
	}
	return append(out, body[open+1:]...)
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
// owner need not be recorded.
func Stored(body []byte) bool {
	s := jsonscan.New(body, 0)
	for range s.Fields(storeKeys) {
		return string(s.Value()) != "false"
	}
	return true
}
