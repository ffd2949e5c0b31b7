package metrics

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/classify"
)

func TestTokenSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, []string{"gpt-4o-mini"})
	m.SetClients([]string{"alice", "bob"})

	m.Usage("openai", "chat_completions", "gpt-4o-mini", "alice", classify.Tokens{In: 10, Out: 3, Reported: true})
	m.Usage("openai", "chat_completions", "gpt-4o-mini", "alice", classify.Tokens{In: 5, Out: 2, Reported: true})
	m.Usage("openai", "embeddings", "gpt-4o-mini", "bob", classify.Tokens{In: 8, Reported: true})
	// A name no longer configured (a removed client's dead letter) counts
	// under "".
	m.Usage("openai", "chat_completions", "gpt-4o-mini", "mallory", classify.Tokens{In: 1, Out: 1, Reported: true})
	m.Usage("openai", "chat_completions", "gpt-4o-mini", "alice", classify.Tokens{})
	m.UsageSaved("openai", "gpt-4o-mini", "alice", classify.Tokens{In: 10, Out: 3, Reported: true})
	m.UsageSaved("openai", "gpt-4o-mini", "alice", classify.Tokens{}) // a record without usage

	want := map[string]float64{
		`llmgate_tokens_total{client="",kind="input",model="gpt-4o-mini",upstream="openai"}`:       1,
		`llmgate_tokens_total{client="",kind="output",model="gpt-4o-mini",upstream="openai"}`:      1,
		`llmgate_tokens_total{client="alice",kind="input",model="gpt-4o-mini",upstream="openai"}`:  15,
		`llmgate_tokens_total{client="alice",kind="output",model="gpt-4o-mini",upstream="openai"}`: 5,
		`llmgate_tokens_total{client="bob",kind="input",model="gpt-4o-mini",upstream="openai"}`:    8,
		`llmgate_tokens_total{client="bob",kind="output",model="gpt-4o-mini",upstream="openai"}`:   0,

		`llmgate_tokens_saved_total{client="alice",kind="input",model="gpt-4o-mini",upstream="openai"}`:  10,
		`llmgate_tokens_saved_total{client="alice",kind="output",model="gpt-4o-mini",upstream="openai"}`: 3,

		`llmgate_usage_missing_total{endpoint="chat_completions",upstream="openai"}`: 1,
	}
	if got := counters(t, reg, "llmgate_tokens_total", "llmgate_tokens_saved_total", "llmgate_usage_missing_total"); !reflect.DeepEqual(got, want) {
		t.Fatalf("series:\n%v\nwant\n%v", got, want)
	}

	got := m.TokenTotals()
	wantTotals := TokenTotals{Input: 24, Output: 6, SavedInput: 10, SavedOutput: 3, UsageMissing: 1, By: []TokenCount{
		{Upstream: "openai", Model: "gpt-4o-mini", Client: "", Input: 1, Output: 1},
		{Upstream: "openai", Model: "gpt-4o-mini", Client: "alice", Input: 15, Output: 5, SavedInput: 10, SavedOutput: 3},
		{Upstream: "openai", Model: "gpt-4o-mini", Client: "bob", Input: 8},
	}}
	if !reflect.DeepEqual(got, wantTotals) {
		t.Fatalf("TokenTotals() = %+v\nwant %+v", got, wantTotals)
	}
}

// The model label of the token series is llmgate_requests_total's: a
// wildcard-matched name is learned up to the cap, then folds into "other".
func TestTokenSeriesModelBound(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, nil)
	for i := range maxModelLabels + 10 {
		m.Usage("u", "chat_completions", "model-"+string(rune('A'+i%26))+strings.Repeat("x", i), "", classify.Tokens{In: 1, Reported: true})
	}
	models := map[string]bool{}
	for _, c := range m.TokenTotals().By {
		models[c.Model] = true
	}
	if len(models) != maxModelLabels+1 || !models["other"] {
		t.Fatalf("%d model labels (other: %v), want %d and other", len(models), models["other"], maxModelLabels+1)
	}
}

// counters gathers the named counter families from reg as
// name{label="value",...} → value, labels in the order Gather sorts them.
func counters(t *testing.T, reg *prometheus.Registry, names ...string) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if !slices.Contains(names, f.GetName()) {
			continue
		}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, lp.GetName()+`="`+lp.GetValue()+`"`)
			}
			out[f.GetName()+"{"+strings.Join(ls, ",")+"}"] = m.GetCounter().GetValue()
		}
	}
	return out
}

// TestModelLabelsShared: one client may learn at most half the model
// labels; another's models still get their own label after it named a
// hundred. A label another client learned is anyone's. Before, one tenant
// naming 64 models took every label, and every later model of every
// tenant counted as "other".
func TestModelLabelsShared(t *testing.T) {
	m := New(prometheus.NewRegistry(), nil)
	for i := range 100 {
		m.Usage("u", "chat_completions", fmt.Sprintf("flood-%d", i), "mallory", classify.Tokens{In: 1, Reported: true})
	}
	if got := m.ModelLabel("alice", "flood-0", true, true); got != "flood-0" {
		t.Errorf("a label mallory learned, for alice: %q", got)
	}
	if got := m.ModelLabel("alice", "gpt-5", true, true); got != "gpt-5" {
		t.Fatalf("alice's model after mallory's flood: %q, want its own label", got)
	}
	if got := m.ModelLabel("mallory", "flood-100", true, true); got != "other" {
		t.Errorf("mallory past her half: %q, want other", got)
	}
	learned := 0
	for i := range 100 {
		if m.ModelLabel("", fmt.Sprintf("flood-%d", i), true, false) != "other" {
			learned++
		}
	}
	if learned != maxModelLabels/2 {
		t.Errorf("mallory's models have %d labels, want her half, %d", learned, maxModelLabels/2)
	}
}

// A model name that is not UTF-8 is never a label value: the Prometheus
// client panics on one.
func TestModelLabelNotUTF8(t *testing.T) {
	m := New(prometheus.NewRegistry(), nil)
	if got := m.ModelLabel("", "m-\xff", true, true); got != "other" {
		t.Fatalf("label %q, want other", got)
	}
	m.Usage("u", "chat_completions", "m-\xfe", "", classify.Tokens{In: 1, Reported: true}) // must not panic
}
