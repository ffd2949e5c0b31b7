package classify

import (
	"bytes"

	"github.com/llmgate/llmgate/classify/jsonscan"
)

var (
	messageEventKeys = jsonscan.NewExactKeys("type", "message", "content_block", "delta", "usage")
	deltaKeys        = jsonscan.NewExactKeys("text", "stop_reason")
)

// MessagesObserver watches the typed events of a streamed Messages answer
// (POST /v1/messages with "stream": true) as the gateway forwards them,
// and says afterwards what the stream came to: the counterpart of
// StreamObserver and ResponsesObserver. The zero value is ready; one
// stream, one observer.
//
// A Messages stream ends with message_stop; the message_delta before it
// carries the stop_reason and the usage. An "error" event is the upstream
// telling the client the stream failed, and the last event it sends.
type MessagesObserver struct {
	generated bool
	malformed bool
	finished  bool // a message_delta with a stop_reason, or message_stop, arrived
	ended     bool // message_stop or an error event arrived
	errSeen   bool // an error event arrived
	stop      stopReason
	err       errorFields
	usage     Tokens
}

// messageEvent is what one Messages stream event shows.
type messageEvent struct {
	typ       []byte
	message   messageSummary // message_start's message
	block     bool           // content_block_start's block is output
	text      bool           // a delta with non-empty text (text_delta)
	stop      stopReason     // message_delta's delta.stop_reason
	usage     usageRead      // message_delta's usage
	haveUsage bool
}

// Observe takes the data payload of one event, without "data: " (the
// event's type is read from the payload's "type", which Anthropic repeats
// in the event: line). It notes generated output (a content block that is
// output, a text_delta with text), the stop_reason, an error event, the
// end, and the usage. ping, content_block_stop, the deltas that are not
// output (input_json_delta, whose tool_use block already counted;
// thinking_delta, signature_delta, citations_delta) and event types added
// later change nothing. An empty payload is ignored.
func (o *MessagesObserver) Observe(data []byte) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return
	}
	s := jsonscan.New(data, 0)
	if s.Peek() != '{' {
		o.malformed = true
		return
	}
	var ev messageEvent
	for key := range s.Fields(messageEventKeys) {
		switch key {
		case "type":
			ev.typ = s.Value()
		case "message":
			walkMessage(s, &ev.message)
		case "content_block":
			ev.block = s.Peek() == '{' && walkBlock(s)
		case "delta":
			for key := range s.Fields(deltaKeys) {
				switch v := s.Value(); key {
				case "text":
					ev.text = nonEmpty(v)
				default: // stop_reason
					ev.stop = stopReasonOf(v)
				}
			}
		case "usage":
			ev.usage, ev.haveUsage = readUsageFields(s)
		}
	}
	if s.Err() != nil || !s.AtEnd() {
		o.malformed = true
		return
	}
	o.event(&ev, data)
}

// event notes one well-formed event.
func (o *MessagesObserver) event(ev *messageEvent, data []byte) {
	switch {
	case jsonscan.Equal(ev.typ, "message_start"):
		o.generated = o.generated || ev.message.generated
		if ev.message.usage.Reported {
			o.usage = ev.message.usage
		}
	case jsonscan.Equal(ev.typ, "content_block_start"):
		o.generated = o.generated || ev.block
	case jsonscan.Equal(ev.typ, "content_block_delta"):
		o.generated = o.generated || ev.text
	case jsonscan.Equal(ev.typ, "message_delta"):
		if ev.stop != stopNone {
			o.stop, o.finished = ev.stop, true
		}
		if ev.haveUsage {
			o.deltaUsage(&ev.usage)
		}
	case jsonscan.Equal(ev.typ, "message_stop"):
		o.finished, o.ended = true, true
	case jsonscan.Equal(ev.typ, "error"):
		if !o.errSeen {
			o.errSeen, o.err = true, parseErrorBody(data)
		}
		o.ended = true
	}
}

// deltaUsage takes a message_delta's usage. Its counts are cumulative
// totals for the whole message, not increments: each one present replaces
// what message_start (or an earlier message_delta) said, and is never
// added to it. Output is usually the only one; input and cache counts
// appear when server tools ran more sampling.
func (o *MessagesObserver) deltaUsage(u *usageRead) {
	take := func(i int, dst *int64, n int64) {
		if u.state[i] == counted {
			*dst = n
		}
	}
	take(usageIn, &o.usage.In, u.t.In)
	take(usageOut, &o.usage.Out, u.t.Out)
	take(usageCacheCreation, &o.usage.CacheCreation, u.t.CacheCreation)
	take(usageCacheRead, &o.usage.CacheRead, u.t.CacheRead)
	if u.state[usageIn] == counted {
		o.usage.Reported = true
	}
}

// Usage is what the stream reported it cost: message_start's
// message.usage (input and cache counts, and an output count of 1 or so),
// with each count the last message_delta gave replacing it. Not Reported
// when no event gave an input count.
func (o *MessagesObserver) Usage() Tokens {
	if !o.usage.Reported {
		return Tokens{}
	}
	return o.usage
}

// Finished reports whether the stream's clean ending has begun: a
// message_delta that carries a stop_reason, or message_stop. SDKs take a
// stream that stops after message_stop as complete, so a keyed stream
// holds everything from here on back until its commit is durable.
func (o *MessagesObserver) Finished() bool { return o.finished }

// Ended reports whether message_stop or an error event arrived: nothing
// after it belongs to the stream.
func (o *MessagesObserver) Ended() bool { return o.ended }

// SawError reports whether an error event arrived: the upstream already
// told the client the stream failed.
func (o *MessagesObserver) SawError() bool { return o.errSeen }

// Outcome says what the stream came to once it has ended:
//
//   - an error event: classified from its error.type (and
//     error.details.error_code) like an error object inside a chat stream:
//     overloaded_error and timeout_error → Transient, api_error →
//     ServerError, rate_limit_error → RateLimited, ...;
//   - an event that was not a JSON object: Transient "malformed stream
//     event";
//   - else as for a JSON message, from the stop_reason and the blocks
//     streamed: refusal → ContentFilter, max_tokens → Success with Note
//     max_tokens, no output → Empty, else Success (the caller judges a
//     stream cut before message_stop).
//
// Its Usage is Usage().
func (o *MessagesObserver) Outcome() Outcome {
	var out Outcome
	switch {
	case o.errSeen:
		out = fromErrorBody(0, o.err)
	case o.malformed:
		out = Outcome{Class: Transient, Reason: "malformed stream event"}
	default:
		out = messageOutcome(o.stop, o.generated)
	}
	out.Usage = o.Usage()
	return out
}

// MessagesPreamble reports whether an event's data is one that shows the
// client no output yet: message_start, ping, or content_block_start (a
// block's opening; its text or arguments come in the deltas after it). A
// gateway may hold such events back with the one after them and still
// retry when that one is a failure (message_start then an
// overloaded_error event).
func MessagesPreamble(data []byte) bool {
	s := jsonscan.New(data, 0)
	for key := range s.Fields(messageEventKeys) {
		if key == "type" {
			v := s.Value()
			return jsonscan.Equal(v, "message_start") || jsonscan.Equal(v, "ping") ||
				jsonscan.Equal(v, "content_block_start")
		}
	}
	return false
}
