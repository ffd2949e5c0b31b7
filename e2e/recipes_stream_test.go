package e2e

// Issue 25: every client's streaming call — a chat completions stream, and
// the Responses API's stream where the client has one — and its Responses
// call, run as its recipe (e2e/recipes/) writes them, through one suite,
// recipeStreamSuite. For each call:
//
//   - the same key twice is one upstream call (the fake counts the calls
//     under the key the gateway forwards), and the second answer is the
//     first: the bytes the client received, as a recording proxy in front
//     of the gateway saw them, are byte-identical, and so is what the
//     client made of them (its id, the assembled text, the chunks or
//     events as the client decoded them);
//   - the same body under another key is another upstream call with other
//     bytes and another id, so the comparisons above can fail.
//
// The Anthropic recipes' streams are checked the same way by
// recipes_anthropic_test.go.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/e2e/recipes/goopenai"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

// recipeOpRunner runs one of a client's streaming or Responses calls: op
// is "stream" (chat completions, streamed), "response" (the Responses
// API) or "response-stream", under recipeOpKey(orderID, op).
type recipeOpRunner func(op, orderID, text string) (recipeResult, error)

// recipeStreamRecordBytes is the stream suite's idempotency.max_record_bytes.
const recipeStreamRecordBytes = 1 << 20

// recipeOpEndpoint is the path each op calls.
var recipeOpEndpoint = map[string]string{
	"stream":          "/v1/chat/completions",
	"response":        "/v1/responses",
	"response-stream": "/v1/responses",
}

// recipeOpKey is the key the recipes derive for op: order-<id>/summarize-<op>.
func recipeOpKey(orderID, op string) string { return "order-" + orderID + "/summarize-" + op }

// upstreamCallsAt counts the calls that reached the fake at endpoint
// under the key the gateway forwards for the recipe client's key.
func (g *recipeGateway) upstreamCallsAt(endpoint, key string) int {
	fwd := idempotency.ForwardKey(nil, cache.Key{Scope: recipeClient, Endpoint: endpoint, ID: key})
	n := 0
	for _, r := range g.fake.Requests() {
		if r.Path == endpoint && r.Header.Get("Idempotency-Key") == fwd {
			n++
		}
	}
	return n
}

// recipeStreamSuite runs each of ops through a client's recipe (see the
// top of the file), on a gateway of its own behind a recording proxy; the
// client is given the proxy's /v1 URL as g.base. The gateway stores
// answers up to recipeStreamRecordBytes: a Responses stream repeats its
// text in its done events and its final response, ~5 KB for the fake's
// short answer, past recipeRecordBytes.
func recipeStreamSuite(t *testing.T, ops []string, newRunner func(g *recipeGateway) recipeOpRunner) {
	g := startRecipeGatewayRecording(t, recipeStreamRecordBytes)
	rp := &recordingProxy{target: g.url}
	rp.idle.L = &rp.mu
	front := httptest.NewServer(rp)
	t.Cleanup(front.Close)
	g.base = front.URL + "/v1"
	run := newRunner(g)
	for _, op := range ops {
		t.Run(op, func(t *testing.T) { checkRecipeOpReplay(t, g, rp, run, op) })
	}
}

// checkRecipeOpReplay runs op twice under one key, then once under another.
func checkRecipeOpReplay(t *testing.T, g *recipeGateway, rp *recordingProxy, run recipeOpRunner, op string) {
	must := func(orderID string, text string) recipeResult {
		t.Helper()
		r, err := run(op, orderID, text)
		if err != nil {
			t.Fatal(err)
		}
		if !r.OK || r.ID == "" || r.Content == "" {
			t.Fatalf("%s under %s: %+v", op, recipeOpKey(orderID, op), r)
		}
		return r
	}
	text := "the order to " + op + " twice"
	first, second := must(op, text), must(op, text)
	if second.ID != first.ID || second.Content != first.Content || second.Raw != first.Raw {
		t.Fatalf("the replay differs:\nfirst  %+v\nsecond %+v", first, second)
	}
	if first.Replayed == "true" || second.Replayed != "" && second.Replayed != "true" {
		t.Errorf("Idempotent-Replayed as the client saw it: first %q, second %q", first.Replayed, second.Replayed)
	}
	calls := rp.callsFor(text)
	if len(calls) != 2 || len(calls[0].Answer) == 0 || !bytes.Equal(calls[0].Answer, calls[1].Answer) {
		t.Fatalf("%d client calls; the answers' bytes:\n%s", len(calls), recipeAnswers(calls))
	}
	if calls[0].Header.Get("Idempotent-Replayed") != "" || calls[1].Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("Idempotent-Replayed: first %q, second %q", calls[0].Header.Get("Idempotent-Replayed"), calls[1].Header.Get("Idempotent-Replayed"))
	}
	want := "application/json"
	if strings.HasSuffix(op, "stream") {
		want = "text/event-stream"
	}
	if ct := calls[1].Header.Get("Content-Type"); !strings.HasPrefix(ct, want) {
		t.Errorf("the replay's Content-Type is %q, want %s", ct, want)
	}
	endpoint := recipeOpEndpoint[op]
	if n := g.upstreamCallsAt(endpoint, recipeOpKey(op, op)); n != 1 {
		t.Errorf("upstream calls under the key = %d, want 1", n)
	}

	other := must(op+"-other", text)
	calls = rp.callsFor(text)
	if len(calls) != 3 || bytes.Equal(calls[2].Answer, calls[0].Answer) || other.ID == first.ID || other.Raw == first.Raw {
		t.Fatalf("another key, the same body: %d client calls, id %q (first %q); the answers' bytes:\n%s",
			len(calls), other.ID, first.ID, recipeAnswers(calls))
	}
	if n := g.upstreamCallsAt(endpoint, recipeOpKey(op+"-other", op)); n != 1 {
		t.Errorf("upstream calls under the other key = %d, want 1", n)
	}
	t.Logf("%s: %d bytes replayed byte-identical, id %s", op, len(calls[0].Answer), first.ID)
}

// recipeAnswers shows recorded answers for a failure message.
func recipeAnswers(calls []clientCall) string {
	var b strings.Builder
	for i, c := range calls {
		fmt.Fprintf(&b, "--- %d (%d):\n%s\n", i, c.Status, c.Answer)
	}
	return b.String()
}

// TestRecipeOpenAIGoStreams runs the openai-go recipe's SummarizeStream,
// SummarizeResponse and SummarizeResponseStream through its driver.
func TestRecipeOpenAIGoStreams(t *testing.T) {
	bin := buildOpenAIGoRecipe(t)
	recipeStreamSuite(t, []string{"stream", "response", "response-stream"}, func(g *recipeGateway) recipeOpRunner {
		return func(op, orderID, text string) (recipeResult, error) {
			return runRecipeDriver(g, bin, "-op", op, orderID, text)
		}
	})
}

// TestRecipeGoOpenAIStreams runs go-openai's streaming and Responses calls
// under the recipe's Keyed (e2e/recipes/goopenai), in process.
func TestRecipeGoOpenAIStreams(t *testing.T) {
	recipeStreamSuite(t, []string{"stream", "response", "response-stream"}, func(g *recipeGateway) recipeOpRunner {
		client := goopenai.NewClient(g.base, recipeClientKey)
		return func(op, orderID, text string) (recipeResult, error) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := goOpenAIOp(ctx, client, op, recipeOpKey(orderID, op), "Summarize: "+text)
			var apiErr *openai.APIError
			switch {
			case err == nil:
				out.OK = true
			case errors.As(err, &apiErr):
				out.Status, out.Message = apiErr.HTTPStatusCode, apiErr.Message
				out.Code, _ = apiErr.Code.(string)
			default:
				return out, err
			}
			return out, nil
		}
	})
}

// goOpenAIOp makes op's go-openai call under key, as the README's go-openai
// section shows it: the call inside goopenai.Keyed.
func goOpenAIOp(ctx context.Context, client *openai.Client, op, key, prompt string) (recipeResult, error) {
	chat := openai.ChatCompletionRequest{Model: openai.GPT4oMini, Messages: []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: prompt}}}
	respReq := openai.CreateResponseRequest{Model: openai.GPT4oMini, Input: prompt}
	switch op {
	case "stream":
		stream, err := goopenai.Keyed(ctx, key, func(ctx context.Context) (*openai.ChatCompletionStream, error) {
			return client.CreateChatCompletionStream(ctx, chat)
		})
		if err != nil {
			return recipeResult{}, err
		}
		defer stream.Close()
		return drainGoOpenAI(stream.Header().Get("Idempotent-Replayed"), stream.RecvRaw)
	case "response":
		res, err := goopenai.Keyed(ctx, key, func(ctx context.Context) (openai.CreateResponseResponse, error) {
			return client.CreateResponse(ctx, respReq)
		})
		if err != nil {
			return recipeResult{}, err
		}
		raw, _ := json.Marshal(res)
		return recipeResult{ID: res.ID, Content: res.GetOutputText(), Raw: string(raw), Replayed: res.Header().Get("Idempotent-Replayed")}, nil
	case "response-stream":
		stream, err := goopenai.Keyed(ctx, key, func(ctx context.Context) (*openai.ResponseStream, error) {
			return client.CreateResponseStream(ctx, respReq)
		})
		if err != nil {
			return recipeResult{}, err
		}
		defer stream.Close()
		return drainGoOpenAI(stream.Header().Get("Idempotent-Replayed"), stream.RecvRaw)
	}
	return recipeResult{}, fmt.Errorf("unknown op %q", op)
}

// drainGoOpenAI reads a go-openai stream's events (their data, as recv
// returns them) to io.EOF.
func drainGoOpenAI(replayed string, recv func() ([]byte, error)) (recipeResult, error) {
	var sse strings.Builder
	for {
		data, err := recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return recipeResult{}, err
		}
		sse.WriteString("data: " + string(data) + "\n\n")
	}
	out := sseResult(sse.String())
	out.Replayed = replayed
	return out, nil
}

// sseResult is what a stream's text says: the id of its first chunk (chat)
// or its response (Responses), the text its deltas assemble, and the text
// itself as raw.
func sseResult(text string) recipeResult {
	out := recipeResult{Raw: text}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Delta    string `json:"delta"`
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &ev) != nil {
			continue
		}
		if out.ID == "" {
			out.ID = ev.ID + ev.Response.ID
		}
		if ev.Type == "response.output_text.delta" {
			out.Content += ev.Delta
		}
		for _, c := range ev.Choices {
			out.Content += c.Delta.Content
		}
	}
	return out
}

// TestRecipeCurlStreams runs the curl recipe's llmgate_stream (a chat
// stream, and a Responses stream with LLMGATE_PATH=/responses) and
// llmgate_call for a Responses call; what curl printed is the raw answer.
func TestRecipeCurlStreams(t *testing.T) {
	script := curlRecipe(t)
	recipeStreamSuite(t, []string{"stream", "response", "response-stream"}, func(g *recipeGateway) recipeOpRunner {
		return func(op, orderID, text string) (recipeResult, error) {
			fn, path := "llmgate_stream", "/responses"
			body := map[string]any{"model": "gpt-4o-mini", "input": "Summarize: " + text, "stream": true}
			switch op {
			case "stream":
				path = "/chat/completions"
				body = map[string]any{"model": "gpt-4o-mini", "stream": true,
					"messages": []map[string]string{{"role": "user", "content": "Summarize: " + text}}}
			case "response":
				fn = "llmgate_call"
				delete(body, "stream")
			}
			return runCurlRecipe(g, script, fn, path, recipeOpKey(orderID, op), body)
		}
	})
}

// runCurlRecipe runs the shell function fn of script under key, with
// LLMGATE_PATH=path and body on stdin.
func runCurlRecipe(g *recipeGateway, script, fn, path, key string, body map[string]any) (recipeResult, error) {
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", `. "$0"; "$1" "$2"`, script, fn, key)
	cmd.Env = append(os.Environ(), "LLMGATE_BASE_URL="+g.base, "LLMGATE_API_KEY="+recipeClientKey, "LLMGATE_PATH="+path)
	cmd.Stdin = bytes.NewReader(b)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		return recipeResult{Raw: string(outb)}, fmt.Errorf("%s: %v\n%s%s", fn, err, outb, stderr.String())
	}
	if fn == "llmgate_stream" {
		out := sseResult(string(outb))
		out.OK = true
		return out, nil
	}
	var answer struct {
		ID     string `json:"id"`
		Output []struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
	}
	if err := json.Unmarshal(outb, &answer); err != nil {
		return recipeResult{Raw: string(outb)}, fmt.Errorf("%s printed %q: %v", fn, outb, err)
	}
	out := recipeResult{OK: true, ID: answer.ID, Raw: string(outb)}
	for _, o := range answer.Output {
		for _, c := range o.Content {
			out.Content += c.Text
		}
	}
	return out, nil
}

// recipeNodeOpRunner runs a driver for recipeStreamSuite's gateway; op is
// the driver's variant prefix-op (openai-stream, langchain-response, ...).
func recipeNodeOpRunner(t *testing.T, dir, prefix string) func(g *recipeGateway) recipeOpRunner {
	return func(g *recipeGateway) recipeOpRunner {
		d := startRecipeNodeDriver(t, dir, g)
		return func(op, orderID, text string) (recipeResult, error) {
			return d.call(prefix+"-"+op, orderID, text, "")
		}
	}
}

// TestRecipeNodeOpenAIStreams runs recipe_openai.mjs's summarizeStream,
// summarizeResponse and summarizeResponseStream.
func TestRecipeNodeOpenAIStreams(t *testing.T) {
	recipeStreamSuite(t, []string{"stream", "response", "response-stream"}, recipeNodeOpRunner(t, nodeRecipes(t), "openai"))
}

// TestRecipeLangChainJSStreams runs recipe_langchain.mjs's summarizeStream
// (`.stream()` on a model whose configuration.defaultHeaders carry the
// key) and summarizeResponse (useResponsesApi: true).
func TestRecipeLangChainJSStreams(t *testing.T) {
	recipeStreamSuite(t, []string{"stream", "response"}, recipeNodeOpRunner(t, nodeRecipes(t), "langchain"))
}

// TestRecipeLangChainJSStreamOptions measures what recipe_langchain.mjs
// warns against: `.stream(messages, { options: { headers } })` sends no
// Idempotency-Key, so the same key twice is two upstream calls and two
// different streams.
func TestRecipeLangChainJSStreamOptions(t *testing.T) {
	dir := nodeRecipes(t)
	g := startRecipeGateway(t)
	d := startRecipeNodeDriver(t, dir, g)
	var results []recipeResult
	for range 2 {
		r, err := d.call("langchain-stream-options", "options", "an order streamed with the key in options", "")
		if err != nil {
			t.Fatal(err)
		}
		if !r.OK || r.Content == "" {
			t.Fatalf("call failed: %+v", r)
		}
		results = append(results, r)
	}
	if results[0].ID == results[1].ID || results[0].Raw == results[1].Raw {
		t.Fatalf("the second stream was the first: %+v", results[1])
	}
	wantTwoUnkeyedCalls(t, g, "LangChain")
}
