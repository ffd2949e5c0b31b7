package e2e

// The Responses API and models.Get through the real gateway process, driven
// by the official Go SDK (github.com/openai/openai-go): what a client of
// llmgate sees for a keyed JSON response and stream (replayed byte for
// byte), a filtered, an empty and a failed-mid-stream response, and a
// background response (the same id on replay). The upstream is the fake,
// scripted per test.

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	openaigo "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// wire records what the gateway sent back for each request an SDK made:
// status, headers and the body bytes as read off the wire.
type wire struct {
	mu        sync.Mutex
	exchanges []*wireExchange
}

type wireExchange struct {
	status int
	header http.Header
	body   *tee
}

func (w *wire) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	x := &wireExchange{status: res.StatusCode, header: res.Header.Clone(), body: &tee{rc: res.Body}}
	res.Body = x.body
	w.mu.Lock()
	w.exchanges = append(w.exchanges, x)
	w.mu.Unlock()
	return res, nil
}

// last is the latest exchange, its body read to the end (an SDK may stop
// reading at the terminal event).
func (w *wire) last(t *testing.T) (int, http.Header, []byte) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.exchanges) == 0 {
		t.Fatal("no request went out")
	}
	x := w.exchanges[len(w.exchanges)-1]
	_, _ = io.Copy(io.Discard, x.body)
	return x.status, x.header, x.body.copy()
}

// responsesGateway starts the fake (with o) and a gateway in front of it,
// and returns the fake, its URL, and an openai-go client of the gateway
// that records the wire and does not retry on its own.
func responsesGateway(t *testing.T, o fakeprovider.Options) (*fakeprovider.Server, string, openaigo.Client, *wire) {
	t.Helper()
	fake, upURL := newFake(t, o)
	p := start(t, gatewayBin(t, ""), []string{"-config", writeConfig(t, t.TempDir(), upURL, "")}, nil)
	w := &wire{}
	c := openaigo.NewClient(option.WithBaseURL(p.URL+"/v1"), option.WithAPIKey("e2e-client-key"),
		option.WithHTTPClient(&http.Client{Transport: w, Timeout: httpClient.Timeout}), option.WithMaxRetries(0))
	return fake, upURL, c, w
}

func respParams(prompt string) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model: "gpt-4o-mini",
		Input: responses.ResponseNewParamsInputUnion{OfString: openaigo.String(prompt)},
	}
}

func withKey(k string) option.RequestOption { return option.WithHeader("Idempotency-Key", k) }

// respStream runs one streamed request and returns the SDK's events.
func respStream(ctx context.Context, c openaigo.Client, p responses.ResponseNewParams, opts ...option.RequestOption) ([]responses.ResponseStreamEventUnion, error) {
	s := c.Responses.NewStreaming(ctx, p, opts...)
	defer s.Close()
	var events []responses.ResponseStreamEventUnion
	for s.Next() {
		events = append(events, s.Current())
	}
	return events, s.Err()
}

func TestResponsesSDKKeyedJSONReplay(t *testing.T) {
	fake, _, c, w := responsesGateway(t, fakeprovider.Options{})
	ctx := t.Context()
	first, err := c.Responses.New(ctx, respParams("keyed json"), withKey("resp-json-1"))
	if err != nil {
		t.Fatal(err)
	}
	_, h1, raw1 := w.last(t)
	if first.Status != "completed" || !strings.Contains(first.OutputText(), "keyed json") || h1.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %s", raw1)
	}
	again, err := c.Responses.New(ctx, respParams("keyed json"), withKey("resp-json-1"))
	if err != nil {
		t.Fatal(err)
	}
	_, h2, raw2 := w.last(t)
	if string(raw2) != string(raw1) || again.ID != first.ID || h2.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay differs (replayed=%q):\n%s\n%s", h2.Get("Idempotent-Replayed"), raw1, raw2)
	}
	if n := fake.Calls("/v1/responses"); n != 1 {
		t.Fatalf("upstream calls = %d, want 1", n)
	}
}

func TestResponsesSDKKeyedStreamReplay(t *testing.T) {
	fake, _, c, w := responsesGateway(t, fakeprovider.Options{})
	ctx := t.Context()
	var raws [2][]byte
	var texts [2]string
	for i := range 2 {
		events, err := respStream(ctx, c, respParams("keyed stream"), withKey("resp-stream-1"))
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		last := events[len(events)-1]
		if last.Type != "response.completed" {
			t.Fatalf("run %d ended with %s", i, last.Type)
		}
		var deltas strings.Builder
		for _, e := range events {
			deltas.WriteString(e.Delta)
		}
		if deltas.String() != last.AsResponseCompleted().Response.OutputText() {
			t.Fatalf("run %d: deltas %q, completed %q", i, deltas.String(), last.AsResponseCompleted().Response.OutputText())
		}
		var h http.Header
		_, h, raws[i] = w.last(t)
		texts[i] = deltas.String()
		if replayed := h.Get("Idempotent-Replayed") == "true"; replayed != (i == 1) {
			t.Fatalf("run %d: Idempotent-Replayed %q", i, h.Get("Idempotent-Replayed"))
		}
	}
	if string(raws[0]) != string(raws[1]) || !strings.Contains(texts[0], "keyed stream") {
		t.Fatalf("stream replay differs:\n%s\n---\n%s", raws[0], raws[1])
	}
	if strings.Contains(string(raws[0]), "[DONE]") || !strings.Contains(string(raws[0]), "event: response.completed\n") {
		t.Fatalf("not a Responses stream: %s", raws[0])
	}
	if n := fake.Calls("/v1/responses"); n != 1 {
		t.Fatalf("upstream calls = %d, want 1", n)
	}
}

// A filtered and an empty response are the model's answer: relayed with
// X-Llmgate-Outcome, not retried, committed (the replay says the same).
func TestResponsesSDKFilteredAndEmpty(t *testing.T) {
	tests := []struct {
		name    string
		step    fakeprovider.Step
		outcome string
		check   func(*responses.Response) bool
	}{
		{"content filter", fakeprovider.Step{FinishReason: "content_filter"}, "content_filter", func(r *responses.Response) bool {
			return r.Status == "incomplete" && r.IncompleteDetails.Reason == "content_filter"
		}},
		{"empty output", fakeprovider.Step{Empty: true}, "empty_output", func(r *responses.Response) bool {
			return r.Status == "completed" && len(r.Output) == 0
		}},
	}
	fake, _, c, w := responsesGateway(t, fakeprovider.Options{})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake.Reset()
			fake.Enqueue(tc.step)
			key := withKey("resp-" + strings.ReplaceAll(tc.name, " ", "-"))
			res, err := c.Responses.New(t.Context(), respParams(tc.name), key)
			if err != nil || !tc.check(res) {
				t.Fatalf("%v, %v", res, err)
			}
			_, h, raw := w.last(t)
			if h.Get("X-Llmgate-Outcome") != tc.outcome {
				t.Fatalf("X-Llmgate-Outcome %q, want %q", h.Get("X-Llmgate-Outcome"), tc.outcome)
			}
			again, err := c.Responses.New(t.Context(), respParams(tc.name), key)
			_, h2, raw2 := w.last(t)
			if err != nil || !tc.check(again) || string(raw2) != string(raw) || h2.Get("X-Llmgate-Outcome") != tc.outcome {
				t.Fatalf("replay %v (outcome %q)", err, h2.Get("X-Llmgate-Outcome"))
			}
			if n := fake.Calls("/v1/responses"); n != 1 {
				t.Fatalf("upstream calls = %d, want 1 (not retried, committed)", n)
			}
		})
	}
}

// response.failed after the text started is the upstream's failure: the
// SDK sees it as the stream's last event; nothing is committed, so the
// key's retry asks again and gets a completed response.
func TestResponsesSDKFailedMidStream(t *testing.T) {
	fake, _, c, w := responsesGateway(t, fakeprovider.Options{})
	fake.Enqueue(fakeprovider.Step{Failed: true})
	ctx := t.Context()
	events, err := respStream(ctx, c, respParams("fail midway"), withKey("resp-failed-1"))
	if err != nil {
		t.Fatal(err)
	}
	last := events[len(events)-1]
	if last.Type != "response.failed" || last.AsResponseFailed().Response.Error.Code != "server_error" {
		t.Fatalf("last event %s", last.RawJSON())
	}
	if n := fake.Calls("/v1/responses"); n != 1 {
		t.Fatalf("upstream calls = %d, want 1 (not retried after the text started)", n)
	}
	events, err = respStream(ctx, c, respParams("fail midway"), withKey("resp-failed-1"))
	_, h, _ := w.last(t)
	if err != nil || events[len(events)-1].Type != "response.completed" || h.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry with the key: %v, replayed %q", err, h.Get("Idempotent-Replayed"))
	}
	if n := fake.Calls("/v1/responses"); n != 2 {
		t.Fatalf("upstream calls = %d, want 2", n)
	}
}

// background: true — the creation answer is committed, so a resumed
// workflow gets the same id and polls the response it already started.
func TestResponsesSDKBackground(t *testing.T) {
	fake, upURL, c, w := responsesGateway(t, fakeprovider.Options{})
	ctx := t.Context()
	p := respParams("in the background")
	p.Background = openaigo.Bool(true)
	first, err := c.Responses.New(ctx, p, withKey("resp-bg-1"))
	if err != nil || first.Status != "queued" {
		t.Fatalf("%v, %v", first, err)
	}
	again, err := c.Responses.New(ctx, p, withKey("resp-bg-1"))
	_, h, _ := w.last(t)
	if err != nil || again.ID != first.ID || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("resumed workflow got %v (replayed %q), %v; want %s", again, h.Get("Idempotent-Replayed"), err, first.ID)
	}
	if n := fake.Calls("/v1/responses"); n != 1 {
		t.Fatalf("upstream calls = %d, want 1", n)
	}
	// The id is the upstream's live background response.
	up := openaigo.NewClient(option.WithBaseURL(upURL+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	for _, want := range []string{"in_progress", "completed"} {
		got, err := up.Responses.Get(ctx, first.ID, responses.ResponseGetParams{})
		if err != nil || string(got.Status) != want {
			t.Fatalf("poll: %v, %v; want %s", got, err, want)
		}
	}
}

// models.Get answers from the upstream's own bytes, for a model id with a
// "/" in it (vLLM's and Hugging Face's names), vendor fields and all.
func TestResponsesSDKModelsGet(t *testing.T) {
	const id = "meta-llama/Llama-3.1-8B-Instruct"
	_, _, c, w := responsesGateway(t, fakeprovider.Options{Models: []string{id}, MaxModelLen: 8192})
	ctx := t.Context()
	m, err := c.Models.Get(ctx, id)
	if err != nil || m.ID != id || m.Object != "model" {
		t.Fatalf("Get(%q) = %v, %v", id, m, err)
	}
	if raw := m.RawJSON(); !strings.Contains(raw, `"max_model_len":8192`) {
		t.Errorf("vendor field dropped: %s", raw)
	}
	_, err = c.Models.Get(ctx, "meta-llama/not-served")
	if status, _, _ := w.last(t); err == nil || status != http.StatusNotFound {
		t.Errorf("unknown model: status %d, %v", status, err)
	}
}

// The README's Node snippet (e2e/recipes/node/responses.mjs) runs as
// written with the official Node SDK: a keyed response, its replay (the
// same id, Idempotent-Replayed), and a stream. Skips without node and npm
// unless LLMGATE_REQUIRE_NODE=1.
func TestResponsesNodeSnippet(t *testing.T) {
	dir := nodeRecipes(t)
	fake, upURL := newFake(t, fakeprovider.Options{})
	p := start(t, gatewayBin(t, ""), []string{"-config", writeConfig(t, t.TempDir(), upURL, "")}, nil)
	cmd := exec.CommandContext(t.Context(), "node", "responses.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LLMGATE_URL="+p.URL+"/v1", "LLMGATE_KEY=e2e-client-key")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node responses.mjs: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "resp_") || !strings.Contains(lines[0], "Summarize order 42") ||
		lines[1] != "true true" || !strings.Contains(lines[2], "Stream order 42") || lines[3] != "completed" {
		t.Fatalf("output:\n%s", out)
	}
	if n := fake.Calls("/v1/responses"); n != 2 {
		t.Fatalf("upstream calls = %d, want 2 (the replay makes none)", n)
	}
}
