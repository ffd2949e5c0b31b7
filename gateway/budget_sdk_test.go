package gateway

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	antoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	openaigo "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmgate/llmgate/config"
)

// The official Go SDKs, left at their default retries (2), make exactly
// one HTTP call against a spent budget: the 429 says x-should-retry:
// false, so neither retries it.
func TestBudgetSDKsDoNotRetry(t *testing.T) {
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	h := newHarness(t, budgeted(srv.URL, config.Budget{Window: config.WindowDay, Tokens: 250}))
	if r := h.chat(budgetChat, alice); r.status != 200 { // spends it all
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	ctx := context.Background()

	ct := &countingTransport{next: http.DefaultTransport}
	oc := openaigo.NewClient(option.WithBaseURL(h.srv.URL+"/v1"), option.WithAPIKey("key-alice"),
		option.WithHTTPClient(&http.Client{Transport: ct, Timeout: requestLimit}))
	_, err := oc.Chat.Completions.New(ctx, openaigo.ChatCompletionNewParams{Model: "gpt-4o-mini", MaxTokens: openaigo.Int(10),
		Messages: []openaigo.ChatCompletionMessageParamUnion{openaigo.UserMessage("Hi")}})
	var oe *openaigo.Error
	if !errors.As(err, &oe) || oe.StatusCode != 429 || oe.Code != "budget_exceeded" {
		t.Fatalf("openai-go: err = %v, want its 429 budget_exceeded", err)
	}
	if n := ct.n.Load(); n != 1 {
		t.Errorf("openai-go made %d HTTP calls, want 1", n)
	}

	at := &countingTransport{next: http.DefaultTransport}
	ac := anthropic.NewClient(antoption.WithBaseURL(h.srv.URL), antoption.WithAPIKey("key-alice"),
		antoption.WithHTTPClient(&http.Client{Transport: at, Timeout: requestLimit}))
	_, err = ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-x", MaxTokens: 10,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hi"))}})
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 429 || ae.Type() != "rate_limit_error" {
		t.Fatalf("anthropic-sdk-go: err = %v, want its 429 rate_limit_error", err)
	}
	if n := at.n.Load(); n != 1 {
		t.Errorf("anthropic-sdk-go made %d HTTP calls, want 1", n)
	}
	if n := up.calls.Load(); n != 1 {
		t.Errorf("provider calls = %d, want 1 (the first request's)", n)
	}
}
