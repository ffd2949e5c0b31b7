package fakeprovider_test

import (
	"encoding/json"
	"io"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/llmgate/llmgate/cmd/gateway/demo"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// The demo models and the script: a demo model is answered by its own
// script, every other request by the queue.

func demoBody(model, prompt string, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model":    model,
		"stream":   stream,
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	return string(b)
}

// statuses posts body n times and returns the statuses.
func statuses(t *testing.T, srv *httptest.Server, body string, n int) []int {
	t.Helper()
	var codes []int
	for range n {
		resp, err := post(testCtx(t), srv, "/v1/chat/completions", body)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	return codes
}

// Without DemoModels the demo names are models like any other: a test's
// script applies to them.
func TestDemoModelsOffByDefault(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{})
	fake.Enqueue(fakeprovider.Step{Status: 418})
	got := statuses(t, srv, demoBody(demo.DemoDown, "hi", false), 2)
	if want := []int{418, 200}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
}

// With DemoModels a demo model leaves the queue to the others.
func TestDemoModelsConsumeNoStep(t *testing.T) {
	fake, srv := start(t, fakeprovider.Options{DemoModels: true})
	fake.Enqueue(fakeprovider.Step{Status: 418})
	if got := statuses(t, srv, demoBody(demo.DemoFiltered, "hi", false), 1); got[0] != 200 {
		t.Errorf("demo-filtered: %d, want 200", got[0])
	}
	if got := statuses(t, srv, chatBody, 1); got[0] != 418 {
		t.Errorf("gpt-4o-mini after it: %d, want the queued 418", got[0])
	}
}
