package demo

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// field is one member of a typed event's data, in the order written.
type field struct {
	k string
	v any
}

// typedEvent is one event of a Responses stream: its type (both the
// event: line and the data's "type"), and its data members besides type
// and sequence_number.
type typedEvent struct {
	typ    string
	fields []field
}

// data is the event's JSON: type first, sequence_number last, as OpenAI
// writes them.
func (e typedEvent) data(seq int) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"type":`)
	t, _ := json.Marshal(e.typ)
	b.Write(t)
	for _, f := range e.fields {
		v, err := json.Marshal(f.v)
		if err != nil {
			return nil, err
		}
		k, _ := json.Marshal(f.k)
		b.WriteByte(',')
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteString(`,"sequence_number":`)
	b.WriteString(strconv.Itoa(seq))
	b.WriteByte('}')
	return b.Bytes(), nil
}

// responsesStream writes r as typed events: created, in_progress, the
// output item's events, then the terminal event (response.completed,
// response.incomplete or response.failed), or an error event when the
// Step says ErrorInStream.
func (x *exchange) responsesStream(r respReply) error {
	pending := r.final.pending("in_progress")
	events := []typedEvent{
		{"response.created", []field{{"response", pending}}},
		{"response.in_progress", []field{{"response", pending}}},
	}
	cut := r.failure != nil || x.step.ErrorInStream
	switch {
	case r.call != nil:
		events = append(events, r.callEvents()...)
	case r.text != "":
		events = append(events, r.messageEvents(x.pieces(r.text), cut)...)
	}
	switch {
	case x.step.ErrorInStream:
		code := x.step.ErrCode
		if code == "" {
			code = "server_error"
		}
		events = append(events, typedEvent{"error", []field{
			{"code", code}, {"message", "llmgate fake upstream: scripted error in stream."}, {"param", nil},
		}})
	case r.final.Status == "failed":
		events = append(events, typedEvent{"response.failed", []field{{"response", r.final}}})
	case r.final.Status == "incomplete":
		events = append(events, typedEvent{"response.incomplete", []field{{"response", r.final}}})
	default:
		events = append(events, typedEvent{"response.completed", []field{{"response", r.final}}})
	}
	return x.typedStream(events)
}

// messageEvents are the events of the message item: added, its content
// part, the text deltas, then (unless cut) the done events.
func (r respReply) messageEvents(pieces []string, cut bool) []typedEvent {
	at := []field{{"item_id", r.msgID}, {"output_index", 0}, {"content_index", 0}}
	with := func(extra ...field) []field { return append(append([]field(nil), at...), extra...) }
	events := []typedEvent{
		{"response.output_item.added", []field{{"output_index", 0}, {"item", r.message("in_progress", "")}}},
		{"response.content_part.added", with(field{"part", newOutputText("")})},
	}
	for _, p := range pieces {
		events = append(events, typedEvent{"response.output_text.delta", with(field{"delta", p}, field{"logprobs", []any{}})})
	}
	if cut {
		return events
	}
	item := r.final.Output[0]
	return append(events,
		typedEvent{"response.output_text.done", with(field{"text", r.text}, field{"logprobs", []any{}})},
		typedEvent{"response.content_part.done", with(field{"part", newOutputText(r.text)})},
		typedEvent{"response.output_item.done", []field{{"output_index", 0}, {"item", item}}},
	)
}

// callEvents are the events of the function call item.
func (r respReply) callEvents() []typedEvent {
	head := *r.call
	head.Status, head.Arguments = "in_progress", ""
	at := []field{{"item_id", r.call.ID}, {"output_index", 0}}
	return []typedEvent{
		{"response.output_item.added", []field{{"output_index", 0}, {"item", head}}},
		{"response.function_call_arguments.delta", append(at[:2:2], field{"delta", r.call.Arguments})},
		{"response.function_call_arguments.done", append(at[:2:2], field{"arguments", r.call.Arguments})},
		{"response.output_item.done", []field{{"output_index", 0}, {"item", *r.call}}},
	}
}

// typedStream writes events as server-sent events with event: lines,
// numbered by sequence_number from 0, each flushed as it is written. The
// Step may cut it short: StopAfter and StallAfter count events.
func (x *exchange) typedStream(events []typedEvent) error {
	st := x.step
	h := x.w.Header()
	h.Set("Cache-Control", "no-cache")
	if st.StopAfter > 0 {
		h.Set("Connection", "close")
	}
	x.writeHeader(http.StatusOK, "text/event-stream")
	if err := x.flush(); err != nil {
		return err
	}
	for i, ev := range events {
		switch {
		case st.StopAfter > 0 && i == st.StopAfter:
			return nil
		case st.StallAfter > 0 && i == st.StallAfter:
			return x.s.hang(x.r.Context())
		}
		data, err := ev.data(i)
		if err != nil {
			return err
		}
		if err := x.namedEvent(i, ev.typ, data); err != nil {
			return err
		}
	}
	if st.StallAfter > 0 {
		return x.s.hang(x.r.Context())
	}
	return nil
}
