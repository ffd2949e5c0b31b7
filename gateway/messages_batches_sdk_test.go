package gateway

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// batchSDK is the official Go SDK pointed at the gateway with the gateway
// key gwKey, no retries of its own.
func (h *messagesHarness) batchSDK(gwKey string) anthropic.Client {
	return anthropic.NewClient(option.WithBaseURL(h.srv.URL), option.WithAPIKey(gwKey),
		option.WithHTTPClient(&http.Client{Timeout: requestLimit}), option.WithMaxRetries(0))
}

// TestMessageBatchesSDK: the official Go SDK's Messages.Batches.New, Get,
// ResultsStreaming, Cancel and Delete work through the gateway: the
// batch's ResultsURL is the gateway's, its results are the provider's;
// another tenant's Get of it is the SDK's own 404 error, of type
// not_found_error, and never reaches the provider.
func TestMessageBatchesSDK(t *testing.T) {
	h := newBatchesHarness(t)
	ctx := context.Background()
	c := h.batchSDK(aliceBatchKey)
	params := func(id string) anthropic.MessageBatchNewParamsRequest {
		return anthropic.MessageBatchNewParamsRequest{CustomID: id, Params: anthropic.MessageBatchNewParamsRequestParams{
			Model: "claude-sonnet-4-5", MaxTokens: 64, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hello"))}}}
	}
	b, err := c.Messages.Batches.New(ctx, anthropic.MessageBatchNewParams{Requests: []anthropic.MessageBatchNewParamsRequest{params("one"), params("two")}})
	if err != nil {
		t.Fatalf("Batches.New: %v", err)
	}
	if b.ResultsURL != h.gatewayResults(b.ID) {
		t.Errorf("ResultsURL %q, want the gateway's %q", b.ResultsURL, h.gatewayResults(b.ID))
	}
	got, err := c.Messages.Batches.Get(ctx, b.ID, anthropic.MessageBatchGetParams{})
	if err != nil || got.ID != b.ID || got.ResultsURL != b.ResultsURL || got.RequestCounts.Succeeded != 2 {
		t.Fatalf("Batches.Get: %+v, %v", got, err)
	}
	stream := c.Messages.Batches.ResultsStreaming(ctx, b.ID, anthropic.MessageBatchResultsParams{})
	var ids []string
	for stream.Next() {
		r := stream.Current()
		if r.Result.Type != "succeeded" || len(r.Result.Message.Content) != 1 || r.Result.Message.Content[0].Text != "Hello from the fake Anthropic provider." {
			t.Errorf("result %s: %s", r.CustomID, r.RawJSON())
		}
		ids = append(ids, r.CustomID)
	}
	if err := stream.Err(); err != nil || len(ids) != 2 || ids[0] != "one" || ids[1] != "two" {
		t.Fatalf("ResultsStreaming: %v, %v", ids, err)
	}
	calls := h.ant.Calls()
	bob := h.batchSDK(bobBatchKey)
	_, err = bob.Messages.Batches.Get(ctx, b.ID, anthropic.MessageBatchGetParams{})
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusNotFound || ae.Type() != "not_found_error" {
		t.Fatalf("bob's Get of alice's batch: %v, want the SDK's 404 not_found_error", err)
	}
	if n := h.ant.Calls(); n != calls {
		t.Errorf("bob's Get reached the upstream")
	}
	canceled, err := c.Messages.Batches.Cancel(ctx, b.ID, anthropic.MessageBatchCancelParams{})
	if err != nil || canceled.ProcessingStatus != "canceling" || canceled.ResultsURL != b.ResultsURL {
		t.Fatalf("Batches.Cancel: %+v, %v", canceled, err)
	}
	deleted, err := c.Messages.Batches.Delete(ctx, b.ID, anthropic.MessageBatchDeleteParams{})
	if err != nil || deleted.ID != b.ID {
		t.Fatalf("Batches.Delete: %+v, %v", deleted, err)
	}
}
