package classify

import "bytes"

// nonEmpty reports whether a raw JSON value holds something: it is not
// null, "", [] or {} (whitespace inside counts as nothing).
func nonEmpty(b []byte) bool {
	b = bytes.TrimSpace(b)
	if len(b) < 2 {
		return len(b) == 1 // a one-digit number; "" cannot reach here
	}
	switch b[0] {
	case 'n': // null
		return false
	case '"', '[', '{':
		// Empty when nothing but whitespace sits between the delimiters.
		return len(bytes.TrimSpace(b[1:len(b)-1])) > 0
	}
	return true
}

// FromCompletion classifies the 2xx JSON body of /v1/chat/completions or
// /v1/completions:
//
//   - not a JSON object, or truncated: Transient "malformed completion body"
//     (the upstream or the connection broke mid-answer; another attempt
//     will likely do better).
//   - an error object and no choices (some providers answer 200 with one):
//     classified like FromResponse with status 0.
//   - finish_reason content_filter in any choice: ContentFilter.
//   - every choice without content, tool_calls, function_call, refusal or
//     audio (or "text", for /v1/completions), or no choices: Empty.
//   - else Success.
//
// Its Usage is what Usage(body) returns, read in the same walk.
func FromCompletion(body []byte) Outcome {
	var s completionSummary
	if !walkCompletion(body, &s) {
		return Outcome{Class: Transient, Reason: "malformed completion body"}
	}
	var o Outcome
	if s.errObject != nil && s.choices == 0 {
		o = fromErrorBody(0, parseErrorBody(s.errObject))
	} else {
		o = choicesOutcome(s.filtered, s.generated)
	}
	o.Usage = s.usage
	return o
}

// choicesOutcome decides from what the choices showed.
func choicesOutcome(filtered, generated bool) Outcome {
	switch {
	case filtered:
		return Outcome{Class: ContentFilter, Reason: "finish_reason content_filter"}
	case !generated:
		return Outcome{Class: Empty, Reason: "empty output"}
	}
	return Outcome{Class: Success, Reason: "output"}
}

// StreamObserver watches the events of a streamed completion as the gateway
// forwards them, and says afterwards what the stream came to. The zero
// value is ready. It is not safe for concurrent use; one stream, one
// observer.
type StreamObserver struct {
	generated bool
	filtered  bool
	malformed bool
	done      bool
	finished  bool
	errSeen   bool
	err       errorFields
	usage     Tokens
}

// Observe takes the data payload of one SSE event, without "data: ": a
// chat.completion.chunk (or text_completion) JSON, or "[DONE]". It notes
// any generated delta (content, tool_calls, function_call, refusal, audio,
// or "text"), a finish_reason content_filter, an {"error":...} object sent
// inside the stream, the usage a chunk reports, and [DONE]. An empty
// payload is ignored.
func (o *StreamObserver) Observe(data []byte) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return
	}
	if string(data) == "[DONE]" {
		o.done = true
		return
	}
	var s completionSummary
	if !walkCompletion(data, &s) {
		o.malformed = true
		return
	}
	if s.errObject != nil && !o.errSeen {
		o.errSeen, o.err = true, parseErrorBody(s.errObject)
	}
	o.filtered = o.filtered || s.filtered
	o.generated = o.generated || s.generated
	o.finished = o.finished || s.finished
	if s.usage.Reported {
		// OpenAI sends "usage":null on every chunk but the last; servers
		// that report a running total on every chunk end with the whole.
		o.usage = s.usage
	}
}

// Usage is the last usage a chunk reported: with
// stream_options.include_usage, the final chunk's (OpenAI sends it after
// the finish_reason, with "choices":[]). Not Reported when no chunk had
// one — a stream sent without include_usage, or cut before its end.
func (o *StreamObserver) Usage() Tokens { return o.usage }

// Finished reports whether a chunk with a finish_reason (not null) has
// been observed: from there on the stream is ending, and what follows (a
// usage chunk, [DONE]) is its tail. SDKs treat a stream that stops after
// it as complete, so a keyed stream holds its tail back until the commit.
func (o *StreamObserver) Finished() bool { return o.finished }

// SawError reports whether an {"error":...} event was observed: the
// upstream already told the client the stream failed.
func (o *StreamObserver) SawError() bool { return o.errSeen }

// SawDone reports whether the "[DONE]" event was observed. A stream that
// ended without it was cut off; Outcome does not judge that, the caller
// (who knows whether the upstream is one that sends [DONE]) does.
func (o *StreamObserver) SawDone() bool { return o.done }

// Ended reports whether the stream's last event, [DONE], arrived: nothing
// after it belongs to the stream. (ResponsesObserver has the same method.)
func (o *StreamObserver) Ended() bool { return o.done }

// Outcome says what the stream came to once it has ended:
//
//   - an error object sent inside the stream: classified like FromResponse
//     of that error with status 0 (from its type and code);
//   - an event that was not a JSON object: Transient "malformed stream event";
//   - finish_reason content_filter in any chunk: ContentFilter;
//   - nothing generated: Empty;
//   - else Success.
//
// Its Usage is Usage().
func (o *StreamObserver) Outcome() Outcome {
	var out Outcome
	switch {
	case o.errSeen:
		out = fromErrorBody(0, o.err)
	case o.malformed:
		out = Outcome{Class: Transient, Reason: "malformed stream event"}
	default:
		out = choicesOutcome(o.filtered, o.generated)
	}
	out.Usage = o.usage
	return out
}
