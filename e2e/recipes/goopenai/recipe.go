// Package goopenai is llmgate's recipe for github.com/sashabaranov/go-openai:
// a base URL, an Idempotency-Key per call, and the one retry go-openai
// lacks. The README's "Go (go-openai)" section is this file, and
// e2e/recipes_test.go runs it against the real gateway.
//
// go-openai has no per-request headers, so the key travels in the call's
// context and a RoundTripper sets it. go-openai never retries, so Keyed
// retries — with the same key — exactly when llmgate answers
// x-should-retry: true (a 409 idempotency_key_in_flight, a 504
// client_deadline_exceeded, a 429 client rate or concurrency limit), after
// its Retry-After. Every other failure llmgate has already retried, or it
// is permanent, and Keyed returns it as go-openai reported it.
package goopenai

import (
	"context"
	"net/http"
	"strconv"
	"time"

	openai "github.com/sashabaranov/go-openai"
)

// MaxTries bounds Keyed's attempts, as the official SDKs' two retries do.
const MaxTries = 3

// NewClient returns a go-openai client for llmgate at baseURL (its /v1
// URL, e.g. http://127.0.0.1:8080/v1) whose calls carry the key Keyed
// gives them.
func NewClient(baseURL, apiKey string) *openai.Client {
	cfg := openai.DefaultConfig(apiKey)
	cfg.BaseURL = baseURL
	cfg.HTTPClient = &http.Client{Transport: Transport{Next: http.DefaultTransport}}
	return openai.NewClientWithConfig(cfg)
}

// Transport sets the Idempotency-Key of a call made under Keyed, and notes
// what llmgate said about retrying it. Wrap your own transport with it if
// you have one.
type Transport struct{ Next http.RoundTripper }

type callKey struct{}

// call is one Keyed call: its key, and llmgate's x-should-retry and
// Retry-After on the last answer. go-openai calls RoundTrip on the
// caller's goroutine, so Keyed reads what RoundTrip wrote without a lock.
type call struct {
	key         string
	shouldRetry bool
	retryAfter  time.Duration
}

// RoundTrip implements http.RoundTripper.
func (t Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	c, ok := r.Context().Value(callKey{}).(*call)
	if !ok {
		return t.Next.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Idempotency-Key", c.key)
	res, err := t.Next.RoundTrip(r)
	if err == nil {
		c.shouldRetry = res.Header.Get("X-Should-Retry") == "true"
		secs, _ := strconv.Atoi(res.Header.Get("Retry-After"))
		c.retryAfter = time.Duration(secs) * time.Second
	}
	return res, err
}

// Keyed runs fn — one go-openai call made with the ctx it is given — under
// the Idempotency-Key key, and again with the same key when llmgate says
// x-should-retry: true, up to MaxTries times.
func Keyed[T any](ctx context.Context, key string, fn func(context.Context) (T, error)) (T, error) {
	c := &call{key: key}
	ctx = context.WithValue(ctx, callKey{}, c)
	for try := 1; ; try++ {
		c.shouldRetry, c.retryAfter = false, 0
		res, err := fn(ctx)
		if err == nil || !c.shouldRetry || try == MaxTries {
			return res, err
		}
		t := time.NewTimer(c.retryAfter)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return res, err
		}
	}
}
