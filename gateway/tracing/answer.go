package tracing

import (
	"bytes"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/llmgate/llmgate/classify/jsonscan"
)

// What an upstream says is bounded before it becomes an attribute: a model
// name, an id, a finish reason, and how many choices are counted.
const (
	maxNameBytes = 256
	maxChoices   = 128
)

var (
	answerKeys = jsonscan.NewKeys("id", "model", "choices", "usage")
	choiceKeys = jsonscan.NewKeys("index", "finish_reason")
	usageKeys  = jsonscan.NewKeys("prompt_tokens", "completion_tokens")

	// Anthropic's: a message (or message_start's "message"), a
	// message_delta's "delta" with the stop_reason, and the usage of
	// either, the last count of each winning (message_delta's is
	// cumulative).
	messageKeys      = jsonscan.NewKeys("id", "model", "message", "stop_reason", "delta", "usage")
	messageDeltaKeys = jsonscan.NewKeys("stop_reason")
	messageUsageKeys = jsonscan.NewKeys("input_tokens", "output_tokens")
)

// answer is what the GenAI conventions record of a response: the model
// that answered, the completion's id, each choice's finish reason and the
// token usage. Nothing of the content is read.
type answer struct {
	// anthropic: the answer is Anthropic's Messages (a message, or its
	// typed events), read by scanMessage.
	anthropic       bool
	id, model       string
	finish          []string // by choice index
	input, output   int
	hasIn, hasOut   bool
	sawAnyChoiceEnd bool
}

// read reads a buffered answer: a chat completion, a text completion or an
// embedding list. A body that does not scan keeps what was read before the
// fault.
func (a *answer) read(body []byte) { a.scan(body) }

// observe reads one stream event's data: the first chunk names the model,
// the chunks with a finish_reason end their choices, and the usage chunk
// (stream_options.include_usage) counts the tokens.
func (a *answer) observe(data []byte) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return // [DONE], or not an object
	}
	a.scan(data)
}

func (a *answer) scan(b []byte) {
	if a.anthropic {
		a.scanMessage(jsonscan.New(b, 0))
		return
	}
	s := jsonscan.New(b, 0)
	for key := range s.Fields(answerKeys) {
		switch key {
		case "id":
			if a.id == "" {
				a.id = bounded(s.Value())
			}
		case "model":
			if a.model == "" {
				a.model = bounded(s.Value())
			}
		case "choices":
			for i := range s.Elements() {
				a.choice(s, i)
			}
		case "usage":
			for key := range s.Fields(usageKeys) {
				n, ok := count(s.Value())
				switch {
				case !ok:
				case key == "prompt_tokens":
					a.input, a.hasIn = n, true
				case key == "completion_tokens":
					a.output, a.hasOut = n, true
				}
			}
		}
	}
}

// scanMessage reads an Anthropic message or stream event at s: its id and
// model (message_start's under "message"), its stop_reason as the one
// finish reason, and its usage counts.
func (a *answer) scanMessage(s *jsonscan.Scanner) {
	for key := range s.Fields(messageKeys) {
		switch key {
		case "id":
			if a.id == "" {
				a.id = bounded(s.Value())
			}
		case "model":
			if a.model == "" {
				a.model = bounded(s.Value())
			}
		case "message":
			a.scanMessage(s)
		case "stop_reason":
			a.stopReason(s.Value())
		case "delta":
			for range s.Fields(messageDeltaKeys) {
				a.stopReason(s.Value())
			}
		case "usage":
			for key := range s.Fields(messageUsageKeys) {
				n, ok := count(s.Value())
				switch {
				case !ok:
				case key == "input_tokens":
					a.input, a.hasIn = n, true
				case key == "output_tokens":
					a.output, a.hasOut = n, true
				}
			}
		}
	}
}

// stopReason files a message's stop_reason (tok; null is none) as its
// finish reason.
func (a *answer) stopReason(tok []byte) {
	if r := bounded(tok); r != "" {
		a.finish, a.sawAnyChoiceEnd = []string{r}, true
	}
}

// choice reads one element of "choices": its finish_reason, filed under its
// "index" (a stream sends each choice's end in its own chunk), or under its
// position when it has none.
func (a *answer) choice(s *jsonscan.Scanner, pos int) {
	index, reason := pos, ""
	for key := range s.Fields(choiceKeys) {
		switch key {
		case "index":
			if n, ok := count(s.Value()); ok {
				index = n
			}
		case "finish_reason":
			reason = bounded(s.Value())
		}
	}
	if reason == "" || index >= maxChoices {
		return
	}
	for len(a.finish) <= index {
		a.finish = append(a.finish, "")
	}
	a.finish[index] = reason
	a.sawAnyChoiceEnd = true
}

// attributes are the gen_ai.response.* and gen_ai.usage.* attributes known.
func (a *answer) attributes() []attribute.KeyValue {
	var attrs []attribute.KeyValue
	if a.model != "" {
		attrs = append(attrs, semconv.GenAIResponseModel(a.model))
	}
	if a.id != "" {
		attrs = append(attrs, semconv.GenAIResponseID(a.id))
	}
	if a.sawAnyChoiceEnd {
		attrs = append(attrs, semconv.GenAIResponseFinishReasons(a.finish...))
	}
	if a.hasIn {
		attrs = append(attrs, semconv.GenAIUsageInputTokens(a.input))
	}
	if a.hasOut {
		attrs = append(attrs, semconv.GenAIUsageOutputTokens(a.output))
	}
	return attrs
}

// bounded is a JSON string's text, up to maxNameBytes; "" for anything
// else (null, a number).
func bounded(tok []byte) string {
	if len(tok) > maxNameBytes+2 {
		return ""
	}
	return jsonscan.Unquote(tok)
}

// count reads a JSON number that is a non-negative integer.
func count(tok []byte) (int, bool) {
	n, err := strconv.Atoi(string(tok))
	return n, err == nil && n >= 0
}
