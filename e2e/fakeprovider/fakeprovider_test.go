package fakeprovider_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sashabaranov/go-openai"
	"go.uber.org/goleak"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// Every wait in the fake selects on the request context, so no handler may
// outlive its test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start serves a new fake on loopback until the test ends.
func start(t testing.TB, o fakeprovider.Options) (*fakeprovider.Server, *httptest.Server) {
	t.Helper()
	fake := fakeprovider.New(o)
	srv := httptest.NewServer(fake)
	t.Cleanup(func() {
		fake.Close()
		srv.Close()
	})
	return fake, srv
}

func client(srv *httptest.Server, key string) *openai.Client {
	cfg := openai.DefaultConfig(key)
	cfg.BaseURL = srv.URL + "/v1"
	cfg.HTTPClient = srv.Client()
	return openai.NewClientWithConfig(cfg)
}

// testCtx is a deadline for reads that must not block; hitting it fails
// the test instead of hanging it.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// post sends body to the fake raw, to see what a gateway sees. It is safe
// to call off the test goroutine.
func post(ctx context.Context, srv *httptest.Server, path, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return srv.Client().Do(req)
}

const chatBody = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello there"}]}`
const streamBody = `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hello there"}]}`

// readEvent returns the data of the next server-sent event.
func readEvent(r *bufio.Reader) (string, error) {
	var data []string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			if data != nil {
				return strings.Join(data, "\n"), nil
			}
			continue
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			data = append(data, d)
		}
	}
}

// readEvents reads events until the body ends; a clean end is a nil error.
func readEvents(body io.Reader) ([]string, error) {
	r := bufio.NewReader(body)
	var events []string
	for {
		ev, err := readEvent(r)
		if errors.Is(err, io.EOF) {
			return events, nil
		}
		if err != nil {
			return events, err
		}
		events = append(events, ev)
	}
}

type rawChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *openai.Usage `json:"usage"`
}

func TestChatCompletion(t *testing.T) {
	_, srv := start(t, fakeprovider.Options{})
	c := client(srv, "k")
	ctx := testCtx(t)

	resp, err := c.CreateChatCompletion(ctx, openai.ChatCompletionRequest{
		Model: "gpt-4o",
		Messages: []openai.ChatCompletionMessage{
			{Role: openai.ChatMessageRoleSystem, Content: "be brief"},
			{Role: openai.ChatMessageRoleUser, Content: "hello there"},
		},
		N: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(resp.ID, "chatcmpl-fake-") || resp.Object != "chat.completion" || resp.Model != "gpt-4o" || resp.Created == 0 {
		t.Errorf("id, object, model, created = %q, %q, %q, %d", resp.ID, resp.Object, resp.Model, resp.Created)
	}
	if len(resp.Choices) != 2 {
		t.Fatalf("got %d choices, want 2 (n=2)", len(resp.Choices))
	}
	for i, ch := range resp.Choices {
		if ch.Index != i || ch.Message.Role != "assistant" || ch.FinishReason != openai.FinishReasonStop {
			t.Errorf("choice %d: index %d, role %q, finish %q", i, ch.Index, ch.Message.Role, ch.FinishReason)
		}
		if want := "This is llmgate's simulated upstream. You said: hello there"; ch.Message.Content != want {
			t.Errorf("choice %d: content %q, want %q", i, ch.Message.Content, want)
		}
	}
	u := resp.Usage
	if u.PromptTokens <= 0 || u.CompletionTokens <= 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("implausible usage %+v", u)
	}
	h := resp.Header()
	for _, k := range []string{"x-request-id", "openai-processing-ms", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests"} {
		if h.Get(k) == "" {
			t.Errorf("missing header %s", k)
		}
	}
	if ct := h.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
}

func TestTwoCallsGetDifferentIDs(t *testing.T) {
	_, srv := start(t, fakeprovider.Options{})
	c := client(srv, "k")
	req := openai.ChatCompletionRequest{
		Model:    "gpt-4o-mini",
		Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}},
	}
	a, err := c.CreateChatCompletion(testCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.CreateChatCompletion(testCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if a.ID == b.ID {
		t.Errorf("both calls answered with id %q", a.ID)
	}
	if a.Header().Get("x-request-id") == b.Header().Get("x-request-id") {
		t.Errorf("both calls answered with x-request-id %q", a.Header().Get("x-request-id"))
	}
}

func TestChatStream(t *testing.T) {
	for _, includeUsage := range []bool{false, true} {
		t.Run(fmt.Sprintf("include_usage=%v", includeUsage), func(t *testing.T) {
			_, srv := start(t, fakeprovider.Options{})
			req := openai.ChatCompletionRequest{
				Model:    "gpt-4o-mini",
				Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hello there"}},
				Stream:   true,
			}
			if includeUsage {
				req.StreamOptions = &openai.StreamOptions{IncludeUsage: true}
			}
			stream, err := client(srv, "k").CreateChatCompletionStream(testCtx(t), req)
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Close()
			if ct := stream.Header().Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type %q", ct)
			}

			var chunks []openai.ChatCompletionStreamResponse
			for {
				chunk, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				chunks = append(chunks, chunk)
			}
			// role, 5 content chunks, finish, and maybe usage.
			want := 7
			if includeUsage {
				want++
			}
			if len(chunks) != want {
				t.Fatalf("got %d chunks, want %d", len(chunks), want)
			}
			if chunks[0].Choices[0].Delta.Role != "assistant" {
				t.Errorf("first chunk has role %q", chunks[0].Choices[0].Delta.Role)
			}
			var content strings.Builder
			for i, ch := range chunks {
				if ch.ID != chunks[0].ID || ch.Object != "chat.completion.chunk" {
					t.Errorf("chunk %d: id %q object %q, want the stream's id %q", i, ch.ID, ch.Object, chunks[0].ID)
				}
				for _, c := range ch.Choices {
					content.WriteString(c.Delta.Content)
				}
			}
			if want := "This is llmgate's simulated upstream. You said: hello there"; content.String() != want {
				t.Errorf("content %q, want %q", content.String(), want)
			}
			finish := chunks[6]
			if len(finish.Choices) != 1 || finish.Choices[0].FinishReason != openai.FinishReasonStop {
				t.Errorf("finish chunk %+v", finish)
			}
			if includeUsage {
				last := chunks[7]
				if len(last.Choices) != 0 || last.Usage == nil || last.Usage.TotalTokens == 0 {
					t.Errorf("usage chunk: choices %v, usage %+v", last.Choices, last.Usage)
				}
			} else if finish.Usage != nil {
				t.Errorf("usage %+v without include_usage", finish.Usage)
			}
		})
	}
}

// The wire format, read raw: what a gateway's SSE parser sees.
func TestChatStreamFraming(t *testing.T) {
	_, srv := start(t, fakeprovider.Options{})
	resp, err := post(testCtx(t), srv, "/v1/chat/completions",
		`{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	frames := strings.SplitAfter(string(raw), "\n\n")
	if last := frames[len(frames)-1]; last != "" {
		t.Errorf("body does not end with a blank line: %q", last)
	}
	frames = frames[:len(frames)-1]
	for _, f := range frames {
		if !strings.HasPrefix(f, "data: ") || strings.Count(f, "\n") != 2 {
			t.Errorf("frame %q is not `data: <one line>\\n\\n`", f)
		}
	}
	if got := frames[len(frames)-1]; got != "data: [DONE]\n\n" {
		t.Errorf("last frame %q", got)
	}
	// Until the end, finish_reason is null and usage is null, as OpenAI sends them.
	if !strings.Contains(frames[1], `"finish_reason":null`) || !strings.Contains(frames[1], `"usage":null`) {
		t.Errorf("content frame %q lacks null finish_reason or usage", frames[1])
	}
	if usage := frames[len(frames)-2]; !strings.Contains(usage, `"choices":[]`) {
		t.Errorf("usage frame %q lacks empty choices", usage)
	}
}

func TestScriptedStatusAndHeaders(t *testing.T) {
	tests := []struct {
		name       string
		step       fakeprovider.Step
		wantStatus int
		wantHeader map[string]string
		wantBody   string // verbatim, if set
		wantType   string
		wantCode   any
	}{
		{
			name:       "rate limited",
			step:       fakeprovider.Step{Status: 429, Header: map[string]string{"Retry-After": "1", "x-ratelimit-reset-requests": "1s"}},
			wantStatus: 429,
			wantHeader: map[string]string{"Retry-After": "1", "x-ratelimit-reset-requests": "1s"},
			wantType:   "requests",
			wantCode:   "rate_limit_exceeded",
		},
		{
			name:       "unavailable",
			step:       fakeprovider.Step{Status: 503},
			wantStatus: 503,
			wantType:   "server_error",
			wantCode:   nil,
		},
		{
			name:       "context too long",
			step:       fakeprovider.Step{Status: 400, ErrType: "invalid_request_error", ErrCode: "context_length_exceeded"},
			wantStatus: 400,
			wantType:   "invalid_request_error",
			wantCode:   "context_length_exceeded",
		},
		{
			name:       "verbatim error body",
			step:       fakeprovider.Step{Status: 502, Body: "<html>bad gateway</html>", Header: map[string]string{"Content-Type": "text/html"}},
			wantStatus: 502,
			wantHeader: map[string]string{"Content-Type": "text/html"},
			wantBody:   "<html>bad gateway</html>",
		},
		{
			name:       "verbatim success body",
			step:       fakeprovider.Step{Body: `{"id":"x","choices":[]}`},
			wantStatus: 200,
			wantHeader: map[string]string{"Content-Type": "application/json"},
			wantBody:   `{"id":"x","choices":[]}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake, srv := start(t, fakeprovider.Options{})
			fake.Enqueue(tt.step)
			resp, err := post(testCtx(t), srv, "/v1/chat/completions", chatBody)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			for k, v := range tt.wantHeader {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			if tt.wantBody != "" {
				if string(body) != tt.wantBody {
					t.Errorf("body %q, want %q", body, tt.wantBody)
				}
				return
			}
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    any     `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("error body %q: %v", body, err)
			}
			if e.Error.Message == "" || e.Error.Type != tt.wantType || e.Error.Code != tt.wantCode {
				t.Errorf("error %+v, want type %q code %v", e.Error, tt.wantType, tt.wantCode)
			}
		})
	}
}

// go-openai sees scripted errors as *openai.APIError, as it would OpenAI's.
func TestScriptedErrorThroughClient(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{})
	fake.Enqueue(fakeprovider.Step{Status: 429})
	_, err := client(srv, "k").CreateChatCompletion(testCtx(t), openai.ChatCompletionRequest{
		Model:    "gpt-4o-mini",
		Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}},
	})
	apiErr, ok := errors.AsType[*openai.APIError](err)
	if !ok {
		t.Fatalf("err = %v, want an *openai.APIError", err)
	}
	if apiErr.HTTPStatusCode != 429 || apiErr.Code != "rate_limit_exceeded" {
		t.Errorf("status %d code %v", apiErr.HTTPStatusCode, apiErr.Code)
	}
}

func TestQueueThenDefault(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{})
	status := func() int {
		t.Helper()
		resp, err := post(testCtx(t), srv, "/v1/chat/completions", chatBody)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	fake.Enqueue(fakeprovider.Step{Status: 500}, fakeprovider.Step{Status: 502})
	fake.SetDefault(fakeprovider.Step{Status: 503})
	var got []int
	for range 4 {
		got = append(got, status())
	}
	if want := []int{500, 502, 503, 503}; !reflect.DeepEqual(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}

	fake.SetDefault(fakeprovider.Step{})
	fake.Enqueue(fakeprovider.Step{Status: 500})
	fake.ClearQueue()
	if got := status(); got != 200 {
		t.Errorf("after SetDefault(Step{}) and ClearQueue: status %d", got)
	}

	fake.Enqueue(fakeprovider.Step{Status: 500})
	fake.SetDefault(fakeprovider.Step{Status: 503})
	fake.Reset()
	if got := status(); got != 200 {
		t.Errorf("after Reset: status %d", got)
	}
	if n := fake.Calls(""); n != 1 {
		t.Errorf("after Reset and one call: Calls = %d", n)
	}
}

func TestResetClosesConnection(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{})
	fake.Enqueue(fakeprovider.Step{Reset: true})
	resp, err := post(testCtx(t), srv, "/v1/chat/completions", chatBody)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got status %d, want a connection error", resp.StatusCode)
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Errorf("err = %v, want ECONNRESET or EOF", err)
	}
	if n := fake.Calls("/v1/chat/completions"); n != 1 {
		t.Errorf("Calls = %d, want 1 (no retry)", n)
	}
}

func TestResetAfterTruncatesBody(t *testing.T) {
	for _, body := range []string{chatBody, streamBody} {
		t.Run(body, func(t *testing.T) {
			fake, srv := start(t, fakeprovider.Options{})
			fake.Enqueue(fakeprovider.Step{ResetAfter: 20})
			resp, err := post(testCtx(t), srv, "/v1/chat/completions", body)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("status %d", resp.StatusCode)
			}
			got, err := io.ReadAll(resp.Body)
			if err == nil {
				t.Errorf("read %q to a clean end, want an error", got)
			}
			if len(got) != 20 {
				t.Errorf("read %d bytes (%q), want 20", len(got), got)
			}
		})
	}
}

func TestStopAfterEndsStreamWithoutDone(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{})
	fake.Enqueue(fakeprovider.Step{StopAfter: 3})
	resp, err := post(testCtx(t), srv, "/v1/chat/completions", streamBody)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events, err := readEvents(resp.Body)
	if err != nil {
		t.Fatalf("stream ended with %v, want a clean end", err)
	}
	if len(events) != 3 {
		t.Errorf("got %d events, want 3: %q", len(events), events)
	}
	for _, ev := range events {
		if ev == "[DONE]" {
			t.Error("stream sent [DONE]")
		}
	}
}

func TestStallAfterBlocksUntilClientCancels(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{})
	fake.Enqueue(fakeprovider.Step{StallAfter: 2})
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	resp, err := post(ctx, srv, "/v1/chat/completions", streamBody)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	for range 2 {
		if _, err := readEvent(r); err != nil {
			t.Fatal(err)
		}
	}
	// Nothing more comes until the client gives up; then the read fails
	// rather than ending cleanly.
	cancel()
	rest, err := io.ReadAll(r)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("read after cancel: %v, want context.Canceled", err)
	}
	if len(rest) != 0 {
		t.Errorf("got %q after the stall", rest)
	}
}

func TestErrorInStream(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{})
	fake.Enqueue(fakeprovider.Step{ErrorInStream: true, ErrCode: "overloaded"})
	stream, err := client(srv, "k").CreateChatCompletionStream(testCtx(t), openai.ChatCompletionRequest{
		Model:    "gpt-4o-mini",
		Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}},
		Stream:   true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	chunks := 0
	for {
		_, err = stream.Recv()
		if err != nil {
			break
		}
		chunks++
	}
	apiErr, ok := errors.AsType[*openai.APIError](err)
	if !ok {
		t.Fatalf("stream ended with %v, want an *openai.APIError", err)
	}
	if apiErr.Type != "server_error" || apiErr.Code != "overloaded" {
		t.Errorf("error type %q code %v", apiErr.Type, apiErr.Code)
	}
	if chunks != 6 {
		t.Errorf("got %d chunks before the error, want 6 (role and content)", chunks)
	}
}

func TestChunksArriveIncrementally(t *testing.T) {
	// With an hour between chunks, the first chunk can only be read if it
	// was flushed on its own, long before the last is written. The test's
	// deadline turns a buffered stream into a failure, not a hang.
	_, srv := start(t, fakeprovider.Options{ChunkDelay: time.Hour})
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	resp, err := post(ctx, srv, "/v1/chat/completions", streamBody)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first, err := readEvent(bufio.NewReader(resp.Body))
	if err != nil {
		t.Fatalf("first chunk: %v", err)
	}
	var chunk rawChunk
	if err := json.Unmarshal([]byte(first), &chunk); err != nil {
		t.Fatal(err)
	}
	if chunk.Choices[0].Delta.Role != "assistant" || chunk.Choices[0].FinishReason != nil {
		t.Errorf("first chunk %s is not the role chunk", first)
	}
	// Cancelling releases the handler from its chunk delay; goleak and
	// srv.Close check that it does.
}

func TestFinishReasons(t *testing.T) {
	tools := []openai.Tool{{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{Name: "get_weather"}}}
	tests := []struct {
		step        fakeprovider.Step
		wantFinish  openai.FinishReason
		wantContent bool
		wantTool    string
	}{
		{fakeprovider.Step{}, openai.FinishReasonStop, true, ""},
		{fakeprovider.Step{FinishReason: "length"}, openai.FinishReasonLength, true, ""},
		{fakeprovider.Step{FinishReason: "content_filter"}, openai.FinishReasonContentFilter, true, ""},
		{fakeprovider.Step{FinishReason: "tool_calls"}, openai.FinishReasonToolCalls, false, "get_weather"},
		{fakeprovider.Step{Empty: true}, openai.FinishReasonStop, false, ""},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%+v", tt.step), func(t *testing.T) {
			fake, srv := start(t, fakeprovider.Options{})
			fake.Enqueue(tt.step, tt.step)
			c := client(srv, "k")
			req := openai.ChatCompletionRequest{
				Model:    "gpt-4o-mini",
				Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "weather in Paris?"}},
				Tools:    tools,
			}

			resp, err := c.CreateChatCompletion(testCtx(t), req)
			if err != nil {
				t.Fatal(err)
			}
			msg := resp.Choices[0].Message
			if resp.Choices[0].FinishReason != tt.wantFinish || (msg.Content != "") != tt.wantContent {
				t.Errorf("finish %q content %q", resp.Choices[0].FinishReason, msg.Content)
			}
			if tt.wantTool != "" && (len(msg.ToolCalls) != 1 || msg.ToolCalls[0].Function.Name != tt.wantTool || msg.ToolCalls[0].ID == "") {
				t.Errorf("tool calls %+v, want one call of %s", msg.ToolCalls, tt.wantTool)
			}

			req.Stream = true
			stream, err := c.CreateChatCompletionStream(testCtx(t), req)
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Close()
			var content, name, args strings.Builder
			var finish openai.FinishReason
			for {
				chunk, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				for _, ch := range chunk.Choices {
					content.WriteString(ch.Delta.Content)
					for _, tc := range ch.Delta.ToolCalls {
						name.WriteString(tc.Function.Name)
						args.WriteString(tc.Function.Arguments)
					}
					if ch.FinishReason != "" {
						finish = ch.FinishReason
					}
				}
			}
			if finish != tt.wantFinish || (content.Len() > 0) != tt.wantContent || name.String() != tt.wantTool {
				t.Errorf("stream: finish %q content %q tool %q", finish, content.String(), name.String())
			}
			if tt.wantTool != "" && !json.Valid([]byte(args.String())) {
				t.Errorf("stream: tool arguments %q are not JSON", args.String())
			}
		})
	}
}

func TestContentSizeAndChunks(t *testing.T) {
	tests := []struct {
		opts       fakeprovider.Options
		wantLen    int // 0: the canned sentence
		wantChunks int
	}{
		{fakeprovider.Options{}, 0, 5},
		{fakeprovider.Options{Chunks: 3}, 0, 3},
		{fakeprovider.Options{ContentBytes: 1000}, 1000, 16},
		{fakeprovider.Options{ContentBytes: 1000, Chunks: 2}, 1000, 2},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%+v", tt.opts), func(t *testing.T) {
			_, srv := start(t, tt.opts)
			c := client(srv, "k")
			req := openai.ChatCompletionRequest{
				Model:    "gpt-4o-mini",
				Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "héllo wörld"}},
			}
			resp, err := c.CreateChatCompletion(testCtx(t), req)
			if err != nil {
				t.Fatal(err)
			}
			content := resp.Choices[0].Message.Content
			if tt.wantLen != 0 && len(content) != tt.wantLen {
				t.Errorf("content is %d bytes, want %d", len(content), tt.wantLen)
			}

			req.Stream = true
			stream, err := c.CreateChatCompletionStream(testCtx(t), req)
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Close()
			var got strings.Builder
			chunks := 0
			for {
				chunk, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if d := chunk.Choices[0].Delta; d.Role == "" && chunk.Choices[0].FinishReason == "" {
					chunks++
					got.WriteString(d.Content)
				}
			}
			if chunks != tt.wantChunks {
				t.Errorf("%d content chunks, want %d", chunks, tt.wantChunks)
			}
			if got.String() != content {
				t.Errorf("stream content %q differs from non-stream %q", got.String(), content)
			}
		})
	}
}

func TestLegacyCompletions(t *testing.T) {
	_, srv := start(t, fakeprovider.Options{})
	c := client(srv, "k")
	req := openai.CompletionRequest{Model: "gpt-3.5-turbo-instruct", Prompt: "say hi"}
	resp, err := c.CreateCompletion(testCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Object != "text_completion" || !strings.HasPrefix(resp.ID, "cmpl-fake-") ||
		!strings.Contains(resp.Choices[0].Text, "You said: say hi") || resp.Choices[0].FinishReason != "stop" ||
		resp.Usage == nil || resp.Usage.TotalTokens == 0 {
		t.Errorf("completion %+v", resp)
	}

	req.Stream = true
	stream, err := c.CreateCompletionStream(testCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var text strings.Builder
	var finish string
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if chunk.ID != resp.ID && chunk.Object != "text_completion" {
			t.Errorf("chunk %+v", chunk)
		}
		text.WriteString(chunk.Choices[0].Text)
		if f := chunk.Choices[0].FinishReason; f != "" {
			finish = f
		}
	}
	if text.String() != resp.Choices[0].Text || finish != "stop" {
		t.Errorf("streamed text %q finish %q", text.String(), finish)
	}
}

func TestEmbeddings(t *testing.T) {
	_, srv := start(t, fakeprovider.Options{})
	c := client(srv, "k")
	ctx := testCtx(t)
	embed := func(format openai.EmbeddingEncodingFormat, dims int, input ...string) openai.EmbeddingResponse {
		t.Helper()
		resp, err := c.CreateEmbeddings(ctx, openai.EmbeddingRequestStrings{
			Input: input, Model: openai.SmallEmbedding3, EncodingFormat: format, Dimensions: dims,
		})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	a := embed("", 16, "alpha", "beta")
	if len(a.Data) != 2 || a.Data[1].Index != 1 || a.Usage.PromptTokens == 0 || a.Model != openai.SmallEmbedding3 {
		t.Fatalf("response %+v", a)
	}
	for _, d := range a.Data {
		if len(d.Embedding) != 16 {
			t.Errorf("dimension %d, want 16", len(d.Embedding))
		}
		var norm float64
		for _, f := range d.Embedding {
			norm += float64(f) * float64(f)
		}
		if math.Abs(norm-1) > 1e-4 {
			t.Errorf("norm² %v, want a unit vector", norm)
		}
	}
	if reflect.DeepEqual(a.Data[0].Embedding, a.Data[1].Embedding) {
		t.Error("different inputs got the same vector")
	}
	if b := embed("", 16, "alpha"); !reflect.DeepEqual(b.Data[0].Embedding, a.Data[0].Embedding) {
		t.Error("the same input got a different vector")
	}
	if b := embed(openai.EmbeddingEncodingFormatBase64, 16, "alpha"); !reflect.DeepEqual(b.Data[0].Embedding, a.Data[0].Embedding) {
		t.Error("base64 encoding gave a different vector")
	}
	if b := embed("", 0, "alpha"); len(b.Data[0].Embedding) != 8 {
		t.Errorf("default dimension %d, want 8", len(b.Data[0].Embedding))
	}

	// A single string, and token arrays, are inputs too.
	for _, input := range []string{`"alpha"`, `[1,2,3]`, `[[1,2],[3]]`} {
		resp, err := post(ctx, srv, "/v1/embeddings", `{"model":"m","input":`+input+`}`)
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Data []struct{ Embedding []float32 }
		}
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || len(list.Data) == 0 {
			t.Errorf("input %s: status %d, %d vectors, err %v", input, resp.StatusCode, len(list.Data), err)
		}
	}
}

func TestModels(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		_, srv := start(t, fakeprovider.Options{})
		list, err := client(srv, "k").ListModels(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range list.Models {
			ids = append(ids, m.ID)
		}
		if want := []string{"gpt-4o-mini", "gpt-4o", "text-embedding-3-small"}; !reflect.DeepEqual(ids, want) {
			t.Errorf("models %v, want %v", ids, want)
		}
	})
	t.Run("configured", func(t *testing.T) {
		_, srv := start(t, fakeprovider.Options{Models: []string{"local-llama"}})
		c := client(srv, "k")
		m, err := c.GetModel(testCtx(t), "local-llama")
		if err != nil || m.ID != "local-llama" || m.Object != "model" {
			t.Errorf("GetModel = %+v, %v", m, err)
		}
		_, err = c.GetModel(testCtx(t), "gpt-4o")
		if apiErr, ok := errors.AsType[*openai.APIError](err); !ok || apiErr.HTTPStatusCode != 404 || apiErr.Code != "model_not_found" {
			t.Errorf("GetModel of an unserved model: %v", err)
		}
	})
}

func TestBadRequests(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{})
	tests := []struct {
		method, path, body string
		wantStatus         int
	}{
		{"POST", "/v1/chat/completions", `{"model":`, 400},
		{"POST", "/v1/chat/completions", `{"model":"m","messages":[]}`, 400},
		{"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 400},
		{"POST", "/v1/embeddings", `not json`, 400},
		{"POST", "/v1/embeddings", `{"model":"m","input":[]}`, 400},
		{"POST", "/v1/completions", `{"model":"m","prompt":"hi"} trailing`, 400},
		{"GET", "/v1/chat/completions", "", 404},
		{"POST", "/v1/responses", "{}", 400},
		{"POST", "/v1/responses", `{"model":"m","input":"hi","previous_response_id":"resp_unknown"}`, 400},
		{"GET", "/v1/responses/resp_unknown", "", 404},
		{"GET", "/v1/responses/resp_unknown/nope", "", 404},
		{"POST", "/v1/assistants", "{}", 404},
		{"GET", "/healthz", "", 404},
	}
	for _, tt := range tests {
		req, err := http.NewRequestWithContext(testCtx(t), tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct{ Message, Type string }
		}
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != tt.wantStatus || err != nil || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
			t.Errorf("%s %s %q: status %d, error %+v, decode %v", tt.method, tt.path, tt.body, resp.StatusCode, e.Error, err)
		}
	}
	if got := fake.Calls(""); got != len(tests) {
		t.Errorf("recorded %d requests, want all %d", got, len(tests))
	}
}

func TestAPIKey(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{APIKey: "sk-right"})
	fake.Enqueue(fakeprovider.Step{Status: 500})
	req := openai.ChatCompletionRequest{
		Model:    "gpt-4o-mini",
		Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}},
	}

	_, err := client(srv, "sk-wrong").CreateChatCompletion(testCtx(t), req)
	if apiErr, ok := errors.AsType[*openai.APIError](err); !ok || apiErr.HTTPStatusCode != 401 || apiErr.Code != "invalid_api_key" {
		t.Errorf("wrong key: %v, want 401 invalid_api_key", err)
	}
	// The rejected call consumed no Step: the scripted 500 is still next.
	_, err = client(srv, "sk-right").CreateChatCompletion(testCtx(t), req)
	if apiErr, ok := errors.AsType[*openai.APIError](err); !ok || apiErr.HTTPStatusCode != 500 {
		t.Errorf("right key, scripted 500: %v", err)
	}
	if _, err := client(srv, "sk-right").CreateChatCompletion(testCtx(t), req); err != nil {
		t.Errorf("right key: %v", err)
	}
}

func TestRecorder(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{})
	step := fakeprovider.Step{Status: 429, Header: map[string]string{"Retry-After": "2"}}
	fake.Enqueue(step)
	// Odd spacing and non-ASCII text must come back unchanged.
	body := "{ \"model\" : \"gpt-4o\",\n\t\"messages\": [{\"role\":\"user\",\"content\":\"h\u00e9llo \u2713 \\u00e9\"}] }  "
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Trace", "abc")
	before := time.Now()
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = srv.Client().Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	reqs := fake.Requests()
	if len(reqs) != 2 {
		t.Fatalf("recorded %d requests, want 2", len(reqs))
	}
	r := reqs[0]
	if r.Method != "POST" || r.Path != "/v1/chat/completions" || string(r.Body) != body || r.Header.Get("X-Trace") != "abc" {
		t.Errorf("recorded %s %s %q header %v", r.Method, r.Path, r.Body, r.Header)
	}
	if r.At.Before(before) {
		t.Errorf("recorded At %v before the request was sent (%v)", r.At, before)
	}
	if !reflect.DeepEqual(r.Step, step) {
		t.Errorf("recorded step %+v, want %+v", r.Step, step)
	}
	if g := reqs[1]; g.Method != "GET" || g.Path != "/v1/models" || !reflect.DeepEqual(g.Step, fakeprovider.Step{}) {
		t.Errorf("second request %s %s step %+v", g.Method, g.Path, g.Step)
	}
	if fake.Calls("/v1/chat/completions") != 1 || fake.Calls("/v1/models") != 1 || fake.Calls("") != 2 || fake.Calls("/v1/embeddings") != 0 {
		t.Errorf("Calls: chat %d, models %d, all %d", fake.Calls("/v1/chat/completions"), fake.Calls("/v1/models"), fake.Calls(""))
	}

	// Requests returns copies.
	reqs[0].Body[0] = 'X'
	reqs[0].Header.Set("X-Trace", "changed")
	reqs[0].Step.Header["Retry-After"] = "9"
	again := fake.Requests()[0]
	if string(again.Body) != body || again.Header.Get("X-Trace") != "abc" || again.Step.Header["Retry-After"] != "2" {
		t.Error("changing what Requests returned changed the record")
	}
}

func TestKeepRequests(t *testing.T) {
	for _, tt := range []struct{ keep, want int }{{0, 7}, {3, 3}, {-1, 0}} {
		t.Run(fmt.Sprint(tt.keep), func(t *testing.T) {
			fake, srv := start(t, fakeprovider.Options{KeepRequests: tt.keep})
			for i := range 7 {
				resp, err := post(testCtx(t), srv, "/v1/embeddings", fmt.Sprintf(`{"model":"m","input":"%d"}`, i))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			reqs := fake.Requests()
			if len(reqs) != tt.want || fake.Calls("") != 7 {
				t.Fatalf("kept %d, counted %d; want %d and 7", len(reqs), fake.Calls(""), tt.want)
			}
			if tt.want > 0 && !strings.Contains(string(reqs[len(reqs)-1].Body), `"6"`) {
				t.Errorf("last kept request is %s, want the most recent", reqs[len(reqs)-1].Body)
			}
		})
	}
}

func TestWaitForCalls(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{})
	fake.Enqueue(fakeprovider.Step{Hang: true}, fakeprovider.Step{Delay: time.Hour})

	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			resp, err := post(ctx, srv, "/v1/chat/completions", chatBody)
			if err == nil {
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	// Both requests are recorded while they hang, on arrival.
	if err := fake.WaitForCalls(testCtx(t), 2); err != nil {
		t.Fatal(err)
	}
	if n := fake.Calls("/v1/chat/completions"); n != 2 {
		t.Errorf("Calls = %d, want 2", n)
	}
	cancel()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("hanging request ended with %v, want context.Canceled", err)
		}
	}

	done, stop := context.WithCancel(t.Context())
	stop()
	if err := fake.WaitForCalls(done, 3); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitForCalls on a done context = %v", err)
	}
}

func TestCloseReleasesHangingRequests(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{})
	fake.SetDefault(fakeprovider.Step{Hang: true})
	errs := make(chan error, 1)
	go func() {
		resp, err := post(testCtx(t), srv, "/v1/chat/completions", chatBody)
		if err == nil {
			resp.Body.Close()
		}
		errs <- err
	}()
	if err := fake.WaitForCalls(testCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	fake.Close()
	if err := <-errs; err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("hanging request ended with %v, want the connection dropped", err)
	}
}

func TestConcurrentUse(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{})
	c := client(srv, "k")
	ctx := testCtx(t)
	const workers, calls = 8, 10
	var (
		mu  sync.Mutex
		ids = map[string]bool{}
		wg  sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				req := openai.ChatCompletionRequest{
					Model:    "gpt-4o-mini",
					Messages: []openai.ChatCompletionMessage{{Role: "user", Content: fmt.Sprint(w, i)}},
				}
				var id string
				if i%2 == 0 {
					resp, err := c.CreateChatCompletion(ctx, req)
					if err != nil {
						t.Error(err)
						return
					}
					id = resp.ID
				} else {
					stream, err := c.CreateChatCompletionStream(ctx, req)
					if err != nil {
						t.Error(err)
						return
					}
					chunk, err := stream.Recv()
					stream.Close()
					if err != nil {
						t.Error(err)
						return
					}
					id = chunk.ID
				}
				mu.Lock()
				ids[id] = true
				mu.Unlock()
			}
		})
	}
	for range calls {
		fake.Enqueue(fakeprovider.Step{FinishReason: "length"})
		fake.SetDefault(fakeprovider.Step{})
		_ = fake.Requests()
		_ = fake.Calls("/v1/chat/completions")
	}
	wg.Wait()
	if n := fake.Calls(""); n != workers*calls {
		t.Errorf("Calls = %d, want %d", n, workers*calls)
	}
	if len(ids) != workers*calls {
		t.Errorf("%d distinct ids over %d calls", len(ids), workers*calls)
	}
}

// The fake's own cost per non-streamed call, client included, so the load
// tool can subtract it.
func BenchmarkChatCompletion(b *testing.B) {
	_, srv := start(b, fakeprovider.Options{KeepRequests: -1})
	c := srv.Client()
	b.ReportAllocs()
	for b.Loop() {
		resp, err := c.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func BenchmarkChatCompletionStream(b *testing.B) {
	_, srv := start(b, fakeprovider.Options{KeepRequests: -1})
	c := srv.Client()
	b.ReportAllocs()
	for b.Loop() {
		resp, err := c.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// The handler alone, without HTTP.
func BenchmarkServeHTTP(b *testing.B) {
	fake := fakeprovider.New(fakeprovider.Options{KeepRequests: -1})
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody))
		w := httptest.NewRecorder()
		fake.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatalf("status %d", w.Code)
		}
	}
}
