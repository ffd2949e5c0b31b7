package fakeprovider

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Anthropic is a fake Anthropic Messages provider (POST /v1/messages,
// /v1/messages/count_tokens, the Message Batches API under
// /v1/messages/batches, the Models API and the Files API), scripted step
// by step and recording what it saw. A zero AnthropicStep is a normal
// answer: a JSON message, or — for a body with "stream": true — the typed
// events of one; a batch created, read, cancelled or deleted; a model list
// or object; a file uploaded, listed, described, read or deleted. Safe for
// concurrent use; create it with NewAnthropic.
type Anthropic struct {
	// Discard, set before it serves, keeps no request (Requests is
	// empty; Calls still counts): what a benchmark wants.
	Discard bool

	mu sync.Mutex
	// models are the models it lists (SetModels); nil: AnthropicModels.
	models  []string
	maxPage int
	queue   []AnthropicStep
	reqs    []AnthropicRequest
	calls   int
	files   map[string]anthropicFile
	fileIDs []string // in upload order
	// batches are the message batches created, by id, and their order.
	batches  map[string]*fakeBatch
	batchIDs []string
}

// AnthropicStep scripts the answer to one request.
type AnthropicStep struct {
	// Status, when it is not 0 or 200, answers with Anthropic's error body
	// of type ErrorType and message Message ("Overloaded" if empty).
	Status    int
	ErrorType string
	Message   string
	// Header is set on the answer (retry-after, request-id, ...).
	Header map[string]string
	// Body, when set, is the JSON answer sent as it is (a refusal, an
	// empty message).
	Body string
	// Events, when set, is the stream sent as it is, each event (with its
	// "event:" and "data:" lines, without the blank line after) flushed on
	// its own.
	Events []string
	// Cut drops the connection after Events: the stream never ends.
	Cut bool
	// Arrived, when not nil, is closed when the request that takes this
	// step has arrived; the answer then waits until Release is closed (or
	// the request ends), so a test can hold a call in flight.
	Arrived chan struct{}
	Release <-chan struct{}
	// JSONL, when set, is a JSONL answer (a batch's results), each line
	// written with its newline and flushed on its own.
	JSONL []string
	// Hold, when not nil, is waited on before JSONL's last line is
	// written (or until the request ends).
	Hold <-chan struct{}
}

// AnthropicRequest is what the Anthropic fake recorded of one request.
type AnthropicRequest struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   []byte    // exactly as received
	At                     time.Time // arrival
}

// NewAnthropic returns an Anthropic fake with an empty script.
func NewAnthropic() *Anthropic { return &Anthropic{} }

// SetModels sets the models it lists, newest first, and the most a page
// of the list holds (0: as many as the client's limit asks).
func (a *Anthropic) SetModels(maxPage int, ids ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.models, a.maxPage = slices.Clone(ids), maxPage
}

// Enqueue appends steps to the script; each request consumes the next.
func (a *Anthropic) Enqueue(steps ...AnthropicStep) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, st := range steps {
		st.Header = maps.Clone(st.Header)
		st.Events = slices.Clone(st.Events)
		a.queue = append(a.queue, st)
	}
}

// Requests returns copies of the recorded requests, in arrival order.
func (a *Anthropic) Requests() []AnthropicRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]AnthropicRequest, len(a.reqs))
	for i, r := range a.reqs {
		out[i] = r
		out[i].Header, out[i].Body = r.Header.Clone(), slices.Clone(r.Body)
	}
	return out
}

// Calls is how many requests arrived.
func (a *Anthropic) Calls() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}

// ServeHTTP records the request, then answers it as its step says.
func (a *Anthropic) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	a.mu.Lock()
	a.calls++
	if !a.Discard {
		a.reqs = append(a.reqs, AnthropicRequest{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Body: body, At: time.Now()})
	}
	var st AnthropicStep
	if len(a.queue) > 0 {
		st, a.queue = a.queue[0], a.queue[1:]
	}
	a.mu.Unlock()
	if st.Arrived != nil {
		close(st.Arrived)
	}
	if st.Release != nil {
		select {
		case <-st.Release:
		case <-r.Context().Done():
			panic(http.ErrAbortHandler)
		}
	}

	w.Header().Set("Request-Id", "req_fake") // unless the step's Header says otherwise
	for k, v := range st.Header {
		w.Header().Set(k, v)
	}
	switch {
	case st.Status != 0 && st.Status != http.StatusOK:
		writeAnthropicError(w, st)
	case st.Body != "":
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, st.Body)
	case st.Events != nil:
		writeEvents(w, st.Events, st.Cut)
	case st.JSONL != nil:
		writeJSONL(w, r, st.JSONL, st.Hold)
	case strings.HasPrefix(r.URL.Path, "/v1/messages/batches"):
		a.serveBatches(w, r, body)
	case a.serveObjects(w, r, body):
	case strings.HasSuffix(r.URL.Path, "/count_tokens"):
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"input_tokens":12}`)
	case isStream(body):
		writeEvents(w, AnthropicTextStream(modelOf(body), "Hello", " from the fake", " Anthropic provider."), false)
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, AnthropicMessage(modelOf(body), "Hello from the fake Anthropic provider.", "end_turn"))
	}
}

func writeAnthropicError(w http.ResponseWriter, st AnthropicStep) {
	msg := st.Message
	if msg == "" {
		msg = "Overloaded"
	}
	typ := st.ErrorType
	if typ == "" {
		typ = "overloaded_error"
	}
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}, "request_id": "req_fake"})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(st.Status)
	_, _ = w.Write(b)
}

// writeEvents sends events, each flushed; cut drops the connection after
// the last.
func writeEvents(w http.ResponseWriter, events []string, cut bool) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	for _, ev := range events {
		_, _ = io.WriteString(w, ev+"\n\n")
		if f != nil {
			f.Flush()
		}
	}
	if cut {
		panic(http.ErrAbortHandler)
	}
}

func isStream(body []byte) bool {
	var b struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &b)
	return b.Stream
}

func modelOf(body []byte) string {
	var b struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(body, &b)
	return b.Model
}

// AnthropicMessage is a JSON message of one text block.
func AnthropicMessage(model, text, stopReason string) string {
	content, _ := json.Marshal([]map[string]string{{"type": "text", "text": text}})
	if text == "" {
		content = []byte("[]")
	}
	return fmt.Sprintf(`{"id":"msg_fake01","type":"message","role":"assistant","model":%q,"content":%s,`+
		`"stop_reason":%q,"stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":3,"cache_read_input_tokens":5,"output_tokens":7}}`,
		model, content, stopReason)
}

// AnthropicEvent is one typed event: its event: line and its data.
func AnthropicEvent(typ, data string) string { return "event: " + typ + "\ndata: " + data }

// AnthropicStart is the events a stream starts with: message_start, the
// first content block's start (a text block), and a ping.
func AnthropicStart(model string) []string {
	return []string{
		AnthropicEvent("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_fake01","type":"message","role":"assistant",`+
			`"model":%q,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":3,`+
			`"cache_read_input_tokens":5,"output_tokens":1}}}`, model)),
		AnthropicEvent("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
		AnthropicEvent("ping", `{"type": "ping"}`),
	}
}

// AnthropicTextDelta is a text_delta of the block at index 0.
func AnthropicTextDelta(text string) string {
	b, _ := json.Marshal(text)
	return AnthropicEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":`+string(b)+`}}`)
}

// AnthropicEnd is the events a stream of one block ends with:
// content_block_stop, the message_delta with stopReason and the usage, and
// message_stop.
func AnthropicEnd(stopReason string) []string {
	return []string{
		AnthropicEvent("content_block_stop", `{"type":"content_block_stop","index":0}`),
		AnthropicEvent("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":%q,"stop_sequence":null},"usage":{"output_tokens":9}}`, stopReason)),
		AnthropicEvent("message_stop", `{"type":"message_stop"}`),
	}
}

// AnthropicTextStream is a whole stream of one text block, one
// text_delta per part, ending in end_turn.
func AnthropicTextStream(model string, parts ...string) []string {
	evs := AnthropicStart(model)
	for _, p := range parts {
		evs = append(evs, AnthropicTextDelta(p))
	}
	return append(evs, AnthropicEnd("end_turn")...)
}

// AnthropicErrorAfterTwoDeltas is a stream that fails after two
// text_deltas with an overloaded_error event.
func AnthropicErrorAfterTwoDeltas(model string) []string {
	evs := append(AnthropicStart(model), AnthropicTextDelta("Hello"), AnthropicTextDelta("! How can"))
	return append(evs, AnthropicEvent("error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`))
}

// AnthropicThinkingToolStream is a stream with a thinking block (thinking
// and signature deltas), a text block and a tool_use block (input_json
// deltas), ending in tool_use.
func AnthropicThinkingToolStream(model string) []string {
	start := AnthropicStart(model)
	return []string{
		start[0],
		AnthropicEvent("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`),
		AnthropicEvent("ping", `{"type": "ping"}`),
		AnthropicEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"The user wants the weather; I have a get_weather tool."}}`),
		AnthropicEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pk"}}`),
		AnthropicEvent("content_block_stop", `{"type":"content_block_stop","index":0}`),
		AnthropicEvent("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`),
		AnthropicEvent("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"I'll check the weather."}}`),
		AnthropicEvent("content_block_stop", `{"type":"content_block_stop","index":1}`),
		AnthropicEvent("content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01Fake","name":"get_weather","input":{}}}`),
		AnthropicEvent("content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"location\": \"San Fra"}}`),
		AnthropicEvent("content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"ncisco, CA\"}"}}`),
		AnthropicEvent("content_block_stop", `{"type":"content_block_stop","index":2}`),
		AnthropicEvent("message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}`),
		AnthropicEvent("message_stop", `{"type":"message_stop"}`),
	}
}
