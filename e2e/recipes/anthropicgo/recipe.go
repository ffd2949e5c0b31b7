// Package anthropicgo is llmgate's recipe for the official Anthropic Go
// SDK (github.com/anthropics/anthropic-sdk-go/v2): the gateway as the base
// URL, the gateway key as the API key, and an Idempotency-Key per call.
// The README's "Go (anthropic-sdk-go)" recipe is this file;
// e2e/recipes_anthropic_test.go runs it against the real gateway.
package anthropicgo

import (
	"context"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// NewClient points the SDK at llmgate. baseURL is the gateway's root
// (http://127.0.0.1:8080), not .../v1: the SDK appends /v1/messages
// itself. apiKey is the gateway key llmgate gave you — v2 sends it as
// Authorization: Bearer, which llmgate takes like x-api-key — never the
// provider's key, which stays in the gateway's config.
//
// Leave the SDK's retries on (two by default): it obeys x-should-retry
// before any status rule. llmgate says true only where a retry with the
// same key is right (a key still in flight, a client deadline); every
// failure it has already retried upstream says false, so the SDK raises at
// once instead of multiplying the gateway's attempts.
func NewClient(baseURL, apiKey string, opts ...option.RequestOption) anthropic.Client {
	return anthropic.NewClient(append([]option.RequestOption{
		option.WithBaseURL(baseURL), option.WithAPIKey(apiKey),
	}, opts...)...)
}

// Key names the business operation, not the attempt: the SDK resends the
// same headers on its retries, and a caller that runs the step again (after
// a crash, from a queue) must derive the same key to get the same answer.
func Key(orderID string) string { return "order-" + orderID + "/summarize" }

func summaryParams(text string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model: "claude-sonnet-4-5", MaxTokens: 256,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Summarize: " + text))},
	}
}

// Summarize asks for one message under the order's key. Errors are
// *anthropic.Error (StatusCode, Type()), llmgate's own in Anthropic's
// shape too. Add option.WithResponseInto(&res) to see
// Idempotent-Replayed: true on an answer replayed from the gateway's store.
func Summarize(ctx context.Context, client anthropic.Client, orderID, text string, opts ...option.RequestOption) (*anthropic.Message, error) {
	opts = append([]option.RequestOption{option.WithHeader("Idempotency-Key", Key(orderID))}, opts...)
	return client.Messages.New(ctx, summaryParams(text), opts...)
}

// SummarizeStream streams the same call and accumulates it into the whole
// message. A keyed stream that llmgate replays is the committed stream,
// byte for byte. A stream that fails mid-way ends in an error event from
// llmgate, never a clean end, so stream.Err() is set and a short message
// is never returned as complete; calling again with the same key runs it
// again (a failed stream is not committed).
func SummarizeStream(ctx context.Context, client anthropic.Client, orderID, text string, opts ...option.RequestOption) (anthropic.Message, error) {
	opts = append([]option.RequestOption{option.WithHeader("Idempotency-Key", Key(orderID))}, opts...)
	stream := client.Messages.NewStreaming(ctx, summaryParams(text), opts...)
	defer stream.Close()
	var msg anthropic.Message
	for stream.Next() {
		if err := msg.Accumulate(stream.Current()); err != nil {
			return msg, err
		}
	}
	return msg, stream.Err()
}
