package request

import (
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/llmgate/llmgate/classify/jsonscan"
)

// routing is what the gateway reads from a request body to route it. The
// body itself is forwarded untouched: it is never re-encoded.
type routing struct {
	Model  string
	Stream bool

	// The fields below are read for what comes next (budgets, the
	// Responses API). A value of an unexpected type is accepted here, and
	// leaves the typed field at its zero value (Raw shows what was
	// there), except that a count or background of another type (or a
	// count spelled otherwise) is noted, for endpoint.typed to refuse where
	// a budget reads it.

	// MaxTokens is the output the request allows: max_tokens,
	// max_completion_tokens or max_output_tokens (the largest set, as a
	// count); 0 when none is. Its budget reservation is sized by it.
	MaxTokens int64
	// Choices is how many answers the request asks for: the larger of n
	// and best_of when set (a count), else 1. Its reservation covers
	// MaxTokens for each.
	Choices int64
	// Prompts is how many prompts a legacy completion's prompt holds: the
	// length of an array of strings or of token arrays (each is answered
	// Choices times); 0 for one prompt or none.
	Prompts int64
	// IncludeUsage is stream_options.include_usage == true.
	IncludeUsage bool
	// PreviousResponseID is previous_response_id when it is a string.
	PreviousResponseID string
	// Background is background == true.
	Background bool
	// Store is store when it is a boolean, optUnset when absent or null.
	Store optBool
	// ConversationID is conversation when it is a string, or its "id" when
	// it is an object with a string id.
	ConversationID string
	// Raw holds these fields as written, nil when absent.
	Raw struct{ StreamOptions, PreviousResponseID, Background, Store, Conversation []byte }
	// uncounted names the first count (max_tokens, n…) written as neither
	// a number nor null, or under another spelling ("MAX_TOKENS"), and
	// untypedBackground is background written as neither a boolean nor
	// null: a budget's reservation cannot read them as every upstream
	// would ("200" is 200 to a lenient one). endpoint.typed refuses them
	// where the gateway reads them.
	uncounted         string
	misspelled        bool // uncounted for its key's spelling, not its value
	untypedBackground bool
}

// optBool is a boolean a body may leave out.
type optBool uint8

const (
	optUnset optBool = iota
	optFalse
	optTrue
)

// routingKeys are the top-level fields parseRouting reads. Each may appear
// once, in any case: the gateway and the upstream must not read different
// values.
var routingKeys = jsonscan.NewKeys("model", "stream", "stream_options", "previous_response_id", "background", "store", "conversation",
	"max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of", "prompt")

var (
	streamOptionsKeys = jsonscan.NewKeys("include_usage")
	conversationKeys  = jsonscan.NewKeys("id")
)

// errDepth reports a body nested deeper than the configured limit.
var errDepth = jsonscan.ErrTooDeep

// parseRouting validates body as one JSON object no deeper than maxDepth and
// reads the top-level fields in routingKeys. It scans rather than calls
// json.Unmarshal: it runs on every request, checks the nesting limit in the
// same pass, and allocates only the strings it returns.
//
// Keys match after unescaping, case-insensitively under Unicode simple
// folding, as a Go upstream's encoding/json reads them ("MODEL" and
// "Mod\u0065l" are model); a field the gateway reads that appears twice,
// in any case, is refused (most decoders keep the last, some the first,
// some refuse, an exact-case one reads only "model": the gateway cannot
// know which value the upstream would use).
func parseRouting(body []byte, maxDepth int) (routing, error) {
	var r routing
	s := jsonscan.New(body, maxDepth)
	if s.Peek() != '{' {
		return r, &syntaxError{Msg: "the request body must be a JSON object", Offset: s.Pos()}
	}
	for key, dup := range s.Fields(routingKeys) {
		if dup {
			return r, &fieldError{Param: key, Code: "duplicate_field", Msg: key + " appears more than once in the request body"}
		}
		if err := r.read(s, key); err != nil {
			return r, err
		}
	}
	if err := s.Err(); err != nil {
		return r, err
	}
	if !s.AtEnd() {
		return r, &syntaxError{Msg: "unexpected data after the JSON object", Offset: s.Pos()}
	}
	return r, nil
}

// read reads the value of the top-level field key, s at it.
func (r *routing) read(s *jsonscan.Scanner, key string) error {
	v := s.Value()
	if v == nil {
		return nil // malformed: s.Err says why
	}
	switch key {
	case "model":
		if v[0] != '"' {
			return &fieldError{Param: "model", Msg: "model must be a string"}
		}
		r.Model = jsonscan.Unquote(v)
		if e := badModel(r.Model); e != nil {
			r.Model = "" // not logged either
			return e
		}
	case "stream":
		switch string(v) {
		case "true":
			r.Stream = true
		case "false", "null":
			r.Stream = false
		default:
			return &fieldError{Param: "stream", Msg: "stream must be a boolean"}
		}
	case "stream_options":
		r.Raw.StreamOptions = v
		sub := jsonscan.New(v, 0)
		for range sub.Fields(streamOptionsKeys) {
			r.IncludeUsage = string(sub.Value()) == "true"
		}
	case "max_tokens", "max_completion_tokens", "max_output_tokens":
		if n, ok := count(v); ok && n > r.MaxTokens {
			r.MaxTokens = n
		}
		r.noteUncounted(key, v, s.Key())
	case "n", "best_of":
		if n, ok := count(v); ok && n > r.Choices {
			r.Choices = n
		}
		r.noteUncounted(key, v, s.Key())
	case "prompt":
		r.Prompts = prompts(v)
	case "previous_response_id":
		r.Raw.PreviousResponseID = v
		if v[0] == '"' {
			r.PreviousResponseID = jsonscan.Unquote(v)
		}
	case "background":
		r.Raw.Background = v
		r.Background = string(v) == "true"
		r.untypedBackground = string(v) != "true" && string(v) != "false" && string(v) != "null"
	case "store":
		r.Raw.Store = v
		switch string(v) {
		case "true":
			r.Store = optTrue
		case "false":
			r.Store = optFalse
		}
	case "conversation":
		r.Raw.Conversation = v
		switch v[0] {
		case '"':
			r.ConversationID = jsonscan.Unquote(v)
		case '{':
			sub := jsonscan.New(v, 0)
			for range sub.Fields(conversationKeys) {
				r.ConversationID = jsonscan.Unquote(sub.Value())
			}
		}
	}
	return nil
}

// maxModelBytes is the longest model name the gateway takes. What learns
// models keeps a name for the life of the process — a breaker of its own
// and a metric label, up to 64 of each per upstream — and the request log
// writes it on every line: unbounded, one tenant's names (up to a whole
// body long) could pin memory for every tenant. Real names are far
// shorter: OpenAI fine-tune ids, Bedrock ARNs and Hugging Face ids are
// all well under 200 bytes.
const maxModelBytes = 256

// badModel is the client's error for a model name the gateway does not
// take, nil for any other: one over maxModelBytes (worded as OpenAI words
// a string too long), or one that is not UTF-8 — a multipart field or a
// path keeps the bytes sent, and a metric label (a breaker's, a
// request's) that is not UTF-8 panics the Prometheus client.
func badModel(model string) *fieldError {
	switch {
	case len(model) > maxModelBytes:
		return &fieldError{Param: "model", Code: "string_above_max_length", Msg: fmt.Sprintf(
			"Invalid 'model': string too long. Expected a string of at most %d bytes, but got one of %d bytes", maxModelBytes, len(model))}
	case !utf8.ValidString(model):
		return &fieldError{Param: "model", Code: "invalid_value", Msg: "Invalid 'model': not valid UTF-8"}
	}
	return nil
}

// fieldError is a well-formed body with a field llmgate cannot accept: of
// the wrong type, or there twice.
type fieldError struct {
	Param string
	Code  string // OpenAI error.code, "" for none
	Msg   string
}

func (e *fieldError) Error() string { return e.Msg }

// syntaxError is a malformed body, with the byte offset where it went wrong.
type syntaxError = jsonscan.SyntaxError

// prompts is how many prompts the prompt value v holds: an array's
// elements when they are strings or token arrays, else 0 (one prompt: a
// string, or an array of tokens).
func prompts(v []byte) int64 {
	if v[0] != '[' {
		return 0
	}
	var n int64
	arr := jsonscan.New(v, 0)
	for range arr.Elements() {
		if e := arr.Value(); len(e) == 0 || e[0] != '"' && e[0] != '[' {
			return 0
		}
		n++
	}
	return n
}

// noteUncounted records key when its value v is neither a JSON number
// nor null (a number starts with '-' or a digit), or when the member's
// key as written (raw) is another spelling of it ("MAX_TOKENS"): a Go
// upstream reads that as the count, an exact-case one (Python's) not at
// all, so no reservation suits both.
func (r *routing) noteUncounted(key string, v, raw []byte) {
	if r.uncounted != "" {
		return
	}
	if !jsonscan.Equal(raw, key) {
		r.uncounted, r.misspelled = key, true
	} else if v[0] != '-' && (v[0] < '0' || v[0] > '9') && string(v) != "null" {
		r.uncounted = key
	}
}

// count reads a JSON number as a count, as a provider's decoder would:
// 8, 8.0 and 8e0 are 8 (a budget reservation must not read "8.0" as "not
// set"); a fraction or a negative is not a count. A whole number past
// the integer range (1e300, 2⁶⁴) counts as the most there is: an upstream
// that reads big integers runs to its own cap, so the reservation must
// not fall back to the default.
func count(v []byte) (int64, bool) {
	if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
		return n, n >= 0
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if math.IsInf(f, 1) { // 1e400: ParseFloat's range error
		return math.MaxInt64, true
	}
	if err != nil || f < 0 || f != math.Trunc(f) {
		return 0, false
	}
	if f >= math.MaxInt64 {
		return math.MaxInt64, true
	}
	return int64(f), true
}
