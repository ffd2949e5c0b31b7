package classify

import (
	"net/http"
	"time"

	"github.com/llmgate/llmgate/classify/jsonscan"
)

// Anthropic's Messages API (/v1/messages) answers with a message object:
// "content" holds typed blocks (text, thinking, redacted_thinking,
// tool_use, server_tool_use and the server tools' *_tool_result blocks),
// "stop_reason" says why the model stopped, and "usage" counts input,
// output and prompt-cache tokens. A stream is a sequence of typed events:
// message_start (the message, without content), per block
// content_block_start, content_block_delta and content_block_stop, then a
// message_delta with the stop_reason and the cumulative usage, and
// message_stop; ping may come at any point, and an error event ends a
// stream that failed.

// stopReason is what a message's stop_reason says, as far as the class
// cares.
type stopReason uint8

const (
	stopNone      stopReason = iota // absent or null: the message has not ended
	stopOther                       // end_turn, stop_sequence, tool_use, pause_turn, model_context_window_exceeded, and any reason this package does not judge
	stopMaxTokens                   // max_tokens: cut at the client's limit
	stopRefusal                     // refusal: the model declined
)

func stopReasonOf(v []byte) stopReason {
	switch {
	case v == nil || string(v) == "null":
		return stopNone
	case jsonscan.Equal(v, "refusal"):
		return stopRefusal
	case jsonscan.Equal(v, "max_tokens"):
		return stopMaxTokens
	}
	return stopOther
}

// NoteMaxTokens is the Note of a message cut at the client's max_tokens.
const NoteMaxTokens = "max_tokens"

// messageSummary is what one message object shows.
type messageSummary struct {
	stop      stopReason
	generated bool   // a block that is output
	content   bool   // a "content" member was there
	isError   bool   // "type":"error"
	errObject []byte // the raw "error" value, when it is an object
	usage     Tokens
}

var (
	messageKeys = jsonscan.NewExactKeys("type", "content", "stop_reason", "error", "usage")
	blockKeys   = jsonscan.NewExactKeys("type", "text")
)

// walkMessage reads the message object the scanner is at into sum.
func walkMessage(s *jsonscan.Scanner, sum *messageSummary) {
	for key := range s.Fields(messageKeys) {
		switch key {
		case "type":
			sum.isError = jsonscan.Equal(s.Value(), "error")
		case "content":
			sum.content = true
			for range s.Elements() {
				sum.generated = walkBlock(s) || sum.generated
			}
		case "stop_reason":
			sum.stop = stopReasonOf(s.Value())
		case "error":
			if s.Peek() == '{' {
				sum.errObject = s.Value()
			}
		case "usage":
			sum.usage = readUsage(s)
		}
	}
}

// walkBlock reads one content block and reports whether it is output: a
// text block with non-empty text, or any block that is neither text nor
// thinking (tool_use, server_tool_use, a server tool's result, and block
// types added later). thinking and redacted_thinking are not output: a
// model that only thought answered nothing. A block without a type is not
// output either.
func walkBlock(s *jsonscan.Scanner) bool {
	var typ []byte
	var text bool
	for key := range s.Fields(blockKeys) {
		switch key {
		case "type":
			typ = s.Value()
		case "text":
			text = nonEmpty(s.Value())
		}
	}
	switch {
	case typ == nil || typ[0] != '"':
		return false
	case jsonscan.Equal(typ, "text"):
		return text
	case jsonscan.Equal(typ, "thinking"), jsonscan.Equal(typ, "redacted_thinking"):
		return false
	}
	return true
}

// messageOutcome decides what a message that is not an error came to.
//
//   - stop_reason refusal: ContentFilter "stop_reason refusal" (the
//     provider declined, as a content_filter finish does; the same request
//     would be declined again).
//   - stop_reason max_tokens: Success, Note max_tokens (the model's
//     answer, cut where the client said), even without output.
//   - no content blocks, or none that is output (only empty text, or only
//     thinking): Empty.
//   - else Success: end_turn, stop_sequence, tool_use, pause_turn,
//     model_context_window_exceeded and any other stop_reason.
func messageOutcome(stop stopReason, generated bool) Outcome {
	switch {
	case stop == stopRefusal:
		return Outcome{Class: ContentFilter, Reason: "stop_reason refusal"}
	case stop == stopMaxTokens:
		return Outcome{Class: Success, Reason: "stop_reason max_tokens", Note: NoteMaxTokens}
	case !generated:
		return Outcome{Class: Empty, Reason: "empty output"}
	}
	return Outcome{Class: Success, Reason: "output"}
}

// FromMessages classifies the 2xx JSON body of POST /v1/messages; h and
// now are the response's headers and when they arrived, for the wait a
// retryable failure asks for.
//
//   - not a JSON object, or truncated: Transient "malformed message body".
//   - an error object ({"type":"error","error":{...}}, which a proxy in
//     front of Anthropic may send with a 200) and no content: classified
//     like FromResponse with status 0, from error.type and
//     error.details.error_code.
//   - else as messageOutcome decides (see POLICY.md): refusal →
//     ContentFilter; max_tokens → Success with Note max_tokens; no output
//     block → Empty; else Success.
//
// A retryable failure carries the Retry-After of h. Its Usage is the
// body's usage: input_tokens, output_tokens and the cache counts.
func FromMessages(body []byte, h http.Header, now time.Time) Outcome {
	s := jsonscan.New(body, 0)
	if s.Peek() != '{' {
		return Outcome{Class: Transient, Reason: "malformed message body"}
	}
	var sum messageSummary
	walkMessage(s, &sum)
	if s.Err() != nil || !s.AtEnd() {
		return Outcome{Class: Transient, Reason: "malformed message body"}
	}
	var o Outcome
	switch {
	case !sum.content && sum.errObject != nil:
		o = fromErrorBody(0, parseErrorBody(sum.errObject))
	case !sum.content && sum.isError:
		o = Outcome{Class: ServerError, Reason: "error object"}
	default:
		o = messageOutcome(sum.stop, sum.generated)
	}
	if o.Class.Retryable() {
		o.RetryAfter, o.HasRetryAfter = parseRetryAfter(h, now, o.Class == RateLimited)
	}
	o.Usage = sum.usage
	return o
}
