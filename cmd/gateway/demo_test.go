package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/admin"
)

// env is a getenv over a fixed map: the tests see none of the machine's
// environment (an OPENAI_API_KEY there must not change them).
func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// checkConfig runs -check-config with args and returns the printed
// configuration.
func checkConfig(t *testing.T, args []string, getenv func(string) string) string {
	t.Helper()
	var out, errs bytes.Buffer
	if err := run(t.Context(), append(args, "-check-config"), getenv, &out, &errs); err != nil {
		t.Fatalf("run %v: %v\n%s", args, err, errs.String())
	}
	return out.String()
}

// field returns the value of the first line "  name: value" in a printed
// configuration after the line starting section.
func field(t *testing.T, printed, section, name string) string {
	t.Helper()
	_, after, ok := strings.Cut(printed, "\n"+section+":\n")
	if !ok {
		t.Fatalf("no section %q in\n%s", section, printed)
	}
	m := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(name) + `: (.*)$`).FindStringSubmatch(after)
	if m == nil {
		t.Fatalf("no %s.%s in\n%s", section, name, printed)
	}
	return m[1]
}

func TestDemoConfig(t *testing.T) {
	t.Run("demo", func(t *testing.T) {
		got := checkConfig(t, []string{"-demo"}, env())
		if v := field(t, got, "breaker", "open_timeout"); v != "10s" {
			t.Errorf("breaker.open_timeout %s, want 10s", v)
		}
		if v := field(t, got, "retry", "base_delay"); v != "250ms" {
			t.Errorf("retry.base_delay %s, want 250ms", v)
		}
		if !strings.Contains(got, "admin_token: <redacted>") {
			t.Errorf("no admin token set:\n%s", got)
		}
		if !strings.Contains(got, "- name: demo-down") || !strings.Contains(got, "- name: demo\n") {
			t.Errorf("want the upstreams demo-down and demo:\n%s", got)
		}
	})
	t.Run("demo keeps what the file sets", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "gateway.yaml")
		if err := os.WriteFile(path, []byte("breaker:\n  open_timeout: 2s\nretry:\n  base_delay: 5ms\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		got := checkConfig(t, []string{"-demo", "-config", path}, env())
		if v := field(t, got, "breaker", "open_timeout"); v != "2s" {
			t.Errorf("breaker.open_timeout %s, want the file's 2s", v)
		}
		if v := field(t, got, "retry", "base_delay"); v != "5ms" {
			t.Errorf("retry.base_delay %s, want the file's 5ms", v)
		}
	})
	t.Run("without -demo", func(t *testing.T) {
		got := checkConfig(t, nil, env("OPENAI_API_KEY", "sk-test"))
		def := config.Default()
		if v := field(t, got, "breaker", "open_timeout"); v != def.Breaker.OpenTimeout.String() {
			t.Errorf("breaker.open_timeout %s, want the default %s", v, def.Breaker.OpenTimeout)
		}
		if !strings.Contains(got, `admin_token: ""`) || strings.Contains(got, "demo") {
			t.Errorf("a run without -demo got demo settings:\n%s", got)
		}
	})
}

// syncBuffer is a bytes.Buffer that run's goroutines and the test may
// share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// The banner goes to stdout with the token and the sign-in link; the logs
// (stderr) never carry either.
func TestDemoBanner(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-demo"}, env("GATEWAY_ADDR", "127.0.0.1:0", "GATEWAY_DATA_DIR", t.TempDir()), &stdout, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v\n%s", err, stderr.String())
		}
	})

	signIn := regexp.MustCompile(`sign in: +(http://\S+` + regexp.QuoteMeta(admin.SignInCodePath) + `\?code=(\S+))`)
	deadline := time.Now().Add(20 * time.Second)
	for !signIn.MatchString(stdout.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("no banner within 20s:\n%s\n%s", stdout.String(), stderr.String())
		}
		select {
		case err := <-done:
			t.Fatalf("run ended: %v\n%s", err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	banner := stdout.String()
	token := regexp.MustCompile(`export TOKEN=(\S+)`).FindStringSubmatch(banner)
	base := regexp.MustCompile(`llmgate listening on (\S+)`).FindStringSubmatch(banner)
	if token == nil || base == nil {
		t.Fatalf("banner without the token or the address:\n%s", banner)
	}
	code := signIn.FindStringSubmatch(banner)[2]
	for _, model := range []string{"demo-flaky", "demo-ratelimited", "demo-down", "demo-filtered", "demo-empty", "demo-cut"} {
		if !regexp.MustCompile(`(?m)^    (for i in .*)?curl .*"model":"` + model + `"`).MatchString(banner) {
			t.Errorf("no curl line for %s in\n%s", model, banner)
		}
	}
	if logs := stderr.String(); strings.Contains(logs, token[1]) || strings.Contains(logs, code) {
		t.Errorf("the logs carry the admin token or the sign-in code:\n%s", logs)
	}

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base[1]+"/admin/breakers", nil)
	req.Header.Set("Authorization", "Bearer "+token[1])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Breakers []struct{ Name, Model, State string }
	}
	// Each upstream's own breaker, and demo-down's model breaker (the one
	// model the configuration names exactly).
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != 200 || len(v.Breakers) != 4 ||
		v.Breakers[3].Name != "demo-down" || v.Breakers[3].Model != "demo-down" {
		t.Fatalf("GET /admin/breakers with the printed token: %d %+v %v", resp.StatusCode, v, err)
	}

	// claude-* models are answered on Anthropic's Messages API.
	if !strings.Contains(banner, base[1]+"/v1/messages") {
		t.Errorf("no /v1/messages line in the banner:\n%s", banner)
	}
	mreq, _ := http.NewRequestWithContext(ctx, http.MethodPost, base[1]+"/v1/messages",
		strings.NewReader(`{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"Hello"}]}`))
	mreq.Header.Set("Content-Type", "application/json")
	mresp, err := http.DefaultClient.Do(mreq)
	if err != nil {
		t.Fatal(err)
	}
	defer mresp.Body.Close()
	var m struct {
		Type       string `json:"type"`
		StopReason string `json:"stop_reason"`
	}
	if err := json.NewDecoder(mresp.Body).Decode(&m); err != nil || mresp.StatusCode != 200 || mresp.Header.Get("X-Llmgate-Upstream") != "demo-anthropic" ||
		m.Type != "message" || m.StopReason != "end_turn" {
		t.Fatalf("POST /v1/messages: %d %s %+v %v", mresp.StatusCode, mresp.Header.Get("X-Llmgate-Upstream"), m, err)
	}
}
