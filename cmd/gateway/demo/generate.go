package demo

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/fnv"
	"math"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// The request and response shapes below are the subset of the OpenAI wire
// format the fake reads and writes. They are its own rather than go-openai's
// so that the JSON is exactly what OpenAI sends: finish_reason null while a
// stream runs, "choices":[] on the usage chunk, "content":null beside
// tool calls.

type chatRequest struct {
	Model         string         `json:"model"`
	Messages      []chatMessage  `json:"messages"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
	N             int            `json:"n"`
	// ResponseFormat asks for JSON (see structuredContent).
	ResponseFormat *responseFormat `json:"response_format"`
	Tools          []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"` // a string, or an array of parts
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"` // a string, strings, or tokens
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	N             int             `json:"n"`
}

type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	Dimensions     int             `json:"dimensions"`
	EncodingFormat string          `json:"encoding_format"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type chatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	Usage             usage        `json:"usage"`
	SystemFingerprint string       `json:"system_fingerprint"`
}

type chatChoice struct {
	Index        int       `json:"index"`
	Message      message   `json:"message"`
	Logprobs     *struct{} `json:"logprobs"` // always null
	FinishReason string    `json:"finish_reason"`
}

type message struct {
	Role      string     `json:"role"`
	Content   *string    `json:"content"`
	Refusal   *string    `json:"refusal"` // always null
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

type toolCall struct {
	Index    *int     `json:"index,omitempty"` // streams only
	ID       string   `json:"id,omitempty"`
	Type     string   `json:"type,omitempty"`
	Function function `json:"function"`
}

type function struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

type chatChunk struct {
	ID                string        `json:"id"`
	Object            string        `json:"object"`
	Created           int64         `json:"created"`
	Model             string        `json:"model"`
	SystemFingerprint string        `json:"system_fingerprint"`
	Choices           []chunkChoice `json:"choices"`
	// Usage is left nil (omitted) unless the request asked for usage;
	// then it is (*usage)(nil), which marshals as null, on every chunk but
	// the last, as OpenAI does.
	Usage any `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int       `json:"index"`
	Delta        delta     `json:"delta"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

type delta struct {
	Role      string     `json:"role,omitempty"`
	Content   *string    `json:"content,omitempty"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

type textCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint"`
	Choices           []textChoice `json:"choices"`
	Usage             any          `json:"usage,omitempty"` // as chatChunk.Usage
}

type textChoice struct {
	Text         string    `json:"text"`
	Index        int       `json:"index"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

type embeddingList struct {
	Object string      `json:"object"`
	Data   []embedding `json:"data"`
	Model  string      `json:"model"`
	Usage  struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

type embedding struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string
}

type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

const (
	fingerprint  = "fp_llmgate_fake"
	modelCreated = 1700000000 // a fixed date, so model listings are stable
	maxChoices   = 128        // OpenAI's limit on n
	maxDims      = 8192
	chunkBytes   = 64 // chunk size when Options.ContentBytes sets the size
	saidRunes    = 60 // how much of the user's message the answer echoes
	defaultDims  = 8
)

// chatReply is one generated chat answer, before it is written as JSON or
// as a stream.
type chatReply struct {
	req     chatRequest
	n       int
	a       answer
	call    *toolCall
	use     usage
	id      string
	created int64
}

func (x *exchange) chat(body []byte) error {
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return x.badRequest("", "We could not parse the JSON body of your request: %v", err)
	}
	if req.Model == "" {
		return x.badRequest("model", "You must provide a model parameter.")
	}
	if len(req.Messages) == 0 {
		return x.badRequest("messages", "[] is too short - 'messages'")
	}
	n, err := x.choices(req.N)
	if err != nil {
		return err
	}
	r := x.chatReply(req, n)
	if !req.Stream {
		return x.chatJSON(r)
	}
	return x.chatStream(r)
}

// chatReply generates the answer to req: content, or a call of its first
// tool, with usage counted as OpenAI would roughly count it.
func (x *exchange) chatReply(req chatRequest, n int) chatReply {
	var said string
	prompt := 3 // OpenAI's per-reply priming
	for _, m := range req.Messages {
		text := contentText(m.Content)
		prompt += 4 + tokens(text)
		if m.Role == "user" {
			said = text
		}
	}
	r := chatReply{req: req, n: n, a: x.answer(said), id: x.s.newID("chatcmpl-fake"), created: time.Now().Unix()}
	if c, ok := structuredContent(req.ResponseFormat, said); ok && !x.step.Empty {
		r.a.content = c
	}
	if r.a.finish == "tool_calls" {
		name := "lookup"
		if len(req.Tools) > 0 && req.Tools[0].Function.Name != "" {
			name = req.Tools[0].Function.Name
		}
		args, _ := json.Marshal(map[string]string{"input": firstRunes(said, saidRunes)})
		r.call = &toolCall{ID: "call_" + randHex(), Type: "function", Function: function{Name: name, Arguments: string(args)}}
		r.a.content = ""
	}
	completion := tokens(r.a.content)
	if r.call != nil {
		completion = tokens(r.call.Function.Name) + tokens(r.call.Function.Arguments)
	}
	r.use = usage{PromptTokens: prompt, CompletionTokens: n * completion, TotalTokens: prompt + n*completion}
	return r
}

func (x *exchange) chatJSON(r chatReply) error {
	resp := chatCompletion{
		ID: r.id, Object: "chat.completion", Created: r.created, Model: r.req.Model,
		Usage: r.use, SystemFingerprint: fingerprint,
	}
	for i := range r.n {
		m := message{Role: "assistant", Content: &r.a.content}
		if r.call != nil {
			m.Content = nil
			m.ToolCalls = []toolCall{*r.call}
		}
		resp.Choices = append(resp.Choices, chatChoice{Index: i, Message: m, FinishReason: r.a.finish})
	}
	return x.writeJSON(resp)
}

func (x *exchange) chatStream(r chatReply) error {
	includeUsage := r.req.StreamOptions != nil && r.req.StreamOptions.IncludeUsage
	chunk := func(choices ...chunkChoice) chatChunk {
		c := chatChunk{
			ID: r.id, Object: "chat.completion.chunk", Created: r.created, Model: r.req.Model,
			SystemFingerprint: fingerprint, Choices: choices,
		}
		if includeUsage {
			c.Usage = (*usage)(nil)
		}
		return c
	}
	// each is one chunk per choice, all with the same delta.
	var events []any
	each := func(d func() delta) {
		for i := range r.n {
			events = append(events, chunk(chunkChoice{Index: i, Delta: d()}))
		}
	}
	empty := ""
	each(func() delta {
		if r.call == nil {
			return delta{Role: "assistant", Content: &empty}
		}
		zero := 0
		head := *r.call
		head.Index, head.Function.Arguments = &zero, ""
		return delta{Role: "assistant", ToolCalls: []toolCall{head}}
	})
	if r.call != nil {
		each(func() delta {
			zero := 0
			return delta{ToolCalls: []toolCall{{Index: &zero, Function: function{Arguments: r.call.Function.Arguments}}}}
		})
	}
	for _, piece := range x.pieces(r.a.content) {
		each(func() delta { return delta{Content: &piece} })
	}
	var tail []any
	for i := range r.n {
		tail = append(tail, chunk(chunkChoice{Index: i, Delta: delta{}, FinishReason: &r.a.finish}))
	}
	if includeUsage {
		last := chunk()
		last.Choices = []chunkChoice{}
		last.Usage = &r.use
		tail = append(tail, last)
	}
	return x.stream(events, tail)
}

func (x *exchange) completion(body []byte) error {
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return x.badRequest("", "We could not parse the JSON body of your request: %v", err)
	}
	if req.Model == "" {
		return x.badRequest("model", "You must provide a model parameter.")
	}
	n, err := x.choices(req.N)
	if err != nil {
		return err
	}
	said := promptText(req.Prompt)
	a := x.answer(said)
	prompt := max(1, tokens(said))
	use := usage{PromptTokens: prompt, CompletionTokens: n * tokens(a.content), TotalTokens: prompt + n*tokens(a.content)}
	id := x.s.newID("cmpl-fake")
	created := time.Now().Unix()
	includeUsage := req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	resp := func(choices ...textChoice) textCompletion {
		c := textCompletion{
			ID: id, Object: "text_completion", Created: created, Model: req.Model,
			SystemFingerprint: fingerprint, Choices: choices,
		}
		if includeUsage {
			c.Usage = (*usage)(nil)
		}
		return c
	}

	if !req.Stream {
		r := resp()
		for i := range n {
			r.Choices = append(r.Choices, textChoice{Text: a.content, Index: i, FinishReason: &a.finish})
		}
		r.Usage = &use
		return x.writeJSON(r)
	}

	var events, tail []any
	for _, piece := range x.pieces(a.content) {
		for i := range n {
			events = append(events, resp(textChoice{Text: piece, Index: i}))
		}
	}
	for i := range n {
		tail = append(tail, resp(textChoice{Index: i, FinishReason: &a.finish}))
	}
	if includeUsage {
		last := resp()
		last.Choices = []textChoice{}
		last.Usage = &use
		tail = append(tail, last)
	}
	return x.stream(events, tail)
}

func (x *exchange) embeddings(body []byte) error {
	var req embeddingRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return x.badRequest("", "We could not parse the JSON body of your request: %v", err)
	}
	if req.Model == "" {
		return x.badRequest("model", "You must provide a model parameter.")
	}
	inputs, ok := embeddingInputs(req.Input)
	if !ok {
		return x.badRequest("input", "'input' must be a non-empty string, array of strings, array of tokens or array of token arrays.")
	}
	dims := req.Dimensions
	switch {
	case dims == 0:
		dims = defaultDims
	case dims < 0 || dims > maxDims:
		return x.badRequest("dimensions", "'dimensions' must be between 1 and %d.", maxDims)
	}
	base64Format := false
	switch req.EncodingFormat {
	case "", "float":
	case "base64":
		base64Format = true
	default:
		return x.badRequest("encoding_format", "'encoding_format' must be 'float' or 'base64'.")
	}

	resp := embeddingList{Object: "list", Model: req.Model}
	for i, in := range inputs {
		v := vector(in, dims)
		e := embedding{Object: "embedding", Index: i, Embedding: v}
		if base64Format {
			b := make([]byte, 0, 4*len(v))
			for _, f := range v {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
			}
			e.Embedding = base64.StdEncoding.EncodeToString(b)
		}
		resp.Data = append(resp.Data, e)
		resp.Usage.PromptTokens += max(1, tokens(in))
	}
	resp.Usage.TotalTokens = resp.Usage.PromptTokens
	return x.writeJSON(resp)
}

func (x *exchange) models() error {
	list := struct {
		Object string `json:"object"`
		Data   []any  `json:"data"`
	}{Object: "list", Data: []any{}}
	for _, id := range x.s.models {
		list.Data = append(list.Data, x.modelCard(id))
	}
	return x.writeJSON(list)
}

func (x *exchange) model(id string) error {
	for _, m := range x.s.models {
		if m == id {
			return x.writeJSON(x.modelCard(id))
		}
	}
	return x.writeError(http.StatusNotFound, apiError{
		Message: "The model '" + id + "' does not exist or you do not have access to it.",
		Type:    "invalid_request_error",
		Param:   "model",
		Code:    "model_not_found",
	})
}

// modelCard describes the model id as OpenAI does, or as vLLM does when
// Options.MaxModelLen is set.
func (x *exchange) modelCard(id string) any {
	m := model{ID: id, Object: "model", Created: modelCreated, OwnedBy: "llmgate"}
	if x.s.opts.MaxModelLen <= 0 {
		return m
	}
	return struct {
		model
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen int     `json:"max_model_len"`
	}{m, id, nil, x.s.opts.MaxModelLen}
}

// stream writes events, then tail, then [DONE], as server-sent events, each
// flushed as it is written. The Step may cut it short: StopAfter and
// StallAfter count every event; ErrorInStream replaces tail and [DONE] with
// an error event.
func (x *exchange) stream(events, tail []any) error {
	st := x.step
	if !st.ErrorInStream {
		events = append(events, tail...)
	}
	h := x.w.Header()
	h.Set("Cache-Control", "no-cache")
	if st.StopAfter > 0 {
		h.Set("Connection", "close")
	}
	x.writeHeader(200, "text/event-stream")
	if err := x.flush(); err != nil {
		return err
	}
	ctx := x.r.Context()
	for i, ev := range events {
		switch {
		case st.StopAfter > 0 && i == st.StopAfter:
			return nil
		case st.StallAfter > 0 && i == st.StallAfter:
			return x.s.hang(ctx)
		}
		data, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		if err := x.event(i, data); err != nil {
			return err
		}
	}
	switch {
	case st.StopAfter > 0:
		return nil
	case st.StallAfter > 0:
		return x.s.hang(ctx)
	case st.ErrorInStream:
		e := statusError(500, st.ErrType, st.ErrCode)
		e.Message = "llmgate fake upstream: scripted error in stream."
		data, err := json.Marshal(e)
		if err != nil {
			return err
		}
		return x.event(len(events), data)
	}
	return x.event(len(events), []byte("[DONE]"))
}

// event writes the i-th event of a stream, after the chunk delay (none
// before the first), in one write, so a flush never splits one.
func (x *exchange) event(i int, data []byte) error {
	return x.namedEvent(i, "", data)
}

// namedEvent is event with an "event: name" line before the data when name
// is not empty, as the Responses API's typed events have.
func (x *exchange) namedEvent(i int, name string, data []byte) error {
	if i > 0 {
		gap := x.step.ChunkDelay
		if gap <= 0 {
			gap = x.s.opts.ChunkDelay
		}
		if err := x.s.pause(x.r.Context(), gap); err != nil {
			return err
		}
	}
	buf := make([]byte, 0, len(name)+len(data)+16)
	if name != "" {
		buf = append(buf, "event: "...)
		buf = append(buf, name...)
		buf = append(buf, '\n')
	}
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if err := x.write(buf); err != nil {
		return err
	}
	return x.flush()
}

// choices validates the request's n.
func (x *exchange) choices(n int) (int, error) {
	switch {
	case n == 0:
		return 1, nil
	case n < 1 || n > maxChoices:
		return 0, x.badRequest("n", "%d is not valid for 'n': it must be between 1 and %d.", n, maxChoices)
	}
	return n, nil
}

type answer struct {
	content string
	finish  string
}

// answer is the generated reply to a user who said said, shaped by the
// Step and the Options.
func (x *exchange) answer(said string) answer {
	a := answer{finish: x.step.FinishReason}
	if a.finish == "" {
		a.finish = "stop"
	}
	if x.step.Empty {
		return a
	}
	a.content = simulatedSentence(said)
	if size := x.s.opts.ContentBytes; size > len(a.content) {
		const filler = " The quick brown fox jumps over the lazy dog."
		var b strings.Builder
		b.Grow(size)
		b.WriteString(a.content)
		for b.Len() < size {
			b.WriteString(filler[:min(len(filler), size-b.Len())])
		}
		a.content = b.String()
	}
	return a
}

// simulatedSentence is the canned answer to a user who said said.
func simulatedSentence(said string) string {
	if said = firstRunes(said, saidRunes); said == "" {
		return "This is llmgate's simulated upstream. You said nothing."
	}
	return "This is llmgate's simulated upstream. You said: " + said
}

// pieces splits content into the stream's content chunks, on rune
// boundaries. Empty content has none.
func (x *exchange) pieces(content string) []string {
	if content == "" {
		return nil
	}
	k := x.s.opts.Chunks
	if k <= 0 {
		k = 5
		if x.s.opts.ContentBytes > 0 {
			k = max(1, (len(content)+chunkBytes-1)/chunkBytes)
		}
	}
	out := make([]string, 0, k)
	prev := 0
	for i := 1; i <= k; i++ {
		cut := len(content) * i / k
		for cut < len(content) && !utf8.RuneStart(content[cut]) {
			cut++
		}
		cut = max(cut, prev)
		out = append(out, content[prev:cut])
		prev = cut
	}
	return out
}

// contentText is the text of a message's content: a string, or the text
// parts of an array of parts.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return ""
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, " ")
}

// promptText is a legacy prompt as text: the string, or the first of the
// strings. Token prompts have no text to echo.
func promptText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) > 0 {
		return ss[0]
	}
	return ""
}

// embeddingInputs lists the inputs to embed: a string, an array of
// strings, one array of tokens, or an array of token arrays. Token arrays
// are keyed by their JSON text.
func embeddingInputs(raw json.RawMessage) ([]string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}, true
	}
	var tokens []int
	if json.Unmarshal(raw, &tokens) == nil && len(tokens) > 0 {
		return []string{string(raw)}, true
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil || len(items) == 0 {
		return nil, false
	}
	out := make([]string, 0, len(items))
	for _, item := range items {
		if json.Unmarshal(item, &s) == nil {
			out = append(out, s)
			continue
		}
		if json.Unmarshal(item, &tokens) == nil && len(tokens) > 0 {
			out = append(out, string(item))
			continue
		}
		return nil, false
	}
	return out, true
}

// vector is a deterministic unit vector for input: splitmix64 seeded with
// the input's FNV-1a hash.
func vector(input string, dims int) []float32 {
	h := fnv.New64a()
	h.Write([]byte(input))
	state := h.Sum64()
	v := make([]float64, dims)
	var norm float64
	for i := range v {
		state += 0x9e3779b97f4a7c15
		z := state
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		v[i] = float64(z>>11)/(1<<53)*2 - 1
		norm += v[i] * v[i]
	}
	norm = math.Sqrt(norm)
	out := make([]float32, dims)
	for i, f := range v {
		out[i] = float32(f / norm)
	}
	return out
}

// tokens is a rough token count: about four bytes of English per token.
func tokens(s string) int {
	return (len(s) + 3) / 4
}

func firstRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}
