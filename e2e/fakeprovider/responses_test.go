package fakeprovider_test

// The Responses API and the models and structured-output answers, driven
// with the official SDK, github.com/openai/openai-go: if the SDK parses
// what the fake sends, so will the clients the gateway serves.

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/llmgate/llmgate/cmd/gateway/demo"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// sdk is an official-SDK client of the fake that never retries, so every
// call is one request.
func sdk(srv *httptest.Server) openai.Client {
	return openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("k"),
		option.WithHTTPClient(srv.Client()), option.WithMaxRetries(0))
}

func askParams(prompt string) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model: "gpt-4o-mini",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)},
	}
}

// apiStatus is the HTTP status of an SDK error, 0 if it is not an API error.
func apiStatus(err error) (int, string) {
	if e, ok := errors.AsType[*openai.Error](err); ok {
		return e.StatusCode, e.Code
	}
	return 0, ""
}

func TestResponsesJSON(t *testing.T) {
	_, srv := start(t, fakeprovider.Options{})
	c := sdk(srv)
	p := askParams("hello there")
	p.Instructions = openai.String("Be brief.")
	p.Metadata = shared.Metadata{"order": "42"}
	res, err := c.Responses.New(testCtx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.ID, "resp_") || res.Object != "response" || res.Status != "completed" || res.CreatedAt == 0 || res.CompletedAt == 0 {
		t.Errorf("response %s object %q status %q created %v completed %v", res.ID, res.Object, res.Status, res.CreatedAt, res.CompletedAt)
	}
	if got := res.OutputText(); !strings.Contains(got, "You said: hello there") {
		t.Errorf("output text %q", got)
	}
	if len(res.Output) != 1 || res.Output[0].Type != "message" || res.Output[0].Role != "assistant" {
		t.Errorf("output %s", res.JSON.Output.Raw())
	}
	u := res.Usage
	if u.InputTokens == 0 || u.OutputTokens == 0 || u.TotalTokens != u.InputTokens+u.OutputTokens {
		t.Errorf("usage %+v", u)
	}
	if res.Instructions.OfString != "Be brief." || res.Metadata["order"] != "42" || res.Model != "gpt-4o-mini" || res.JSON.ExtraFields["store"].Raw() != "true" {
		t.Errorf("not echoed: %s", res.RawJSON())
	}

	got, err := c.Responses.Get(testCtx(t), res.ID, responses.ResponseGetParams{})
	if err != nil || got.RawJSON() != res.RawJSON() {
		t.Errorf("Get = %v, %v; want the created response", got, err)
	}
	items, err := c.Responses.InputItems.List(testCtx(t), res.ID, responses.InputItemListParams{})
	if err != nil || len(items.Data) != 1 || items.Data[0].Type != "message" || items.Data[0].ID == "" {
		t.Fatalf("input items = %+v, %v", items, err)
	}
	if raw := items.Data[0].RawJSON(); !strings.Contains(raw, `"text":"hello there"`) || !strings.Contains(raw, `"input_text"`) {
		t.Errorf("input item %s", raw)
	}
	if err := c.Responses.Delete(testCtx(t), res.ID); err != nil {
		t.Fatal(err)
	}
	_, err = c.Responses.Get(testCtx(t), res.ID, responses.ResponseGetParams{})
	if status, _ := apiStatus(err); status != http.StatusNotFound {
		t.Errorf("Get after Delete: %v, want 404", err)
	}
}

// streamed runs one streamed Responses request and returns its events.
func streamed(t *testing.T, c openai.Client, p responses.ResponseNewParams) ([]responses.ResponseStreamEventUnion, error) {
	t.Helper()
	s := c.Responses.NewStreaming(testCtx(t), p)
	defer s.Close()
	var events []responses.ResponseStreamEventUnion
	for s.Next() {
		events = append(events, s.Current())
	}
	return events, s.Err()
}

func eventTypes(events []responses.ResponseStreamEventUnion) []string {
	var types []string
	for _, e := range events {
		if len(types) > 0 && types[len(types)-1] == e.Type && e.Type == "response.output_text.delta" {
			continue // several deltas read as one
		}
		types = append(types, e.Type)
	}
	return types
}

func TestResponsesStream(t *testing.T) {
	_, srv := start(t, fakeprovider.Options{})
	events, err := streamed(t, sdk(srv), askParams("hello there"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.done", "response.content_part.done",
		"response.output_item.done", "response.completed",
	}
	if got := eventTypes(events); !slices.Equal(got, want) {
		t.Fatalf("events %v\nwant %v", got, want)
	}
	var deltas strings.Builder
	var acc responses.ResponseAccumulator // the SDK's own accumulator
	for i, e := range events {
		if e.SequenceNumber != int64(i) {
			t.Errorf("event %d (%s) has sequence_number %d", i, e.Type, e.SequenceNumber)
		}
		if e.Type == "response.output_text.delta" {
			deltas.WriteString(e.Delta)
		}
		var ev responses.ResponsesServerEventUnion
		if err := json.Unmarshal([]byte(e.RawJSON()), &ev); err != nil {
			t.Fatal(err)
		}
		if err := acc.AddEvent(ev); err != nil {
			t.Fatalf("accumulate %s: %v", e.Type, err)
		}
	}
	if n := strings.Count(strings.Join(typesOf(events), " "), "output_text.delta"); n < 2 {
		t.Errorf("%d text deltas, want several", n)
	}
	done := events[len(events)-1].AsResponseCompleted().Response
	if done.Status != "completed" || done.OutputText() != deltas.String() || !strings.Contains(deltas.String(), "hello there") {
		t.Errorf("completed %q with text %q; deltas %q", done.Status, done.OutputText(), deltas.String())
	}
	final, err := acc.ReconstructedResponse()
	if err != nil || final.OutputText() != deltas.String() || final.ID != done.ID {
		t.Errorf("accumulated %v, %v; want the completed response", final, err)
	}
	if created := events[0].AsResponseCreated().Response; created.ID != done.ID || created.Status != "in_progress" || len(created.Output) != 0 {
		t.Errorf("created %s", events[0].RawJSON())
	}
}

func typesOf(events []responses.ResponseStreamEventUnion) []string {
	var types []string
	for _, e := range events {
		types = append(types, e.Type)
	}
	return types
}

// TestResponsesStreamWire checks what the SDK does not show: event: lines
// that match the data's type, and no [DONE].
func TestResponsesStreamWire(t *testing.T) {
	_, srv := start(t, fakeprovider.Options{})
	resp, err := post(testCtx(t), srv, "/v1/responses", `{"model":"m","input":"hi","stream":true}`)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("read %v, content type %q", err, resp.Header.Get("Content-Type"))
	}
	if bytes.Contains(body, []byte("[DONE]")) {
		t.Error("a Responses stream ends without [DONE]")
	}
	blocks := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
	for _, b := range blocks {
		name, data, ok := strings.Cut(b, "\n")
		var ev struct{ Type string }
		if !ok || json.Unmarshal([]byte(strings.TrimPrefix(data, "data: ")), &ev) != nil || name != "event: "+ev.Type {
			t.Errorf("event block %q", b)
		}
	}
}

func TestResponsesBackground(t *testing.T) {
	_, srv := start(t, fakeprovider.Options{BackgroundPolls: 2})
	c := sdk(srv)
	p := askParams("in the background")
	p.Background = openai.Bool(true)
	res, err := c.Responses.New(testCtx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != "queued" || !res.Background || len(res.Output) != 0 {
		t.Fatalf("created %s", res.RawJSON())
	}
	var seen []string
	for range 4 {
		got, err := c.Responses.Get(testCtx(t), res.ID, responses.ResponseGetParams{})
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, string(got.Status))
		if got.Status == "completed" && !strings.Contains(got.OutputText(), "in the background") {
			t.Errorf("completed with %q", got.OutputText())
		}
	}
	if want := []string{"in_progress", "in_progress", "completed", "completed"}; !slices.Equal(seen, want) {
		t.Errorf("polls saw %v, want %v", seen, want)
	}

	other, err := c.Responses.New(testCtx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	cancelled, err := c.Responses.Cancel(testCtx(t), other.ID)
	if err != nil || cancelled.Status != "cancelled" {
		t.Fatalf("Cancel = %v, %v", cancelled, err)
	}
	if got, err := c.Responses.Get(testCtx(t), other.ID, responses.ResponseGetParams{}); err != nil || got.Status != "cancelled" {
		t.Errorf("Get after Cancel = %v, %v", got, err)
	}
	fg, err := c.Responses.New(testCtx(t), askParams("foreground"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Responses.Cancel(testCtx(t), fg.ID)
	if status, _ := apiStatus(err); status != http.StatusBadRequest {
		t.Errorf("Cancel of a foreground response: %v, want 400", err)
	}
}

func TestResponsesPreviousResponseID(t *testing.T) {
	_, srv := start(t, fakeprovider.Options{})
	c := sdk(srv)
	first, err := c.Responses.New(testCtx(t), askParams("first"))
	if err != nil {
		t.Fatal(err)
	}
	p := askParams("second")
	p.PreviousResponseID = openai.String(first.ID)
	second, err := c.Responses.New(testCtx(t), p)
	if err != nil || second.PreviousResponseID != first.ID {
		t.Fatalf("continued = %v, %v", second, err)
	}

	p.PreviousResponseID = openai.String("resp_nobody")
	_, err = c.Responses.New(testCtx(t), p)
	if status, code := apiStatus(err); status != http.StatusBadRequest || code != "previous_response_not_found" {
		t.Errorf("unknown previous_response_id: %v", err)
	}

	unstored := askParams("forget me")
	unstored.Store = openai.Bool(false)
	gone, err := c.Responses.New(testCtx(t), unstored)
	if err != nil || gone.JSON.ExtraFields["store"].Raw() != "false" {
		t.Fatalf("store:false = %v, %v", gone, err)
	}
	_, err = c.Responses.Get(testCtx(t), gone.ID, responses.ResponseGetParams{})
	if status, _ := apiStatus(err); status != http.StatusNotFound {
		t.Errorf("Get of a store:false response: %v, want 404", err)
	}
}

// TestResponsesScripted holds each scripted failure to the shape the SDK
// sees, as JSON and streamed.
func TestResponsesScripted(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{})
	c := sdk(srv)
	t.Run("5xx", func(t *testing.T) {
		fake.Enqueue(fakeprovider.Step{Status: 503})
		_, err := c.Responses.New(testCtx(t), askParams("x"))
		if status, _ := apiStatus(err); status != 503 {
			t.Errorf("err %v, want 503", err)
		}
	})
	t.Run("429", func(t *testing.T) {
		fake.Enqueue(fakeprovider.Step{Status: 429, Header: map[string]string{"Retry-After": "2"}})
		resp, err := post(testCtx(t), srv, "/v1/responses", `{"model":"m","input":"x"}`)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "2" {
			t.Errorf("status %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	})
	t.Run("content_filter", func(t *testing.T) {
		fake.Enqueue(fakeprovider.Step{FinishReason: "content_filter"}, fakeprovider.Step{FinishReason: "content_filter"})
		res, err := c.Responses.New(testCtx(t), askParams("x"))
		if err != nil || res.Status != "incomplete" || res.IncompleteDetails.Reason != "content_filter" {
			t.Errorf("JSON: %v, %v", res, err)
		}
		events, err := streamed(t, c, askParams("x"))
		last := events[len(events)-1]
		if err != nil || last.Type != "response.incomplete" || last.AsResponseIncomplete().Response.IncompleteDetails.Reason != "content_filter" {
			t.Errorf("stream: %v, last %s", err, last.RawJSON())
		}
	})
	t.Run("max_output_tokens", func(t *testing.T) {
		fake.Enqueue(fakeprovider.Step{FinishReason: "length"})
		res, err := c.Responses.New(testCtx(t), askParams("x"))
		if err != nil || res.Status != "incomplete" || res.IncompleteDetails.Reason != "max_output_tokens" {
			t.Errorf("JSON: %v, %v", res, err)
		}
	})
	t.Run("empty", func(t *testing.T) {
		fake.Enqueue(fakeprovider.Step{Empty: true}, fakeprovider.Step{Empty: true})
		res, err := c.Responses.New(testCtx(t), askParams("x"))
		if err != nil || res.Status != "completed" || len(res.Output) != 0 || res.JSON.Output.Raw() != "[]" {
			t.Errorf("JSON: %v, %v", res, err)
		}
		events, err := streamed(t, c, askParams("x"))
		if want := []string{"response.created", "response.in_progress", "response.completed"}; err != nil || !slices.Equal(typesOf(events), want) {
			t.Errorf("stream: %v, %v", typesOf(events), err)
		}
	})
	t.Run("failed", func(t *testing.T) {
		fake.Enqueue(fakeprovider.Step{Failed: true, ErrCode: "rate_limit_exceeded"}, fakeprovider.Step{Failed: true})
		res, err := c.Responses.New(testCtx(t), askParams("x"))
		if err != nil || res.Status != "failed" || res.Error.Code != "rate_limit_exceeded" {
			t.Errorf("JSON: %v, %v", res, err)
		}
		events, err := streamed(t, c, askParams("x"))
		types := typesOf(events)
		last := events[len(events)-1].AsResponseFailed().Response
		if err != nil || types[len(types)-1] != "response.failed" || types[len(types)-2] != "response.output_text.delta" || last.Error.Code != "server_error" {
			t.Errorf("stream: %v, %v, last %s", types, err, events[len(events)-1].RawJSON())
		}
	})
	t.Run("error event", func(t *testing.T) {
		fake.Enqueue(fakeprovider.Step{ErrorInStream: true, ErrCode: "server_error"})
		events, err := streamed(t, c, askParams("x"))
		last := events[len(events)-1]
		if err != nil || last.Type != "error" || last.AsError().Code != "server_error" || slices.Contains(typesOf(events), "response.completed") {
			t.Errorf("stream: %v, %v", typesOf(events), err)
		}
	})
	t.Run("function call", func(t *testing.T) {
		fake.Enqueue(fakeprovider.Step{FinishReason: "tool_calls"}, fakeprovider.Step{FinishReason: "tool_calls"})
		p := askParams("weather in Paris")
		p.Tools = []responses.ToolUnionParam{responses.ToolParamOfFunction("get_weather", map[string]any{"type": "object"}, false)}
		res, err := c.Responses.New(testCtx(t), p)
		if err != nil || len(res.Output) != 1 || res.Output[0].Type != "function_call" || res.Output[0].Name != "get_weather" {
			t.Fatalf("JSON: %v, %v", res, err)
		}
		events, err := streamed(t, c, p)
		want := []string{"response.created", "response.in_progress", "response.output_item.added",
			"response.function_call_arguments.delta", "response.function_call_arguments.done",
			"response.output_item.done", "response.completed"}
		if err != nil || !slices.Equal(typesOf(events), want) {
			t.Errorf("stream: %v, %v", typesOf(events), err)
		}
	})
	t.Run("stop after", func(t *testing.T) {
		fake.Enqueue(fakeprovider.Step{StopAfter: 4})
		events, err := streamed(t, c, askParams("x"))
		if err != nil || len(events) != 4 {
			t.Errorf("stream cut after %d events (%v), want 4", len(events), err)
		}
	})
}

func TestResponsesDemoModels(t *testing.T) {
	_, srv := start(t, fakeprovider.Options{DemoModels: true})
	c := sdk(srv)
	p := askParams("x")
	p.Model = demo.DemoFiltered
	res, err := c.Responses.New(testCtx(t), p)
	if err != nil || res.IncompleteDetails.Reason != "content_filter" {
		t.Errorf("%s: %v, %v", p.Model, res, err)
	}
	p.Model = demo.DemoEmpty
	res, err = c.Responses.New(testCtx(t), p)
	if err != nil || res.Status != "completed" || len(res.Output) != 0 {
		t.Errorf("%s: %v, %v", p.Model, res, err)
	}
}

func TestModelsGet(t *testing.T) {
	const id = "meta-llama/Llama-3.1-8B-Instruct"
	_, srv := start(t, fakeprovider.Options{Models: []string{id}, MaxModelLen: 8192})
	c := sdk(srv)
	m, err := c.Models.Get(testCtx(t), id)
	if err != nil || m.ID != id || m.Object != "model" || m.Created == 0 || m.OwnedBy == "" {
		t.Fatalf("Get(%q) = %v, %v", id, m, err)
	}
	if raw := m.RawJSON(); !strings.Contains(raw, `"max_model_len":8192`) || !strings.Contains(raw, `"parent":null`) {
		t.Errorf("vLLM fields missing: %s", raw)
	}
	_, err = c.Models.Get(testCtx(t), "meta-llama/unknown")
	if status, code := apiStatus(err); status != http.StatusNotFound || code != "model_not_found" {
		t.Errorf("unknown model: %v", err)
	}
	page, err := c.Models.List(testCtx(t))
	if err != nil || len(page.Data) != 1 || !strings.Contains(page.Data[0].RawJSON(), `"max_model_len":8192`) {
		t.Errorf("List = %v, %v", page, err)
	}
}

// serveDirect answers one request with the handler alone, without HTTP.
func serveDirect(fake *fakeprovider.Server, method, path, body string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	fake.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(body)))
	return w
}

// The stored responses are bounded: a demo server on an open port keeps
// the newest 4096 and forgets the oldest.
func TestResponsesStoreIsBounded(t *testing.T) {
	fake := fakeprovider.New(fakeprovider.Options{KeepRequests: -1})
	defer fake.Close()
	var first struct{ ID string }
	if err := json.Unmarshal(serveDirect(fake, "POST", "/v1/responses", `{"model":"m","input":"first"}`).Body.Bytes(), &first); err != nil {
		t.Fatal(err)
	}
	if w := serveDirect(fake, "GET", "/v1/responses/"+first.ID, ""); w.Code != 200 {
		t.Fatalf("GET the first: %d", w.Code)
	}
	for range 4096 {
		serveDirect(fake, "POST", "/v1/responses", `{"model":"m","input":"more"}`)
	}
	if w := serveDirect(fake, "GET", "/v1/responses/"+first.ID, ""); w.Code != http.StatusNotFound {
		t.Errorf("GET the oldest after 4096 more: %d, want 404", w.Code)
	}
	fake.Reset()
	var last struct{ ID string }
	_ = json.Unmarshal(serveDirect(fake, "POST", "/v1/responses", `{"model":"m","input":"x"}`).Body.Bytes(), &last)
	fake.Reset()
	if w := serveDirect(fake, "GET", "/v1/responses/"+last.ID, ""); w.Code != http.StatusNotFound {
		t.Errorf("GET after Reset: %d, want 404", w.Code)
	}
}

func BenchmarkResponses(b *testing.B) {
	fake := fakeprovider.New(fakeprovider.Options{KeepRequests: -1})
	defer fake.Close()
	b.ReportAllocs()
	for b.Loop() {
		if w := serveDirect(fake, "POST", "/v1/responses", `{"model":"m","input":"hello there"}`); w.Code != 200 {
			b.Fatalf("status %d", w.Code)
		}
	}
}

func BenchmarkResponsesStream(b *testing.B) {
	fake := fakeprovider.New(fakeprovider.Options{KeepRequests: -1})
	defer fake.Close()
	b.ReportAllocs()
	for b.Loop() {
		if w := serveDirect(fake, "POST", "/v1/responses", `{"model":"m","input":"hello there","stream":true}`); w.Code != 200 {
			b.Fatalf("status %d", w.Code)
		}
	}
}
