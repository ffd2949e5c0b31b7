package config

import (
	"strings"
	"testing"
)

// The passthrough calls that spend unmetered, as the README's table
// lists them: POSTs that run a model (images, audio, batches of either
// API); not storage, not cancels, not reads or deletes. A POST under a
// family not listed as free counts as spending.
func TestSpendsUnmetered(t *testing.T) {
	for _, c := range []struct {
		method, path string
		spends       bool
	}{
		{"POST", "/v1/images/generations", true},
		{"POST", "/v1/images/edits", true},
		{"POST", "/v1/images/variations", true},
		{"POST", "/v1/audio/speech", true},
		{"POST", "/v1/audio/transcriptions", true},
		{"POST", "/v1/audio/translations", true},
		{"POST", "/v1/batches", true},
		{"POST", "/v1/messages/batches", true},
		{"POST", "/v1/fine_tuning/jobs", true}, // not routed today; spends if it ever is
		{"POST", "/v1/videos", true},
		{"POST", "/v1/batches/batch_1/cancel", false},
		{"POST", "/v1/messages/batches/msgbatch_1/cancel", false},
		{"POST", "/v1/responses/resp_1/cancel", false},
		{"POST", "/v1/moderations", false},
		{"POST", "/v1/files", false},
		{"POST", "/v1/uploads", false},
		{"POST", "/v1/uploads/upload_1/parts", false},
		{"POST", "/v1/uploads/upload_1/complete", false},
		{"POST", "/v1/vector_stores", false},
		{"POST", "/v1/vector_stores/vs_1/files", false},
		{"POST", "/v1/conversations", false},
		{"POST", "/v1/conversations/conv_1/items", false},
		{"POST", "/v1/batches/batch_1/extra/cancel", true}, // not one id segment
		{"POST", "/v1/filesx", true},                       // not under /v1/files
		{"GET", "/v1/batches", false},
		{"GET", "/v1/messages/batches/msgbatch_1/results", false},
		{"DELETE", "/v1/messages/batches/msgbatch_1", false},
		{"GET", "/v1/images/generations", false},
	} {
		if got := SpendsUnmetered(c.method, c.path); got != c.spends {
			t.Errorf("SpendsUnmetered(%s %s) = %v, want %v", c.method, c.path, got, c.spends)
		}
	}
}

// budgets.allow_unmetered is every budgeted client's default; a
// client's own allow_unmetered wins either way; setting it on a client
// with no budget is an error naming the field.
func TestAllowUnmeteredConfig(t *testing.T) {
	cfg, err := Load([]byte(`
upstreams: [{name: openai, base_url: "https://api.openai.com/v1", api_key: sk-x}]
budgets: {allow_unmetered: true}
clients:
  - {name: a, key: key-a, budgets: [{window: day, tokens: 10}]}
  - {name: b, key: key-b, budgets: [{window: day, tokens: 10}], allow_unmetered: false}
  - {name: c, key: key-c, limits: {tokens_per_minute: 5}, allow_unmetered: true}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, true} {
		if got := cfg.Clients[i].UnmeteredAllowed(cfg.Budgets.AllowUnmetered); got != want {
			t.Errorf("client %s: allowed %v, want %v", cfg.Clients[i].Name, got, want)
		}
	}
	if (Client{}).UnmeteredAllowed(false) {
		t.Error("allowed by default")
	}
	_, err = Load([]byte(`
upstreams: [{name: openai, base_url: "https://api.openai.com/v1", api_key: sk-x}]
clients:
  - {name: a, key: key-a, budgets: [{window: day, tokens: 10}]}
  - {name: b, key: key-b, allow_unmetered: true}
`), nil)
	if err == nil || !strings.Contains(err.Error(), "clients[1].allow_unmetered") {
		t.Fatalf("err = %v, want one naming clients[1].allow_unmetered", err)
	}
	if _, err = Load([]byte("budgets: {allow_unmetered: maybe}\n"), nil); err == nil || !strings.Contains(err.Error(), "line 1: cannot unmarshal !!str `maybe` into bool") {
		t.Fatalf("err = %v, want one naming the line of allow_unmetered", err)
	}
}
