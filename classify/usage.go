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
// list (prompt_tokens and total_tokens; Out is 0), and the last chunk of a
// stream sent with stream_options.include_usage.
type Tokens struct {
	In, Out  int64
	Reported bool
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
	usageKeys  = jsonscan.NewExactKeys("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")
)

// readUsage reads the usage value the scanner is at, consuming it. What it
// returns is only meaningful if the whole text turns out valid.
// The Responses API names the counts input_tokens and output_tokens; they
// are read as prompt_tokens and completion_tokens are.
func readUsage(s *jsonscan.Scanner) Tokens {
	if s.Peek() != '{' {
		return Tokens{} // null, or not an object; the caller's loop skips it
	}
	var t Tokens
	in, out := false, true // out: an absent output count is 0
	for key := range s.Fields(usageKeys) {
		v := s.Value()
		switch {
		case key == "prompt_tokens" || key == "input_tokens":
			t.In, in = count(v)
		case string(v) == "null":
			t.Out, out = 0, true
		default:
			t.Out, out = count(v)
		}
	}
	if !in || !out {
		return Tokens{}
	}
	t.Reported = true
	return t
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
