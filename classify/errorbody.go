package classify

import (
	"strconv"

	"github.com/llmgate/llmgate/classify/jsonscan"
)

// errorFields is what classification needs from an error object.
type errorFields struct {
	typ, code string
	// detail is error.details.error_code (Anthropic's finer reason: a 429
	// rate_limit_error whose detail is a spend limit is no rate limit).
	detail string
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
	s := jsonscan.New(body, 0)
	if s.Peek() == '[' {
		// Gemini wraps the object in an array: step in, to its first
		// element.
		for range s.Elements() {
			break
		}
	}
	for key := range s.Fields(envelopeKeys) {
		if key == "error" && s.Peek() == '{' {
			seenInner = true
			for key := range s.Fields(errorKeys) {
				errorMember(s, &inner, key)
			}
			continue
		}
		errorMember(s, &top, key)
	}
	if seenInner {
		return inner
	}
	return top
}

var (
	envelopeKeys = jsonscan.NewExactKeys("error", "type", "code", "details")
	errorKeys    = jsonscan.NewExactKeys("type", "code", "details")
	detailsKeys  = jsonscan.NewExactKeys("error_code")
)

// errorMember reads the value of an error object's member key into dst.
func errorMember(s *jsonscan.Scanner, dst *errorFields, key string) {
	switch key {
	case "type":
		if raw := s.Value(); len(raw) > 0 && raw[0] == '"' {
			dst.typ = jsonscan.Unquote(raw)
		}
	case "code":
		if raw := s.Value(); raw != nil {
			dst.code, dst.status = codeValue(raw)
		}
	case "details":
		for range s.Fields(detailsKeys) {
			if raw := s.Value(); len(raw) > 0 && raw[0] == '"' {
				dst.detail = jsonscan.Unquote(raw)
			}
		}
	}
}

// codeValue reads error.code: a string, a number (kept as its literal, and
// as a status when it is one), or anything else (ignored).
func codeValue(raw []byte) (code string, status int) {
	switch c := raw[0]; {
	case c == '"':
		return jsonscan.Unquote(raw), 0
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
