package classify

import (
	"bytes"

	"github.com/llmgate/llmgate/classify/jsonscan"
)

var eventKeys = jsonscan.NewExactKeys("type", "delta", "item", "response")

// ResponsesObserver watches the typed events of a streamed Responses answer
// (POST /v1/responses with "stream": true) as the gateway forwards them,
// and says afterwards what the stream came to: the counterpart of
// StreamObserver. The zero value is ready; one stream, one observer.
//
// A Responses stream has no [DONE]: its end is its terminal event,
// response.completed, response.incomplete or response.failed, which
// carries the whole response object (status, output, usage). An "error"
// event is the upstream telling the client the stream failed.
type ResponsesObserver struct {
	generated bool
	malformed bool
	ended     bool // a terminal event arrived
	finished  bool // ... and it was response.completed or response.incomplete
	errSeen   bool // an "error" event arrived
	err       errorFields
	end       Outcome // what the terminal event's response came to
	usage     Tokens
}

// Observe takes the data payload of one event, without "data: " (the
// event's type is read from the payload's "type", which OpenAI repeats in
// the event: line). It notes generated output (an output_text or refusal
// delta, a tool call item), an error event, the terminal event and the
// usage it reports. An empty payload is ignored.
func (o *ResponsesObserver) Observe(data []byte) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return
	}
	s := jsonscan.New(data, 0)
	if s.Peek() != '{' {
		o.malformed = true
		return
	}
	var typ []byte
	var delta, item bool
	var resp responseSummary
	for key := range s.Fields(eventKeys) {
		switch key {
		case "type":
			typ = s.Value()
		case "delta":
			delta = nonEmpty(s.Value())
		case "item":
			if s.Peek() == '{' {
				item = walkItem(s)
			}
		case "response":
			walkResponse(s, &resp)
		}
	}
	if s.Err() != nil || !s.AtEnd() {
		o.malformed = true
		return
	}
	o.event(typ, delta, item, &resp, data)
}

// event notes one well-formed event of type typ.
func (o *ResponsesObserver) event(typ []byte, delta, item bool, resp *responseSummary, data []byte) {
	o.generated = o.generated || item
	switch {
	case jsonscan.Equal(typ, "response.output_text.delta"), jsonscan.Equal(typ, "response.refusal.delta"):
		o.generated = o.generated || delta
	case jsonscan.Equal(typ, "error"):
		if !o.errSeen {
			o.errSeen, o.err = true, parseErrorBody(data)
		}
	case jsonscan.Equal(typ, "response.completed"), jsonscan.Equal(typ, "response.incomplete"):
		o.terminal(resp)
		o.finished = true
	case jsonscan.Equal(typ, "response.failed"):
		resp.status = statusFailed
		o.terminal(resp)
	}
}

func (o *ResponsesObserver) terminal(resp *responseSummary) {
	if o.ended {
		return // only the first end counts
	}
	o.ended = true
	resp.generated = resp.generated || o.generated
	o.end = resp.outcome()
	if resp.usage.Reported {
		o.usage = resp.usage
	}
}

// Usage is what the terminal event's response.usage reported
// (input_tokens, output_tokens); not Reported before it, or without one.
func (o *ResponsesObserver) Usage() Tokens { return o.usage }

// Finished reports whether response.completed or response.incomplete
// arrived: the stream's clean end, which a keyed stream holds back until
// its commit is durable.
func (o *ResponsesObserver) Finished() bool { return o.finished }

// Ended reports whether a terminal event arrived (response.failed
// included): nothing after it belongs to the stream.
func (o *ResponsesObserver) Ended() bool { return o.ended }

// SawError reports whether the upstream told the client the stream failed:
// an "error" event, or response.failed.
func (o *ResponsesObserver) SawError() bool {
	return o.errSeen || (o.ended && !o.finished)
}

// Outcome says what the stream came to once it has ended:
//
//   - an "error" event: classified from its code and type like an error
//     object inside a chat stream;
//   - an event that was not a JSON object: Transient "malformed stream
//     event";
//   - a terminal event: what its response object says, as FromResponses
//     decides it (response.failed by its error.code);
//   - before one: Empty or Success, from the output seen so far (the
//     caller judges a stream cut before its end).
//
// Its Usage is Usage().
func (o *ResponsesObserver) Outcome() Outcome {
	var out Outcome
	switch {
	case o.errSeen:
		out = fromErrorBody(0, o.err)
	case o.malformed:
		out = Outcome{Class: Transient, Reason: "malformed stream event"}
	case o.ended:
		out = o.end
	default:
		out = choicesOutcome(false, o.generated)
	}
	out.Usage = o.usage
	return out
}

// ResponsesPreamble reports whether an event's data is one that only
// announces the response (response.created, response.in_progress,
// response.queued): no output yet, so a gateway may hold such events back
// and still retry if a failure follows.
func ResponsesPreamble(data []byte) bool {
	s := jsonscan.New(data, 0)
	for key := range s.Fields(eventKeys) {
		if key == "type" {
			v := s.Value()
			return jsonscan.Equal(v, "response.created") || jsonscan.Equal(v, "response.in_progress") ||
				jsonscan.Equal(v, "response.queued")
		}
	}
	return false
}
