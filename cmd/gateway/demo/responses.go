package demo

// The Responses API: POST /v1/responses answers as JSON or as a stream of
// typed events (event: <type> + data: {...,"sequence_number":N}, no
// [DONE]), and the responses it stores can be read back, listed, cancelled
// and deleted, and continued with previous_response_id.
//
// A Step shapes an answer as it does a chat completion's: Status and Body
// (5xx, 429 with Retry-After), Empty (a completed response with no output
// items), FinishReason "content_filter" or "length" (an incomplete
// response, reason content_filter or max_output_tokens), FinishReason
// "tool_calls" (a function_call item), Failed (status failed, error.code
// from ErrCode; in a stream, response.failed after the text deltas),
// ErrorInStream (an error event after the text deltas), and StopAfter /
// StallAfter (counting typed events).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// maxStoredResponses bounds the responses the Server keeps for GET; the
// oldest is forgotten first, so a demo server's memory stays flat.
const maxStoredResponses = 4096

// responsesRequest is the part of a Responses request the fake reads.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       json.RawMessage `json:"instructions"`
	Stream             bool            `json:"stream"`
	Background         bool            `json:"background"`
	Store              *bool           `json:"store"`
	PreviousResponseID string          `json:"previous_response_id"`
	Tools              []struct {
		Type string `json:"type"`
		Name string `json:"name"`
	} `json:"tools"`
	Text *struct {
		Format *responseFormat `json:"format"`
	} `json:"text"`
}

// responseObject is a Response as OpenAI writes it, fields in its order.
// The json.RawMessage fields echo the request (null when it did not say).
type responseObject struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	Status             string             `json:"status"`
	Background         bool               `json:"background"`
	CompletedAt        *int64             `json:"completed_at"`
	Error              *responseError     `json:"error"`
	IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
	Instructions       json.RawMessage    `json:"instructions"`
	MaxOutputTokens    json.RawMessage    `json:"max_output_tokens"`
	MaxToolCalls       json.RawMessage    `json:"max_tool_calls"`
	Model              string             `json:"model"`
	Output             []any              `json:"output"`
	ParallelToolCalls  json.RawMessage    `json:"parallel_tool_calls"`
	PreviousResponseID json.RawMessage    `json:"previous_response_id"`
	PromptCacheKey     json.RawMessage    `json:"prompt_cache_key"`
	Reasoning          json.RawMessage    `json:"reasoning"`
	SafetyIdentifier   json.RawMessage    `json:"safety_identifier"`
	ServiceTier        json.RawMessage    `json:"service_tier"`
	Store              bool               `json:"store"`
	Temperature        json.RawMessage    `json:"temperature"`
	Text               json.RawMessage    `json:"text"`
	ToolChoice         json.RawMessage    `json:"tool_choice"`
	Tools              json.RawMessage    `json:"tools"`
	TopLogprobs        json.RawMessage    `json:"top_logprobs"`
	TopP               json.RawMessage    `json:"top_p"`
	Truncation         json.RawMessage    `json:"truncation"`
	Usage              *responseUsage     `json:"usage"`
	User               json.RawMessage    `json:"user"`
	Metadata           json.RawMessage    `json:"metadata"`
}

type responseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

type responseUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

type outputMessage struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Status  string       `json:"status"`
	Content []outputText `json:"content"`
	Role    string       `json:"role"`
}

type outputText struct {
	Type        string `json:"type"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
	Text        string `json:"text"`
}

type functionCall struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	Status    string `json:"status"`
	Arguments string `json:"arguments"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
}

// storedResponse is a response kept for GET /v1/responses/{id}.
type storedResponse struct {
	final      responseObject // as it is once done
	input      []any          // the input items, each with an id
	polls      int            // GETs of a background response so far
	cancelled  bool
	background bool
}

// respReply is one generated Responses answer, before it is written as
// JSON or as a stream.
type respReply struct {
	final   responseObject // the done response: completed, incomplete or failed
	text    string         // the message's text, if it has one
	call    *functionCall  // the function call, if it is one
	msgID   string
	failure *responseError // set when the Step says Failed
}

func (x *exchange) responses(body []byte) error {
	var req responsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return x.badRequest("", "We could not parse the JSON body of your request: %v", err)
	}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(body, &fields) // it parsed just above
	switch {
	case req.Model == "":
		return x.badRequest("model", "Missing required parameter: 'model'.")
	case len(req.Input) == 0 && req.PreviousResponseID == "":
		return x.badRequest("input", "Missing required parameter: 'input'.")
	case req.Background && req.Store != nil && !*req.Store:
		return x.badRequest("background", "Background mode requires 'store' to be true.")
	case req.PreviousResponseID != "" && !x.s.responseStored(req.PreviousResponseID):
		return x.writeError(http.StatusBadRequest, apiError{
			Message: fmt.Sprintf("Previous response with id '%s' not found.", req.PreviousResponseID),
			Type:    "invalid_request_error", Param: "previous_response_id", Code: "previous_response_not_found",
		})
	}
	r := x.respReply(req, fields)
	store := req.Store == nil || *req.Store
	if store {
		x.s.storeResponse(&storedResponse{final: r.final, input: inputItems(req.Input), background: req.Background})
	}
	switch {
	case req.Background && !req.Stream:
		return x.writeJSON(r.final.pending("queued"))
	case req.Stream:
		return x.responsesStream(r)
	}
	return x.writeJSON(r.final)
}

// respReply generates the answer to req as the Step says.
func (x *exchange) respReply(req responsesRequest, fields map[string]json.RawMessage) respReply {
	said := responseInputText(req.Input)
	a := x.answer(said)
	var format *responseFormat
	if req.Text != nil {
		format = req.Text.Format
	}
	if c, ok := structuredContent(format, said); ok && !x.step.Empty {
		a.content = c
	}
	now := time.Now().Unix()
	obj := newResponseObject(x.s.respID(), req, fields, now)
	r := respReply{text: a.content, msgID: "msg_" + randHex() + randHex()}
	out := tokens(a.content)
	switch {
	case x.step.Empty:
		r.text = ""
	case a.finish == "tool_calls":
		name := "lookup"
		for _, t := range req.Tools {
			if t.Type == "function" && t.Name != "" {
				name = t.Name
				break
			}
		}
		args, _ := json.Marshal(map[string]string{"input": firstRunes(said, saidRunes)})
		r.call = &functionCall{ID: "fc_" + randHex() + randHex(), Type: "function_call", Status: "completed",
			Arguments: string(args), CallID: "call_" + randHex(), Name: name}
		r.text, out = "", tokens(name)+tokens(string(args))
	}
	in := 3 + tokens(said) + tokens(string(req.Instructions))
	obj.Usage = &responseUsage{InputTokens: in, OutputTokens: out, TotalTokens: in + out}
	obj.Status = "completed"
	switch a.finish {
	case "content_filter":
		obj.Status, obj.IncompleteDetails = "incomplete", &incompleteDetails{Reason: "content_filter"}
	case "length":
		obj.Status, obj.IncompleteDetails = "incomplete", &incompleteDetails{Reason: "max_output_tokens"}
	}
	if x.step.Failed {
		code := x.step.ErrCode
		if code == "" {
			code = "server_error"
		}
		r.failure = &responseError{Code: code, Message: "llmgate fake upstream: scripted failed response."}
		obj.Status, obj.Error, obj.IncompleteDetails, obj.Usage = "failed", r.failure, nil, nil
	}
	if obj.Status == "completed" {
		obj.CompletedAt = &now
	}
	obj.Output = r.outputItems(obj.Status)
	r.final = obj
	return r
}

// outputItems is the done response's output: one message, one function
// call, or none (Empty, or failed).
func (r respReply) outputItems(status string) []any {
	switch {
	case status == "failed":
		return []any{}
	case r.call != nil:
		return []any{*r.call}
	case r.text == "":
		return []any{}
	}
	itemStatus := "completed"
	if status == "incomplete" {
		itemStatus = "incomplete"
	}
	return []any{r.message(itemStatus, r.text)}
}

func (r respReply) message(status, text string) outputMessage {
	content := []outputText{}
	if status != "in_progress" {
		content = append(content, newOutputText(text))
	}
	return outputMessage{ID: r.msgID, Type: "message", Status: status, Content: content, Role: "assistant"}
}

func newOutputText(text string) outputText {
	return outputText{Type: "output_text", Annotations: []any{}, Logprobs: []any{}, Text: text}
}

// newResponseObject is a response to req, echoing what it asked for, with
// OpenAI's defaults where it did not.
func newResponseObject(id string, req responsesRequest, fields map[string]json.RawMessage, created int64) responseObject {
	echo := func(key, def string) json.RawMessage {
		if v, ok := fields[key]; ok && string(v) != "null" {
			return v
		}
		if def == "" {
			return nil
		}
		return json.RawMessage(def)
	}
	return responseObject{
		ID: id, Object: "response", CreatedAt: created, Background: req.Background,
		Instructions: echo("instructions", ""), MaxOutputTokens: echo("max_output_tokens", ""),
		MaxToolCalls: echo("max_tool_calls", ""), Model: req.Model, Output: []any{},
		ParallelToolCalls: echo("parallel_tool_calls", "true"), PreviousResponseID: echo("previous_response_id", ""),
		PromptCacheKey: echo("prompt_cache_key", ""), Reasoning: echo("reasoning", `{"effort":null,"summary":null}`),
		SafetyIdentifier: echo("safety_identifier", ""), ServiceTier: echo("service_tier", `"default"`),
		Store: req.Store == nil || *req.Store, Temperature: echo("temperature", "1.0"),
		Text:       echo("text", `{"format":{"type":"text"},"verbosity":"medium"}`),
		ToolChoice: echo("tool_choice", `"auto"`), Tools: echo("tools", "[]"), TopLogprobs: echo("top_logprobs", "0"),
		TopP: echo("top_p", "1.0"), Truncation: echo("truncation", `"disabled"`), User: echo("user", ""),
		Metadata: echo("metadata", "{}"),
	}
}

// pending is o before it is done: status queued or in_progress, no output,
// usage, error or completion time yet.
func (o responseObject) pending(status string) responseObject {
	o.Status, o.Output, o.Usage, o.CompletedAt, o.Error, o.IncompleteDetails = status, []any{}, nil, nil, nil, nil
	return o
}

// respID returns a new response id, unique per answer.
func (s *Server) respID() string {
	return fmt.Sprintf("resp_%s%08x", randHex()+randHex(), s.seq.Add(1))
}

// responseInputText is what the user said in a Responses input: the
// string, or the text of the last user message.
func responseInputText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var items []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &items) != nil {
		return ""
	}
	said := ""
	for _, it := range items {
		if it.Role != "user" {
			continue
		}
		if json.Unmarshal(it.Content, &s) == nil {
			said = s
			continue
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(it.Content, &parts) == nil {
			var texts []string
			for _, p := range parts {
				if p.Type == "input_text" || p.Type == "text" {
					texts = append(texts, p.Text)
				}
			}
			said = strings.Join(texts, " ")
		}
	}
	return said
}

// inputItems are the items GET /v1/responses/{id}/input_items lists: a
// string input is one user message; each item gets an id if it has none.
func inputItems(raw json.RawMessage) []any {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []any{map[string]any{
			"id": "msg_" + randHex() + randHex(), "type": "message", "role": "user", "status": "completed",
			"content": []any{map[string]any{"type": "input_text", "text": s}},
		}}
	}
	var items []map[string]any
	if json.Unmarshal(raw, &items) != nil {
		return []any{}
	}
	out := make([]any, 0, len(items))
	for _, it := range items {
		if _, ok := it["type"]; !ok {
			it["type"] = "message"
		}
		if _, ok := it["id"]; !ok {
			it["id"] = "msg_" + randHex() + randHex()
		}
		if text, ok := it["content"].(string); ok {
			it["content"] = []any{map[string]any{"type": "input_text", "text": text}}
		}
		out = append(out, it)
	}
	return out
}

// storeResponse keeps sr for GET, forgetting the oldest beyond
// maxStoredResponses.
func (s *Server) storeResponse(sr *storedResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stored == nil {
		s.stored = make(map[string]*storedResponse)
	}
	if len(s.storedOrder) >= maxStoredResponses {
		delete(s.stored, s.storedOrder[0])
		s.storedOrder = slices.Delete(s.storedOrder, 0, 1)
	}
	s.stored[sr.final.ID] = sr
	s.storedOrder = append(s.storedOrder, sr.final.ID)
}

func (s *Server) responseStored(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.stored[id]
	return ok
}
