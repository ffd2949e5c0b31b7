package e2e

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

func newFake(t *testing.T, o fakeprovider.Options) (*fakeprovider.Server, string) {
	t.Helper()
	f := fakeprovider.New(o)
	s := httptest.NewServer(f)
	t.Cleanup(s.Close)
	t.Cleanup(f.Close)
	return f, s.URL
}

func openaiClient(baseURL string) *openai.Client {
	c := openai.DefaultConfig("any-client-key")
	c.BaseURL = baseURL + "/v1"
	c.HTTPClient = httpClient
	return openai.NewClientWithConfig(c)
}

func TestSDKThroughGateway(t *testing.T) {
	fake, upURL := newFake(t, fakeprovider.Options{})
	p := start(t, gatewayBin(t, ""), []string{"-config", writeConfig(t, t.TempDir(), upURL, "")}, nil)
	client := openaiClient(p.URL)
	ctx := context.Background()

	resp, err := client.CreateChatCompletion(ctx, openai.ChatCompletionRequest{
		Model:    openai.GPT4oMini,
		Messages: []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: "Hello"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content == "" || resp.Usage.TotalTokens == 0 {
		t.Fatalf("completion %+v", resp)
	}

	stream, err := client.CreateChatCompletionStream(ctx, openai.ChatCompletionRequest{
		Model:         openai.GPT4oMini,
		Messages:      []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: "Stream please"}},
		Stream:        true,
		StreamOptions: &openai.StreamOptions{IncludeUsage: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	var usage *openai.Usage
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(chunk.Choices) > 0 {
			text.WriteString(chunk.Choices[0].Delta.Content)
		}
		if chunk.Usage != nil {
			usage = chunk.Usage
		}
	}
	stream.Close()
	if text.Len() == 0 || usage == nil {
		t.Fatalf("stream text %q usage %v", text.String(), usage)
	}

	emb, err := client.CreateEmbeddings(ctx, openai.EmbeddingRequest{Model: openai.SmallEmbedding3, Input: []string{"a", "b"}})
	if err != nil || len(emb.Data) != 2 {
		t.Fatalf("embeddings %v %+v", err, emb)
	}
	models, err := client.ListModels(ctx)
	if err != nil || len(models.Models) == 0 {
		t.Fatalf("models %v %+v", err, models)
	}
	// The client's key never reached the upstream; the upstream's did.
	for _, r := range fake.Requests() {
		if strings.Contains(r.Header.Get("Authorization"), "any-client-key") {
			t.Fatal("client key forwarded")
		}
	}
	if strings.Contains(p.stderr.String(), "sk-e2e-upstream-key") {
		t.Fatal("upstream key in the logs")
	}
}

func TestSDKSeesGatewayErrors(t *testing.T) {
	_, upURL := newFake(t, fakeprovider.Options{})
	p := start(t, gatewayBin(t, ""), []string{"-config", writeConfig(t, t.TempDir(), upURL, "clients:\n  - name: team-a\n    key: team-a-key\n")}, nil)
	_, err := openaiClient(p.URL).CreateChatCompletion(context.Background(), openai.ChatCompletionRequest{Model: "gpt-4o"})
	var apiErr *openai.APIError
	if !errors.As(err, &apiErr) || apiErr.HTTPStatusCode != 401 || apiErr.Message == "" {
		t.Fatalf("want a 401 APIError, got %v", err)
	}
}

func TestGracefulShutdownFinishesStream(t *testing.T) {
	fake, upURL := newFake(t, fakeprovider.Options{ChunkDelay: 100 * time.Millisecond, Chunks: 10})
	p := start(t, gatewayBin(t, ""), []string{"-config", writeConfig(t, t.TempDir(), upURL, "")}, nil)
	req, _ := http.NewRequest(http.MethodPost, p.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"long"}]}`))
	res, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	if _, err := br.ReadString('\n'); err != nil { // the stream has started
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("stream broken by shutdown: %v", err)
	}
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("stream did not finish: %q", rest)
	}
	if err := p.wait(15 * time.Second); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.stderr.String())
	}
	if fake.Calls("") != 1 {
		t.Fatalf("calls %d", fake.Calls(""))
	}
}

func TestDataDirLockedIsAClearError(t *testing.T) {
	_, upURL := newFake(t, fakeprovider.Options{})
	dir := t.TempDir()
	cfg := writeConfig(t, dir, upURL, "")
	start(t, gatewayBin(t, ""), []string{"-config", cfg}, nil)
	out, err := exec.Command(gatewayBin(t, ""), "-config", cfg).CombinedOutput()
	if err == nil {
		t.Fatal("a second gateway opened the same data dir")
	}
	if !strings.Contains(string(out), dir) || !strings.Contains(strings.ToLower(string(out)), "another") {
		t.Fatalf("error does not name the directory and the cause: %s", out)
	}
}

func TestCheckConfig(t *testing.T) {
	_, upURL := newFake(t, fakeprovider.Options{})
	good := writeConfig(t, t.TempDir(), upURL, "")
	out, err := exec.Command(gatewayBin(t, ""), "-check-config", "-config", good).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "configuration OK") || strings.Contains(string(out), "sk-e2e-upstream-key") {
		t.Fatalf("good config: %v\n%s", err, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	writeFile(t, bad, "listen: 127.0.0.1:0\nupstreams:\n  - name: a\n    base_url: \"\"\n  - name: a\n    base_url: http://x\nretry:\n  base_delay: 5\nbogus: 1\n")
	out, err = exec.Command(gatewayBin(t, ""), "-check-config", "-config", bad).CombinedOutput()
	if err == nil {
		t.Fatalf("bad config accepted:\n%s", out)
	}
	for _, want := range []string{"bogus", "base_url", "duplicate"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("error lacks %q:\n%s", want, out)
		}
	}
}

func TestDemoMode(t *testing.T) {
	p := start(t, gatewayBin(t, ""), []string{"-demo"}, []string{"GATEWAY_ADDR=127.0.0.1:0", "GATEWAY_DATA_DIR=" + t.TempDir(), "OPENAI_API_KEY=", "OPENAI_BASE_URL="})
	resp, err := openaiClient(p.URL).CreateChatCompletion(context.Background(), openai.ChatCompletionRequest{
		Model:    "gpt-4o-mini",
		Messages: []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: "Hello demo"}},
	})
	if err != nil || !strings.Contains(resp.Choices[0].Message.Content, "Hello demo") {
		t.Fatalf("demo completion: %v %+v", err, resp)
	}
}
