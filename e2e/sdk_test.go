package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"

	openaigo "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	goopenai "github.com/sashabaranov/go-openai"
)

// What a client's SDK made of one streamed chat completion, and the bytes
// it read, for the invariant the fault tests hold every run to: a stream
// the SDK saw complete is what a retry with its key gets back, byte for
// byte.
type sdkRun struct {
	SDK string
	// Complete: the SDK ended the stream without an error (go-openai:
	// Recv returned io.EOF; openai-go: Next returned false with Err nil).
	Complete bool
	Err      error
	Text     string
	Status   int
	Replayed bool
	// Raw is the response body as read off the wire (the whole of it when
	// Complete).
	Raw []byte
}

// sdkClient streams one keyed chat completion through an official SDK.
// got, when non-nil, is called with each content delta as the SDK hands
// it out (on the calling goroutine).
// complete asks for one keyed chat completion as JSON (not streamed):
// Complete is the SDK returning it without an error.
type sdkClient struct {
	name     string
	stream   func(ctx context.Context, baseURL, key string, got func(string)) sdkRun
	complete func(ctx context.Context, baseURL, key string) sdkRun
}

// sdkClients are the Go SDKs every fault case runs with.
var sdkClients = []sdkClient{
	{"go-openai", goOpenAIStream, goOpenAIComplete},
	{"openai-go", openAIGoStream, openAIGoComplete},
}

func goOpenAIComplete(ctx context.Context, baseURL, key string) (run sdkRun) {
	run.SDK = "go-openai"
	cp := &capture{hdr: map[string]string{"Idempotency-Key": key}}
	defer cp.finish(&run)
	cfg := goopenai.DefaultConfig("e2e-client-key")
	cfg.BaseURL = baseURL + "/v1"
	cfg.HTTPClient = &http.Client{Transport: cp}
	res, err := goopenai.NewClientWithConfig(cfg).CreateChatCompletion(ctx, goopenai.ChatCompletionRequest{
		Model:    "gpt-4o-mini",
		Messages: []goopenai.ChatCompletionMessage{{Role: goopenai.ChatMessageRoleUser, Content: "faults"}},
	})
	if err != nil {
		run.Err = err
		return run
	}
	run.Complete = true
	if len(res.Choices) > 0 {
		run.Text = res.Choices[0].Message.Content
	}
	return run
}

func openAIGoComplete(ctx context.Context, baseURL, key string) (run sdkRun) {
	run.SDK = "openai-go"
	cp := &capture{}
	defer cp.finish(&run)
	client := openaigo.NewClient(option.WithBaseURL(baseURL+"/v1"), option.WithAPIKey("e2e-client-key"),
		option.WithHTTPClient(&http.Client{Transport: cp}), option.WithMaxRetries(0))
	res, err := client.Chat.Completions.New(ctx, openaigo.ChatCompletionNewParams{
		Model:    "gpt-4o-mini",
		Messages: []openaigo.ChatCompletionMessageParamUnion{openaigo.UserMessage("faults")},
	}, option.WithHeader("Idempotency-Key", key))
	if err != nil {
		run.Err = err
		return run
	}
	run.Complete = true
	if len(res.Choices) > 0 {
		run.Text = res.Choices[0].Message.Content
	}
	return run
}

// capture is an http.RoundTripper that sets fixed headers (as an
// application sets Idempotency-Key) and keeps a copy of the response body
// as the SDK reads it.
type capture struct {
	hdr map[string]string

	mu       sync.Mutex
	status   int
	replayed bool
	body     *tee
}

func (c *capture) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range c.hdr {
		r.Header.Set(k, v)
	}
	res, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status = res.StatusCode
	c.replayed = res.Header.Get("Idempotent-Replayed") == "true"
	c.body = &tee{rc: res.Body}
	res.Body = c.body
	return res, nil
}

// finish fills in what the transport saw. For a complete run it first
// reads what the SDK left unread after [DONE], so Raw is the whole body.
func (c *capture) finish(r *sdkRun) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r.Status, r.Replayed = c.status, c.replayed
	if c.body == nil {
		return
	}
	if r.Complete {
		_, _ = io.Copy(io.Discard, c.body)
	}
	r.Raw = c.body.copy()
}

type tee struct {
	rc  io.ReadCloser
	mu  sync.Mutex
	buf bytes.Buffer
}

func (t *tee) Read(p []byte) (int, error) {
	n, err := t.rc.Read(p)
	t.mu.Lock()
	t.buf.Write(p[:n])
	t.mu.Unlock()
	return n, err
}

func (t *tee) Close() error { return t.rc.Close() }

func (t *tee) copy() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return bytes.Clone(t.buf.Bytes())
}

func goOpenAIStream(ctx context.Context, baseURL, key string, got func(string)) (run sdkRun) {
	run.SDK = "go-openai"
	cp := &capture{hdr: map[string]string{"Idempotency-Key": key}}
	defer cp.finish(&run)
	cfg := goopenai.DefaultConfig("e2e-client-key")
	cfg.BaseURL = baseURL + "/v1"
	cfg.HTTPClient = &http.Client{Transport: cp}
	st, err := goopenai.NewClientWithConfig(cfg).CreateChatCompletionStream(ctx, goopenai.ChatCompletionRequest{
		Model:         "gpt-4o-mini",
		Messages:      []goopenai.ChatCompletionMessage{{Role: goopenai.ChatMessageRoleUser, Content: "faults"}},
		StreamOptions: &goopenai.StreamOptions{IncludeUsage: true},
	})
	if err != nil {
		run.Err = err
		return run
	}
	defer st.Close()
	var text strings.Builder
	for {
		chunk, err := st.Recv()
		if errors.Is(err, io.EOF) {
			run.Complete, run.Text = true, text.String()
			return run
		}
		if err != nil {
			run.Err, run.Text = err, text.String()
			return run
		}
		for _, ch := range chunk.Choices {
			text.WriteString(ch.Delta.Content)
			if got != nil && ch.Delta.Content != "" {
				got(ch.Delta.Content)
			}
		}
	}
}

func openAIGoStream(ctx context.Context, baseURL, key string, got func(string)) (run sdkRun) {
	run.SDK = "openai-go"
	cp := &capture{}
	defer cp.finish(&run)
	client := openaigo.NewClient(
		option.WithBaseURL(baseURL+"/v1"),
		option.WithAPIKey("e2e-client-key"),
		option.WithHTTPClient(&http.Client{Transport: cp}),
		// The fault tests count runs: the SDK's own retries would hide them.
		option.WithMaxRetries(0),
	)
	st := client.Chat.Completions.NewStreaming(ctx, openaigo.ChatCompletionNewParams{
		Model:         "gpt-4o-mini",
		Messages:      []openaigo.ChatCompletionMessageParamUnion{openaigo.UserMessage("faults")},
		StreamOptions: openaigo.ChatCompletionStreamOptionsParam{IncludeUsage: openaigo.Bool(true)},
	}, option.WithHeader("Idempotency-Key", key))
	defer st.Close()
	var text strings.Builder
	for st.Next() {
		for _, ch := range st.Current().Choices {
			text.WriteString(ch.Delta.Content)
			if got != nil && ch.Delta.Content != "" {
				got(ch.Delta.Content)
			}
		}
	}
	run.Text = text.String()
	if err := st.Err(); err != nil {
		run.Err = err
		return run
	}
	run.Complete = true
	return run
}
