package demo_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmgate/llmgate/cmd/gateway/demo"
)

func demoBody(model, prompt string, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model":    model,
		"stream":   stream,
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	return string(b)
}

// statuses posts body n times and returns the statuses, and the
// Retry-After of each.
func statuses(t *testing.T, srv *httptest.Server, body string, n int) (codes []int, retryAfter []string) {
	t.Helper()
	for range n {
		resp, err := post(testCtx(t), srv, "/v1/chat/completions", body)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		retryAfter = append(retryAfter, resp.Header.Get("Retry-After"))
	}
	return codes, retryAfter
}

func TestDemoFlakyCyclesPerBody(t *testing.T) {
	_, srv := start(t, demo.Options{DemoModels: true})
	a := demoBody(demo.DemoFlaky, "a", false)
	b := demoBody(demo.DemoFlaky, "b", false)

	got, _ := statuses(t, srv, a, 2)
	// Another body in between starts a cycle of its own.
	if other, _ := statuses(t, srv, b, 1); other[0] != 503 {
		t.Errorf("first call with another body: %d, want 503", other[0])
	}
	more, _ := statuses(t, srv, a, 4)
	got = append(got, more...)
	if want := []int{503, 503, 200, 503, 503, 200}; !slices.Equal(got, want) {
		t.Errorf("demo-flaky statuses %v, want %v", got, want)
	}
}

func TestDemoRateLimited(t *testing.T) {
	_, srv := start(t, demo.Options{DemoModels: true})
	got, ra := statuses(t, srv, demoBody(demo.DemoRateLimited, "x", false), 3)
	if want := []int{429, 200, 429}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	if ra[0] != "1" || ra[1] != "" {
		t.Errorf("Retry-After %q, want \"1\" on the 429 only", ra)
	}
}

func TestDemoAnswers(t *testing.T) {
	_, srv := start(t, demo.Options{DemoModels: true})
	for _, tc := range []struct {
		model, finish, content string
	}{
		{demo.DemoFiltered, "content_filter", "*"},
		{demo.DemoEmpty, "stop", ""},
	} {
		resp, err := post(testCtx(t), srv, "/v1/chat/completions", demoBody(tc.model, "hi", false))
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
				Message      struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || len(got.Choices) != 1 {
			t.Fatalf("%s: %d %+v %v", tc.model, resp.StatusCode, got, err)
		}
		c := got.Choices[0]
		if c.FinishReason != tc.finish || (tc.content != "*" && c.Message.Content != tc.content) {
			t.Errorf("%s: finish_reason %q content %q, want %q %q", tc.model, c.FinishReason, c.Message.Content, tc.finish, tc.content)
		}
	}
}

func TestDemoCut(t *testing.T) {
	_, srv := start(t, demo.Options{DemoModels: true})
	t.Run("stream", func(t *testing.T) {
		resp, err := post(testCtx(t), srv, "/v1/chat/completions", demoBody(demo.DemoCut, "hi", true))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		events, err := readEvents(resp.Body)
		if err != nil || len(events) != 3 || slices.Contains(events, "[DONE]") {
			t.Errorf("events %q (%v): want 3 and no [DONE]", events, err)
		}
	})
	t.Run("json", func(t *testing.T) {
		resp, err := post(testCtx(t), srv, "/v1/chat/completions", demoBody(demo.DemoCut, "hi", false))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil || len(b) != 40 {
			t.Errorf("read %d bytes, err %v: want 40 and an error", len(b), err)
		}
	})
}

// demo-down is down for DemoOutage from its first request, then up for
// good. The clock is synctest's: no real waiting.
func TestDemoDownOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fake := demo.New(demo.Options{DemoModels: true, DemoOutage: 30 * time.Second})
		defer fake.Close()
		status := func() int {
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
				strings.NewReader(demoBody(demo.DemoDown, "hi", false)))
			w := httptest.NewRecorder()
			fake.ServeHTTP(w, req)
			return w.Code
		}
		// The outage starts with the first request, not with New.
		time.Sleep(time.Minute)
		if got := status(); got != 503 {
			t.Fatalf("first request: %d, want 503", got)
		}
		time.Sleep(29 * time.Second)
		if got := status(); got != 503 {
			t.Fatalf("29s later: %d, want 503", got)
		}
		time.Sleep(time.Second)
		for range 3 {
			if got := status(); got != 200 {
				t.Fatalf("30s after the first request: %d, want 200", got)
			}
		}
	})
}

func TestDemoModelsListed(t *testing.T) {
	_, srv := start(t, demo.Options{DemoModels: true})
	list, err := client(srv, "k").ListModels(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Models {
		ids = append(ids, m.ID)
	}
	for _, d := range demo.Demos(0) {
		if !slices.Contains(ids, d.Model) {
			t.Errorf("GET /v1/models %v lacks %s", ids, d.Model)
		}
	}
	if !slices.Contains(ids, "gpt-4o-mini") {
		t.Errorf("GET /v1/models %v lacks the default models", ids)
	}
}
