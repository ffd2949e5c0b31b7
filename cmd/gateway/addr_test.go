package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAddrFlag: -addr sets the listen address over GATEWAY_ADDR, which
// sets it over the file's listen; the address is validated as listen is
// (a non-loopback one needs clients or allow_insecure_listen).
func TestAddrFlag(t *testing.T) {
	file := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(file, []byte("listen: 127.0.0.1:5555\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  func(string) string
		want string
	}{
		{"default", nil, env("OPENAI_API_KEY", "sk-test"), "listen: 127.0.0.1:8080"},
		{"the file", []string{"-config", file}, env("OPENAI_API_KEY", "sk-test"), "listen: 127.0.0.1:5555"},
		{"GATEWAY_ADDR over the file", []string{"-config", file}, env("OPENAI_API_KEY", "sk-test", "GATEWAY_ADDR", "127.0.0.1:7777"), "listen: 127.0.0.1:7777"},
		{"-addr over GATEWAY_ADDR and the file", []string{"-config", file, "-addr", "127.0.0.1:9999"}, env("OPENAI_API_KEY", "sk-test", "GATEWAY_ADDR", "127.0.0.1:7777"), "listen: 127.0.0.1:9999"},
		{"-addr alone", []string{"-addr", "localhost:8181"}, env("OPENAI_API_KEY", "sk-test"), "listen: localhost:8181"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if out := checkConfig(t, tc.args, tc.env); !strings.Contains(out, "\n"+tc.want+"\n") {
				t.Errorf("want %q in\n%s", tc.want, out)
			}
		})
	}
	var out, errs bytes.Buffer
	err := run(t.Context(), []string{"-addr", "0.0.0.0:8080", "-check-config"}, env("OPENAI_API_KEY", "sk-test"), &out, &errs)
	if err == nil || !strings.Contains(err.Error(), "-addr") || !strings.Contains(err.Error(), "allow_insecure_listen") {
		t.Errorf("-addr 0.0.0.0:8080 with no clients: %v, want the listen check naming -addr", err)
	}
}

// -check-config prints the configuration's warnings on stderr, apart
// from the configuration it prints on stdout: with clients and no
// forward_key_secret, one naming the field; with the secret, none.
func TestCheckConfigWarns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	cfg := "upstreams:\n  - {name: openai, base_url: https://api.openai.com/v1, api_key: sk-test, models: ['*']}\n" +
		"clients:\n  - {name: team-a, key: k-team-a-0123456789abcdef}\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  func(string) string
		warn bool
	}{{env(), true}, {env("GATEWAY_FORWARD_KEY_SECRET", "a-long-random-value"), false}} {
		var out, errs bytes.Buffer
		if err := run(t.Context(), []string{"-config", path, "-check-config"}, tc.env, &out, &errs); err != nil {
			t.Fatalf("run: %v\n%s", err, errs.String())
		}
		if got := strings.Contains(errs.String(), "warning: idempotency.forward_key_secret is empty"); got != tc.warn {
			t.Fatalf("warned %v, want %v; stderr:\n%s", got, tc.warn, errs.String())
		}
		if !strings.HasPrefix(out.String(), "configuration OK\n") || strings.Contains(out.String(), "warning") {
			t.Fatalf("stdout:\n%s", out.String())
		}
	}
}
