package classify

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// errorFields is what classification needs from an error object.
type errorFields struct {
	typ, code string
	// status is error.code when that is a number that is an HTTP error
	// status (Google's {"error":{"code":429,...}}), else 0.
	status int
}

// parseErrorBody extracts the type and code of an error body, which may be
// {"error":{"type","code",...}}, a flat {"type","code",...}, either one
// wrapped in an array (Gemini's OpenAI-compatible endpoint), truncated,
// empty, HTML from a proxy, or anything else. Fields are taken as the
// walk reaches them, so a body cut off by the caller's size limit still
// yields those that came before the cut. An "error" object wins over
// top-level fields (Anthropic sends {"type":"error","error":{...}}).
func parseErrorBody(body []byte) errorFields {
	var top, inner errorFields
	seenInner := false
	w := walker{b: body}
	member := func(dst *errorFields, key []byte) bool {
		switch string(key) {
		case "type":
			raw, ok := w.value()
			if ok && raw[0] == '"' {
				dst.typ = unquote(raw)
			}
			return ok
		case "code":
			raw, ok := w.value()
			if ok {
				dst.code, dst.status = codeValue(raw)
			}
			return ok
		}
		return w.skip()
	}
	envelope := func() {
		w.object(func(key []byte) bool {
			if string(key) == "error" && w.peek() == '{' {
				seenInner = true
				return w.object(func(key []byte) bool { return member(&inner, key) })
			}
			return member(&top, key)
		})
	}
	switch w.peek() {
	case '{':
		envelope()
	case '[':
		w.i++
		if w.peek() == '{' {
			envelope()
		}
	}
	if seenInner {
		return inner
	}
	return top
}

// codeValue reads error.code: a string, a number (kept as its literal, and
// as a status when it is one), or anything else (ignored).
func codeValue(raw []byte) (code string, status int) {
	switch c := raw[0]; {
	case c == '"':
		return unquote(raw), 0
	case c == '-' || c >= '0' && c <= '9':
		code = string(raw)
		return code, numericStatus(code)
	}
	return "", 0
}

// numericStatus returns s as a status if it is an integer in [400, 599]:
// an error object's code that is an error status (a 2xx in an error object
// would be nonsense).
func numericStatus(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 400 || n > 599 {
		return 0
	}
	return n
}

// unquote decodes a JSON string literal that the walker has validated; the
// common case, with no escapes, is one small allocation.
func unquote(b []byte) string {
	if bytes.IndexByte(b, '\\') < 0 {
		return string(b[1 : len(b)-1])
	}
	var s string
	_ = json.Unmarshal(b, &s)
	return s
}
