// Command workflow is the README's "Resuming a workflow, end to end": a
// three-step LLM workflow — outline, draft, review, each step's prompt
// built from the answer before it — whose calls carry Idempotency-Keys
// derived from the workflow id and the step name, wf-<id>/<step>.
//
// It keeps nothing between runs. Kill it mid-way and run it again with the
// same -id: the steps that finished are answered from llmgate's store,
// byte for byte (Idempotent-Replayed: true, no upstream call); the step
// that was running when it died gets the answer of the call that went on
// without it; the rest run once. Because a replayed answer is the same
// bytes, the next step's prompt is the same too, so its key still matches
// its body (a different body would be a 422).
//
//	go run ./cmd/gateway -demo &
//	go run ./e2e/workflow -id 42 -pause 5s    # kill -9 it during a pause
//	go run ./e2e/workflow -id 42              # resumes: replayed=true, then the rest
//
// Each step prints "wf-<id>/<step> calling" before its call and
// "wf-<id>/<step> done replayed=... bytes=... sha256=..." after it, the
// digest being of the exact answer bytes received; e2e/recipes_workflow_test.go
// kills it with SIGKILL after a "calling" line and checks the rest.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/llmgate/llmgate/e2e/recipes/goopenai"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "workflow:", err)
		os.Exit(1)
	}
}

// steps are the workflow: each prompt takes the answer of the step before
// (the first, the topic).
var steps = []struct{ name, prompt string }{
	{"outline", "Write a three-point outline about %s."},
	{"draft", "Write a short draft from this outline:\n\n%s"},
	{"review", "Review this draft and name its two weakest sentences:\n\n%s"},
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("workflow", flag.ContinueOnError)
	fs.SetOutput(stderr)
	baseURL := getenv("LLMGATE_BASE_URL")
	if baseURL == "" {
		baseURL = "http://127.0.0.1:8080/v1"
	}
	fs.StringVar(&baseURL, "base-url", baseURL, "llmgate's /v1 URL (env LLMGATE_BASE_URL)")
	apiKey := fs.String("api-key", getenv("LLMGATE_API_KEY"), "a client key of the gateway; any value when it has no clients (env LLMGATE_API_KEY)")
	id := fs.String("id", "", "the workflow's id: run again with the same id to resume it")
	topic := fs.String("topic", "retrying LLM calls safely", "what the workflow writes about")
	model := fs.String("model", "gpt-4o-mini", "the model every step asks")
	pause := fs.Duration("pause", 0, "wait this long after each step, to leave time to kill it by hand")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *id == "" {
		return errors.New("-id is required")
	}
	if *apiKey == "" {
		*apiKey = "none"
	}

	// The recipe's client (e2e/recipes/goopenai), with one more transport
	// under it that notes a digest of each answer's bytes.
	cfg := openai.DefaultConfig(*apiKey)
	cfg.BaseURL = baseURL
	cfg.HTTPClient = &http.Client{Transport: goopenai.Transport{Next: digestTransport{http.DefaultTransport}}}
	client := openai.NewClientWithConfig(cfg)

	answer := *topic
	for i, st := range steps {
		key := "wf-" + *id + "/" + st.name
		fmt.Fprintf(stdout, "%s calling\n", key)
		d := &digest{}
		resp, err := goopenai.Keyed(context.WithValue(ctx, digestKey{}, d), key,
			func(ctx context.Context) (openai.ChatCompletionResponse, error) {
				return client.CreateChatCompletion(ctx, openai.ChatCompletionRequest{
					Model:    *model,
					Messages: []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: fmt.Sprintf(st.prompt, answer)}},
				})
			})
		if err != nil {
			return fmt.Errorf("step %s (key %s): %w", st.name, key, err)
		}
		if len(resp.Choices) == 0 {
			return fmt.Errorf("step %s (key %s): an answer without choices", st.name, key)
		}
		answer = resp.Choices[0].Message.Content
		fmt.Fprintf(stdout, "%s done replayed=%t bytes=%d sha256=%s\n",
			key, resp.Header().Get("Idempotent-Replayed") == "true", d.size, d.sum)
		if *pause > 0 && i < len(steps)-1 {
			fmt.Fprintf(stdout, "wf-%s pausing %s\n", *id, *pause)
			select {
			case <-time.After(*pause):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	fmt.Fprintf(stdout, "wf-%s finished\n", *id)
	return nil
}

type digestKey struct{}

// digest is the size and SHA-256 of the last answer's body.
type digest struct {
	size int
	sum  string
}

// digestTransport reads each answer's body whole, notes its digest in the
// request context's *digest, and hands the same bytes on. go-openai calls
// it on the caller's goroutine, so the caller reads the digest without a
// lock.
type digestTransport struct{ next http.RoundTripper }

func (t digestTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := t.next.RoundTrip(r)
	d, ok := r.Context().Value(digestKey{}).(*digest)
	if err != nil || !ok {
		return res, err
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	d.size, d.sum = len(body), hex.EncodeToString(sum[:])
	res.Body = io.NopCloser(bytes.NewReader(body))
	return res, nil
}
