package demo_test

import (
	"context"
	"errors"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/llmgate/llmgate/cmd/gateway/demo"
)

// The simulated upstream speaks Anthropic's Messages API on /v1/messages,
// as the official Go SDK reads it: a message, a stream its accumulator
// rebuilds, and the claude-demo-* models failing as the demo-* ones do, in
// Anthropic's error shape.
func TestMessages(t *testing.T) {
	_, srv := start(t, demo.Options{DemoModels: true})
	c := anthropic.NewClient(aoption.WithBaseURL(srv.URL), aoption.WithAPIKey("demo"), aoption.WithMaxRetries(0))
	params := func(model string) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{Model: anthropic.Model(model), MaxTokens: 64,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hello"))}}
	}
	ctx := context.Background()
	msg, err := c.Messages.New(ctx, params("claude-sonnet-4-5"))
	if err != nil {
		t.Fatal(err)
	}
	const said = "This is llmgate's simulated upstream. You said: Hello"
	if len(msg.Content) != 1 || msg.Content[0].Text != said || msg.StopReason != "end_turn" || msg.Usage.InputTokens == 0 {
		t.Errorf("message: %+v", msg)
	}

	stream := c.Messages.NewStreaming(ctx, params("claude-sonnet-4-5"))
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil || len(acc.Content) != 1 || acc.Content[0].Text != said || acc.StopReason != "end_turn" {
		t.Errorf("stream: %+v %v", acc, err)
	}

	if m, err := c.Messages.New(ctx, params("claude-demo-filtered")); err != nil || m.StopReason != "refusal" {
		t.Errorf("claude-demo-filtered: %+v %v", m, err)
	}
	if m, err := c.Messages.New(ctx, params("claude-demo-empty")); err != nil || len(m.Content) != 0 {
		t.Errorf("claude-demo-empty: %+v %v", m, err)
	}
	_, err = c.Messages.New(ctx, params("claude-demo-ratelimited"))
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 429 || ae.Type() != "rate_limit_error" || ae.Response.Header.Get("Retry-After") != "1" {
		t.Errorf("claude-demo-ratelimited: %v", err)
	}

	cut := c.Messages.NewStreaming(ctx, params("claude-demo-cut"))
	n := 0
	for cut.Next() {
		n++
	}
	if cut.Err() == nil && n > 5 {
		t.Errorf("claude-demo-cut: %d events, want the stream cut after 5", n)
	}
}
