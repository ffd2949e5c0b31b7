// Command recipe runs the openai-go recipe once, for e2e/recipes_test.go:
//
//	recipe [-op stream|response|response-stream] ORDER-ID TEXT [X-LLMGATE-DEADLINE]
//
// against llmgate at $LLMGATE_BASE_URL with the client key
// $LLMGATE_API_KEY, and prints one JSON line: what the SDK returned. With
// no -op it is Summarize; stream is SummarizeStream, response
// SummarizeResponse, response-stream SummarizeResponseStream.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"

	"github.com/llmgate/llmgate/e2e/recipes/openaigo"
)

// result is the line printed; e2e/recipes_test.go reads the same fields
// from every client's driver. For a stream, id is the stream's (the
// chunks' id, the response's), content the text its deltas assemble, and
// raw its events' JSON as the SDK decoded them, one a line.
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
	op := flag.String("op", "", "stream, response or response-stream; empty: the chat completion")
	flag.Parse()
	args := flag.Args()
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: recipe [-op stream|response|response-stream] ORDER-ID TEXT [X-LLMGATE-DEADLINE]")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openaigo.NewClient(os.Getenv("LLMGATE_BASE_URL"), os.Getenv("LLMGATE_API_KEY"))
	var res *http.Response
	opts := []option.RequestOption{option.WithResponseInto(&res)}
	if len(args) > 2 {
		opts = append(opts, option.WithHeader("X-Llmgate-Deadline", args[2]))
	}
	start := time.Now()
	out, err := run(ctx, client, *op, args[0], args[1], opts)
	out.Ms = time.Since(start).Milliseconds()
	var apiErr *openai.Error
	switch {
	case err == nil:
		out.OK = true
		if res != nil {
			out.Replayed = res.Header.Get("Idempotent-Replayed")
		}
	case errors.As(err, &apiErr):
		out.Status, out.Code, out.Message = apiErr.StatusCode, apiErr.Code, apiErr.Message
	default:
		out.Message = err.Error()
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(1)
	}
}

// run makes the recipe's call op and reports what it returned.
func run(ctx context.Context, client openai.Client, op, orderID, text string, opts []option.RequestOption) (result, error) {
	var out result
	switch op {
	case "":
		completion, err := openaigo.Summarize(ctx, client, orderID, text, opts...)
		if err != nil {
			return out, err
		}
		out.ID, out.Raw = completion.ID, completion.RawJSON()
		if len(completion.Choices) > 0 {
			out.Content = completion.Choices[0].Message.Content
		}
	case "stream":
		return drain(openaigo.SummarizeStream(ctx, client, orderID, text, opts...), func(c openai.ChatCompletionChunk) (string, string) {
			if len(c.Choices) == 0 {
				return c.ID, ""
			}
			return c.ID, c.Choices[0].Delta.Content
		})
	case "response":
		response, err := openaigo.SummarizeResponse(ctx, client, orderID, text, opts...)
		if err != nil {
			return out, err
		}
		out.ID, out.Content, out.Raw = response.ID, response.OutputText(), response.RawJSON()
	case "response-stream":
		return drain(openaigo.SummarizeResponseStream(ctx, client, orderID, text, opts...), func(e responses.ResponseStreamEventUnion) (string, string) {
			return e.Response.ID, e.Delta
		})
	default:
		return out, fmt.Errorf("unknown -op %q", op)
	}
	return out, nil
}

// event is a streamed value that keeps its JSON.
type event interface{ RawJSON() string }

// drain reads a stream to its end: the id and text part of each event by
// part, the events' JSON one a line.
func drain[E event](s *ssestream.Stream[E], part func(E) (id, text string)) (result, error) {
	defer s.Close()
	var out result
	var content, raw strings.Builder
	for s.Next() {
		ev := s.Current()
		id, text := part(ev)
		if out.ID == "" {
			out.ID = id
		}
		content.WriteString(text)
		raw.WriteString(ev.RawJSON() + "\n")
	}
	out.Content, out.Raw = content.String(), raw.String()
	return out, s.Err()
}
