// Command recipe runs the openai-go recipe once, for e2e/recipes_test.go:
//
//	recipe ORDER-ID TEXT [X-LLMGATE-DEADLINE]
//
// against llmgate at $LLMGATE_BASE_URL with the client key
// $LLMGATE_API_KEY, and prints one JSON line: what the SDK returned.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmgate/llmgate/e2e/recipes/openaigo"
)

// result is the line printed; e2e/recipes_test.go reads the same fields
// from every client's driver.
type result struct {
	OK       bool   `json:"ok"`
	ID       string `json:"id,omitempty"`
	Content  string `json:"content,omitempty"`
	Raw      string `json:"raw,omitempty"`
	Replayed string `json:"replayed,omitempty"`
	Status   int    `json:"status,omitempty"`
	Code     string `json:"code,omitempty"`
	Message  string `json:"message,omitempty"`
	Ms       int64  `json:"ms"`
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: recipe ORDER-ID TEXT [X-LLMGATE-DEADLINE]")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openaigo.NewClient(os.Getenv("LLMGATE_BASE_URL"), os.Getenv("LLMGATE_API_KEY"))
	var res *http.Response
	opts := []option.RequestOption{option.WithResponseInto(&res)}
	if len(os.Args) > 3 {
		opts = append(opts, option.WithHeader("X-Llmgate-Deadline", os.Args[3]))
	}
	start := time.Now()
	completion, err := openaigo.Summarize(ctx, client, os.Args[1], os.Args[2], opts...)
	out := result{Ms: time.Since(start).Milliseconds()}
	var apiErr *openai.Error
	switch {
	case err == nil:
		out.OK, out.ID, out.Raw = true, completion.ID, completion.RawJSON()
		if len(completion.Choices) > 0 {
			out.Content = completion.Choices[0].Message.Content
		}
		out.Replayed = res.Header.Get("Idempotent-Replayed")
	case errors.As(err, &apiErr):
		out.Status, out.Code, out.Message = apiErr.StatusCode, apiErr.Code, apiErr.Message
	default:
		out.Message = err.Error()
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(1)
	}
}
