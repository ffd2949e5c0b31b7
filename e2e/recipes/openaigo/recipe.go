// Package openaigo is llmgate's recipe for the official Go SDK,
// github.com/openai/openai-go: a base URL, and an Idempotency-Key per call.
// The README's "Go (openai-go)" section is this file, and
// e2e/recipes_test.go runs it (through cmd/recipe) against the real gateway.
//
// It is a module of its own so that llmgate's go.mod does not take on
// openai-go for an example.
package openaigo

import (
	"context"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
)

// NewClient returns a client for llmgate at baseURL (its /v1 URL, e.g.
// http://127.0.0.1:8080/v1). Leave the SDK's retries on (two by default):
// it retries exactly when llmgate answers x-should-retry: true — a 409
// idempotency_key_in_flight, a 504 client_deadline_exceeded — after
// Retry-After, resending the same headers and so the same key. Every other
// failure llmgate has already retried, or it is permanent; it says
// x-should-retry: false, and the SDK returns it at once.
func NewClient(baseURL, apiKey string) openai.Client {
	return openai.NewClient(option.WithBaseURL(baseURL), option.WithAPIKey(apiKey))
}

// Summarize asks for a summary of text under the key order-<id>/summarize:
// the same order summarized twice is one upstream call, and the second
// answer is the first, byte for byte. opts are more per-call options
// (another header, option.WithResponseInto, ...).
func Summarize(ctx context.Context, client openai.Client, orderID, text string, opts ...option.RequestOption) (*openai.ChatCompletion, error) {
	return client.Chat.Completions.New(ctx, chatParams(text), keyed(orderID, "summarize", opts)...)
}

// SummarizeStream is the same call streamed, under a key of its own
// (order-<id>/summarize-stream: the same key with another body is a 422).
// The same order streamed twice is one upstream call, and the second
// stream is the first, byte for byte, from llmgate's store. Read it with
// stream.Next() and stream.Current(); check stream.Err() at the end (a
// stream that fails mid-way ends in an error, and is not committed).
func SummarizeStream(ctx context.Context, client openai.Client, orderID, text string, opts ...option.RequestOption) *ssestream.Stream[openai.ChatCompletionChunk] {
	return client.Chat.Completions.NewStreaming(ctx, chatParams(text), keyed(orderID, "summarize-stream", opts)...)
}

// SummarizeResponse asks the Responses API (order-<id>/summarize-response);
// a replay is the same response, the same id.
func SummarizeResponse(ctx context.Context, client openai.Client, orderID, text string, opts ...option.RequestOption) (*responses.Response, error) {
	return client.Responses.New(ctx, responseParams(text), keyed(orderID, "summarize-response", opts)...)
}

// SummarizeResponseStream is SummarizeResponse streamed
// (order-<id>/summarize-response-stream): typed events, replayed byte for
// byte under the key.
func SummarizeResponseStream(ctx context.Context, client openai.Client, orderID, text string, opts ...option.RequestOption) *ssestream.Stream[responses.ResponseStreamEventUnion] {
	return client.Responses.NewStreaming(ctx, responseParams(text), keyed(orderID, "summarize-response-stream", opts)...)
}

// keyed puts the key order-<id>/<op> first, so the caller's options come
// after it.
func keyed(orderID, op string, opts []option.RequestOption) []option.RequestOption {
	return append([]option.RequestOption{option.WithHeader("Idempotency-Key", "order-"+orderID+"/"+op)}, opts...)
}

func chatParams(text string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    openai.ChatModelGPT4oMini,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Summarize: " + text)},
	}
}

func responseParams(text string) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model: openai.ChatModelGPT4oMini,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Summarize: " + text)},
	}
}
