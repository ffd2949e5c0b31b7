package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cmd/gateway/demo"
	"github.com/llmgate/llmgate/gateway/tracing/receivertest"
)

// OTEL_EXPORTER_OTLP_ENDPOINT alone turns tracing on, and the spans of the
// last requests are exported at shutdown, not lost with the process.
func TestTracingFromEnvironmentFlushedAtShutdown(t *testing.T) {
	rec := receivertest.New(t)
	up := httptest.NewServer(demo.New(demo.Options{}))
	t.Cleanup(up.Close)
	env := map[string]string{
		"GATEWAY_ADDR":                "127.0.0.1:0",
		"GATEWAY_DATA_DIR":            t.TempDir(),
		"OPENAI_BASE_URL":             up.URL + "/v1",
		"OPENAI_API_KEY":              "sk-upstream",
		"OTEL_EXPORTER_OTLP_ENDPOINT": rec.Base,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, stdout := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, nil, func(k string) string { return env[k] }, stdout, io.Discard)
		stdout.Close()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("no listening line: %v (run: %v)", err, <-done)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	url := strings.TrimSpace(strings.TrimPrefix(line, "llmgate listening on "))

	client := &http.Client{Timeout: 30 * time.Second}
	res, err := client.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	var server, attempts int
	for _, s := range rec.Spans() {
		switch s.Name {
		case "POST /v1/chat/completions":
			server++
			if s.Attrs["gen_ai.operation.name"] != "chat" || s.Attrs["llmgate.upstream"] != "openai" {
				t.Errorf("request span %v", s.Attrs)
			}
		case "chat gpt-4o-mini":
			attempts++
		}
	}
	if server != 1 || attempts != 1 {
		t.Errorf("%d request and %d attempt spans exported by shutdown, want 1 and 1", server, attempts)
	}
}
