package demo_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	openai3 "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/sashabaranov/go-openai"
	"go.uber.org/goleak"

	"github.com/llmgate/llmgate/cmd/gateway/demo"
)

// Every wait in the simulated upstream selects on the request context, so
// no handler may outlive its test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start serves a new simulated upstream on loopback until the test ends.
func start(t testing.TB, o demo.Options) (*demo.Server, *httptest.Server) {
	t.Helper()
	up := demo.New(o)
	srv := httptest.NewServer(up)
	t.Cleanup(func() {
		up.Close()
		srv.Close()
	})
	return up, srv
}

func client(srv *httptest.Server, key string) *openai.Client {
	cfg := openai.DefaultConfig(key)
	cfg.BaseURL = srv.URL + "/v1"
	cfg.HTTPClient = srv.Client()
	return openai.NewClientWithConfig(cfg)
}

// sdk is an official-SDK client of the upstream that never retries, so
// every call is one request.
func sdk(srv *httptest.Server) openai3.Client {
	return openai3.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("k"),
		option.WithHTTPClient(srv.Client()), option.WithMaxRetries(0))
}

func askParams(prompt string) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model: "gpt-4o-mini",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai3.String(prompt)},
	}
}

// testCtx is a deadline for reads that must not block; hitting it fails
// the test instead of hanging it.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// post sends body to the upstream raw, to see what a gateway sees.
func post(ctx context.Context, srv *httptest.Server, path, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return srv.Client().Do(req)
}

// readEvents reads the data of each server-sent event until the body
// ends; a clean end is a nil error.
func readEvents(body io.Reader) ([]string, error) {
	r := bufio.NewReader(body)
	var events, data []string
	for {
		line, err := r.ReadString('\n')
		if errors.Is(err, io.EOF) {
			return events, nil
		}
		if err != nil {
			return events, err
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			if data != nil {
				events = append(events, strings.Join(data, "\n"))
				data = nil
			}
			continue
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			data = append(data, d)
		}
	}
}

// streamed runs one streamed Responses request and returns its events.
func streamed(t *testing.T, c openai3.Client, p responses.ResponseNewParams) ([]responses.ResponseStreamEventUnion, error) {
	t.Helper()
	s := c.Responses.NewStreaming(testCtx(t), p)
	defer s.Close()
	var events []responses.ResponseStreamEventUnion
	for s.Next() {
		events = append(events, s.Current())
	}
	return events, s.Err()
}
