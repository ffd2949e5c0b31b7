package classify

import (
	"math"

	"github.com/llmgate/llmgate/classify/jsonscan"
)

// Tokens is what an answer's "usage" object says it cost:
// usage.prompt_tokens (In) and usage.completion_tokens (Out). Reported is
// false when the answer carried no usable usage object — none, null, or
// one without a count in prompt_tokens — and the counts are then 0: an
// answer that did not say what it cost is usage-missing, never zero
// tokens.
//
// The same object is read from every kind of answer: a chat completion and
// a legacy completion (prompt_tokens, completion_tokens), an embeddings
// list (prompt_tokens and total_tokens; Out is 0), the last chunk of a
// stream sent with stream_options.include_usage, a Responses answer and
// an Anthropic message (input_tokens, output_tokens).
type Tokens struct {
	In, Out  int64
	Reported bool
	// CacheCreation and CacheRead are Anthropic's
	// cache_creation_input_tokens and cache_read_input_tokens: input
	// written to and read from the prompt cache. Anthropic counts them
	// beside input_tokens, not in it, so they are kept beside In (the
	// whole input is In + CacheCreation + CacheRead); 0 where the answer
	// does not report them (OpenAI's cached_tokens, which prompt_tokens
	// includes, is not read).
	CacheCreation, CacheRead int64
	// Cached is OpenAI's usage.prompt_tokens_details.cached_tokens (the
	// Responses API's input_tokens_details.cached_tokens): input read
	// from the prompt cache, which In includes. 0 where not reported.
	Cached int64
}

// Usage reads the top-level "usage" object of a JSON answer. A count is a
// JSON integer from 0 to 2⁶³−1 (no sign, fraction or exponent);
// completion_tokens may be absent or null (0), prompt_tokens may not. Any
// other value in either field, a body that is not one valid JSON object,
// or a usage that is not an object is not Reported. When a key appears
// twice its last value counts, as encoding/json decodes it.
//
// It allocates nothing, and reads the body once, validating it as it goes.
func Usage(body []byte) Tokens {
	s := jsonscan.New(body, 0)
	if s.Peek() != '{' {
		return Tokens{}
	}
	var t Tokens
	for range s.Fields(answerKeys) {
		t = readUsage(s)
	}
	if s.Err() != nil || !s.AtEnd() {
		return Tokens{}
	}
	return t
}

var (
	answerKeys = jsonscan.NewExactKeys("usage")
	usageKeys  = jsonscan.NewExactKeys("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens",
		"cache_creation_input_tokens", "cache_read_input_tokens", "prompt_tokens_details", "input_tokens_details")
	detailKeys = jsonscan.NewExactKeys("cached_tokens")
)

// readUsage reads the usage value the scanner is at, consuming it. What it
// returns is only meaningful if the whole text turns out valid.
// The Responses API and Anthropic name the counts input_tokens and
// output_tokens; they are read as prompt_tokens and completion_tokens are.
// The input count is required; the output and cache counts may be absent
// or null (0); any count that is present and not one makes the whole
// object not Reported.
func readUsage(s *jsonscan.Scanner) Tokens {
	u, ok := readUsageFields(s)
	if !ok || u.state[usageIn] != counted {
		return Tokens{}
	}
	for _, st := range u.state {
		if st == notACount {
			return Tokens{}
		}
	}
	u.t.Reported = true
	return u.t
}

// The counts a usage object may hold, as indexes of usageRead.state.
const (
	usageIn = iota
	usageOut
	usageCacheCreation
	usageCacheRead
	usageFieldCount
)

// countState is what a usage object said of one count: the last value of
// its key, as encoding/json decodes a repeated key.
type countState uint8

const (
	absent    countState = iota // no such key
	null                        // null: the count is 0
	counted                     // a count
	notACount                   // anything else
)

// usageRead is one usage object as written: its counts, and what each
// key's value was.
type usageRead struct {
	t     Tokens
	state [usageFieldCount]countState
}

// readUsageFields reads the usage object the scanner is at; ok is false
// when the value is not an object (it is then not consumed).
func readUsageFields(s *jsonscan.Scanner) (u usageRead, ok bool) {
	if s.Peek() != '{' {
		return u, false // null, or not an object; the caller's loop skips it
	}
	for key := range s.Fields(usageKeys) {
		if key == "prompt_tokens_details" || key == "input_tokens_details" {
			u.t.Cached = readCached(s)
			continue
		}
		i, dst := usageField(&u.t, key)
		v := s.Value()
		n, isCount := count(v)
		switch {
		case isCount:
			*dst, u.state[i] = n, counted
		case string(v) == "null":
			*dst, u.state[i] = 0, null
		default:
			*dst, u.state[i] = 0, notACount
		}
	}
	return u, true
}

// readCached reads a details object's cached_tokens, consuming the value
// the scanner is at: 0 when it is no object or holds no count there. It
// is informative (a price for cached input), so a value that is not a
// count does not make the usage unreported.
func readCached(s *jsonscan.Scanner) int64 {
	if s.Peek() != '{' {
		s.Value()
		return 0
	}
	var n int64
	for range s.Fields(detailKeys) {
		n, _ = count(s.Value())
	}
	return n
}

// usageField is the index and the count in t that a usage key fills.
func usageField(t *Tokens, key string) (int, *int64) {
	switch key {
	case "prompt_tokens", "input_tokens":
		return usageIn, &t.In
	case "completion_tokens", "output_tokens":
		return usageOut, &t.Out
	case "cache_creation_input_tokens":
		return usageCacheCreation, &t.CacheCreation
	default: // cache_read_input_tokens
		return usageCacheRead, &t.CacheRead
	}
}

// count reads a token count: a JSON number of digits only, at most
// math.MaxInt64. v is a scanned value, so a number in it is valid JSON (no
// leading zeros).
func count(v []byte) (int64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	var n uint64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (math.MaxInt64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return int64(n), true
}
