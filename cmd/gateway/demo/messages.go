package demo

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens),
// answered as Anthropic does: a message object, or its typed events
// (message_start, content_block_start, ping, content_block_delta,
// content_block_stop, message_delta, message_stop). A Step shapes it as it
// shapes a chat answer: Status an Anthropic error body, FinishReason
// "content_filter" a refusal, Empty a message with no content, StopAfter
// a stream cut after that many events, ErrorInStream an overloaded_error
// event in place of the stream's end.

// messagesRequest is the part of a Messages request the simulation reads.
type messagesRequest struct {
	Model     string           `json:"model"`
	MaxTokens int              `json:"max_tokens"`
	Stream    bool             `json:"stream"`
	Messages  []messagesTurn   `json:"messages"`
	Tools     []map[string]any `json:"tools"`
}

type messagesTurn struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type messagesUsage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

type messageObject struct {
	ID           string          `json:"id"`
	Type         string          `json:"type"`
	Role         string          `json:"role"`
	Model        string          `json:"model"`
	Content      []messagesBlock `json:"content"`
	StopReason   *string         `json:"stop_reason"`
	StopSequence *string         `json:"stop_sequence"`
	Usage        messagesUsage   `json:"usage"`
}

type messagesBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// anthropicError is Anthropic's error body.
func anthropicError(status int, errType, msg string) []byte {
	if errType == "" {
		errType = anthropicErrorType(status)
	}
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": errType, "message": msg}})
	return b
}

// anthropicErrorType is the error.type Anthropic sends with status.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

func (x *exchange) anthropicError(status int, errType, msg string) error {
	return x.respond(status, "application/json", anthropicError(status, errType, msg))
}

// messages answers POST /v1/messages.
func (x *exchange) messages(body []byte) error {
	var req messagesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return x.anthropicError(http.StatusBadRequest, "", "messages: the body is not valid JSON: "+err.Error())
	}
	switch {
	case req.Model == "":
		return x.anthropicError(http.StatusBadRequest, "", "model: Field required")
	case req.MaxTokens <= 0:
		return x.anthropicError(http.StatusBadRequest, "", "max_tokens: Field required")
	case len(req.Messages) == 0:
		return x.anthropicError(http.StatusBadRequest, "", "messages: at least one message is required")
	}
	var said string
	prompt := 0
	for _, m := range req.Messages {
		text := contentText(m.Content)
		prompt += 4 + tokens(text)
		if m.Role == "user" {
			said = text
		}
	}
	a := x.answer(said)
	stop := "end_turn"
	if a.finish == "content_filter" {
		stop = "refusal"
	}
	msg := messageObject{ID: x.s.newID("msg_fake"), Type: "message", Role: "assistant", Model: req.Model,
		Content: []messagesBlock{}, StopReason: &stop,
		Usage: messagesUsage{InputTokens: prompt, OutputTokens: tokens(a.content)}}
	if a.content != "" {
		msg.Content = append(msg.Content, messagesBlock{Type: "text", Text: a.content})
	}
	if !req.Stream {
		return x.writeJSON(msg)
	}
	return x.messagesStream(msg, a.content)
}

// messagesStream writes msg as Anthropic's typed events.
func (x *exchange) messagesStream(msg messageObject, content string) error {
	st := x.step
	stop := msg.StopReason
	start := msg
	start.Content, start.StopReason, start.Usage.OutputTokens = []messagesBlock{}, nil, 1
	type named struct {
		name string
		data any
	}
	events := []named{
		{"message_start", map[string]any{"type": "message_start", "message": start}},
		{"content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": messagesBlock{Type: "text"}}},
		{"ping", map[string]string{"type": "ping"}},
	}
	for _, p := range x.pieces(content) {
		events = append(events, named{"content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]string{"type": "text_delta", "text": p}}})
	}
	if st.ErrorInStream {
		events = append(events, named{"error", json.RawMessage(anthropicError(529, "overloaded_error", "llmgate fake upstream: scripted error in stream."))})
	} else {
		events = append(events,
			named{"content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}},
			named{"message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
				"usage": map[string]int{"output_tokens": msg.Usage.OutputTokens}}},
			named{"message_stop", map[string]string{"type": "message_stop"}})
	}
	h := x.w.Header()
	h.Set("Cache-Control", "no-cache")
	if st.StopAfter > 0 {
		h.Set("Connection", "close")
	}
	x.writeHeader(http.StatusOK, "text/event-stream; charset=utf-8")
	if err := x.flush(); err != nil {
		return err
	}
	for i, ev := range events {
		if st.StopAfter > 0 && i == st.StopAfter {
			return nil
		}
		data, err := json.Marshal(ev.data)
		if err != nil {
			return err
		}
		if err := x.namedEvent(i, ev.name, data); err != nil {
			return err
		}
	}
	return nil
}

// countTokens answers POST /v1/messages/count_tokens.
func (x *exchange) countTokens(body []byte) error {
	var req messagesRequest
	if err := json.Unmarshal(body, &req); err != nil || req.Model == "" {
		return x.anthropicError(http.StatusBadRequest, "", "model: Field required")
	}
	n := 0
	for _, m := range req.Messages {
		n += 4 + tokens(contentText(m.Content))
	}
	return x.writeJSON(map[string]int{"input_tokens": n})
}

// messagesScripted writes a Step's Status and Body on a Messages route:
// its Body as it is, or Anthropic's error body for its Status.
func (x *exchange) messagesScripted() error {
	st := x.step
	status := st.Status
	if status == 0 {
		status = http.StatusOK
	}
	if st.Body == "" && status >= 400 {
		return x.anthropicError(status, st.ErrType, fmt.Sprintf("llmgate fake upstream: scripted HTTP %d %s.", status, http.StatusText(status)))
	}
	return x.respond(status, "application/json", []byte(st.Body))
}

// anthropicDemoModel is the demo model a claude-demo-* name stands for
// ("claude-demo-flaky" fails as demo-flaky does), or name itself.
func anthropicDemoModel(name string) string {
	if rest, ok := strings.CutPrefix(name, "claude-"); ok && strings.HasPrefix(rest, "demo-") {
		return rest
	}
	return name
}
