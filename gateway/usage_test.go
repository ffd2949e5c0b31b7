package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// Issue 16: the token counters say what the usage fields the upstream sent
// say — for JSON answers, streams with and without include_usage,
// embeddings and legacy completions — and replays count as tokens saved,
// from the committed answer's usage, without counting as tokens used.
func TestTokenUsage(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Clients = []config.Client{{Name: "alice", Key: "key-alice"}, {Name: "bob", Key: "key-bob"}}
	})
	as := func(client string, kv ...string) map[string]string {
		hdr := map[string]string{"Authorization": "Bearer key-" + client}
		for i := 0; i < len(kv); i += 2 {
			hdr[kv[i]] = kv[i+1]
		}
		return hdr
	}
	const (
		chatPath    = "/v1/chat/completions"
		legacyPath  = "/v1/completions"
		embedPath   = "/v1/embeddings"
		plainStream = `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Hello"}]}`
		legacyBody  = `{"model":"gpt-4o-mini","prompt":"Once upon a time"}`
		legacyUsage = `{"model":"gpt-4o-mini","prompt":"Once","stream":true,"stream_options":{"include_usage":true}}`
		embedBody   = `{"model":"text-embedding-3-small","input":["alpha","a longer second input to embed"]}`
	)
	// count: what the answer adds — "tokens" (its usage, as used),
	// "saved" (its usage, as saved by a replay), "missing" (one answer
	// without usage), "nothing".
	steps := []struct {
		name, path, body string
		hdr              map[string]string
		count            string
		client, model    string
		endpoint         string
	}{
		{"json", chatPath, chatBody, as("alice"), "tokens", "alice", "gpt-4o-mini", ""},
		{"stream with include_usage", chatPath, streamBody, as("bob"), "tokens", "bob", "gpt-4o-mini", ""},
		{"stream without include_usage", chatPath, plainStream, as("alice"), "missing", "", "", "chat_completions"},
		{"embeddings", embedPath, embedBody, as("alice"), "tokens", "alice", "text-embedding-3-small", ""},
		{"legacy completion", legacyPath, legacyBody, as("bob"), "tokens", "bob", "gpt-4o-mini", ""},
		{"legacy stream with include_usage", legacyPath, legacyUsage, as("bob"), "tokens", "bob", "gpt-4o-mini", ""},

		{"keyed json", chatPath, chatBody, as("alice", "Idempotency-Key", "u-json"), "tokens", "alice", "gpt-4o-mini", ""},
		{"keyed json replayed", chatPath, chatBody, as("alice", "Idempotency-Key", "u-json"), "saved", "alice", "gpt-4o-mini", ""},
		{"keyed stream", chatPath, streamBody, as("bob", "Idempotency-Key", "u-stream"), "tokens", "bob", "gpt-4o-mini", ""},
		{"keyed stream replayed", chatPath, streamBody, as("bob", "Idempotency-Key", "u-stream"), "saved", "bob", "gpt-4o-mini", ""},
		{"keyed stream without usage", chatPath, plainStream, as("bob", "Idempotency-Key", "u-plain"), "missing", "", "", "chat_completions"},
		{"its replay saves nothing known", chatPath, plainStream, as("bob", "Idempotency-Key", "u-plain"), "nothing", "", "", ""},
		{"cached embeddings", embedPath, embedBody, as("bob", "X-Llmgate-Cache", "on"), "tokens", "bob", "text-embedding-3-small", ""},
		{"cache hit", embedPath, embedBody, as("bob", "X-Llmgate-Cache", "on"), "saved", "bob", "text-embedding-3-small", ""},
	}
	for _, st := range steps {
		before := tokenSeries(t, h)
		calls := h.fake.Calls("")
		r := h.do(http.MethodPost, st.path, st.body, st.hdr)
		if r.status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", st.name, r.status, r.body)
		}
		replayed := r.header.Get("Idempotent-Replayed") == "true" || r.header.Get("X-Llmgate-Cache") == "hit"
		if replayed != (st.count == "saved" || st.count == "nothing") || replayed != (h.fake.Calls("") == calls) {
			t.Fatalf("%s: replayed %v with %d upstream calls", st.name, replayed, h.fake.Calls("")-calls)
		}
		in, out, ok := sentUsage(t, r)
		want := map[string]float64{}
		switch st.count {
		case "tokens", "saved":
			if !ok {
				t.Fatalf("%s: the answer carries no usage: %s", st.name, r.body)
			}
			name := "llmgate_tokens_total"
			if st.count == "saved" {
				name = "llmgate_tokens_saved_total"
			}
			labels := `{client="` + st.client + `",kind="%s",model="` + st.model + `",upstream="primary"}`
			want[name+strings.Replace(labels, "%s", "input", 1)] = in
			want[name+strings.Replace(labels, "%s", "output", 1)] = out
		case "missing":
			if ok {
				t.Fatalf("%s: the answer carries usage: %s", st.name, r.body)
			}
			want[`llmgate_usage_missing_total{endpoint="`+st.endpoint+`",upstream="primary"}`] = 1
		}
		if got := deltas(before, tokenSeries(t, h)); !equalDeltas(got, want) {
			t.Errorf("%s: counters moved by %v, want %v", st.name, got, want)
		}
	}
}

// A keyed call that runs on after its client's deadline is counted when
// it ends, not when the client stopped waiting.
func TestTokenUsageOfADetachedCall(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.Enqueue(fakeprovider.Step{Delay: 300 * time.Millisecond})
	hdr := map[string]string{"Idempotency-Key": "u-late", DeadlineHeader: "50ms"}
	before := tokenSeries(t, h)
	if r := h.chat(chatBody, hdr); r.status != http.StatusGatewayTimeout {
		t.Fatalf("status %d, want 504: %s", r.status, r.body)
	}
	const series = `llmgate_tokens_total{client="",kind="input",model="gpt-4o-mini",upstream="primary"}`
	deadline := time.Now().Add(10 * time.Second)
	for tokenSeries(t, h)[series] == before[series] {
		if time.Now().After(deadline) {
			t.Fatal("the detached call's tokens were never counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The retry replays what the detached call committed: the tokens it
	// counted are now saved.
	r := h.chat(chatBody, map[string]string{"Idempotency-Key": "u-late"})
	in, out, ok := sentUsage(t, r)
	if r.header.Get("Idempotent-Replayed") != "true" || !ok {
		t.Fatalf("retry: %d %v %s", r.status, r.header, r.body)
	}
	got := deltas(before, tokenSeries(t, h))
	want := map[string]float64{
		series: in,
		`llmgate_tokens_total{client="",kind="output",model="gpt-4o-mini",upstream="primary"}`:       out,
		`llmgate_tokens_saved_total{client="",kind="input",model="gpt-4o-mini",upstream="primary"}`:  in,
		`llmgate_tokens_saved_total{client="",kind="output",model="gpt-4o-mini",upstream="primary"}`: out,
	}
	if !equalDeltas(got, want) {
		t.Fatalf("counters moved by %v, want %v", got, want)
	}
	if tt := h.gw.metrics.TokenTotals(); tt.Input != int64(in) || tt.SavedOutput != int64(out) || tt.UsageMissing != 0 {
		t.Fatalf("TokenTotals() = %+v", tt)
	}
}

// sentUsage reads the usage the answer the client got carries, with
// encoding/json: a JSON body's, or the stream chunk's whose usage is not
// null.
func sentUsage(t *testing.T, r result) (in, out float64, ok bool) {
	t.Helper()
	type usage struct {
		Usage *struct {
			PromptTokens     float64 `json:"prompt_tokens"`
			CompletionTokens float64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	var payloads [][]byte
	if strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
		for line := range bytes.SplitSeq(r.body, []byte("\n")) {
			if d, found := bytes.CutPrefix(line, []byte("data: ")); found && string(d) != "[DONE]" {
				payloads = append(payloads, d)
			}
		}
	} else {
		payloads = [][]byte{r.body}
	}
	for _, p := range payloads {
		var u usage
		if err := json.Unmarshal(p, &u); err != nil {
			t.Fatalf("answer %q: %v", p, err)
		}
		if u.Usage != nil {
			in, out, ok = u.Usage.PromptTokens, u.Usage.CompletionTokens, true
		}
	}
	return in, out, ok
}

// tokenSeries scrapes the token series: name{labels} → value.
func tokenSeries(t *testing.T, h *harness) map[string]float64 {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(h.metricsText()))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, name := range []string{"llmgate_tokens_total", "llmgate_tokens_saved_total", "llmgate_usage_missing_total"} {
		f, ok := fams[name]
		if !ok {
			continue
		}
		for _, m := range f.Metric {
			var ls []string
			for _, lp := range m.Label {
				ls = append(ls, lp.GetName()+`="`+lp.GetValue()+`"`)
			}
			out[name+"{"+strings.Join(ls, ",")+"}"] = m.Counter.GetValue()
		}
	}
	return out
}

// deltas lists the series that moved from before to after.
func deltas(before, after map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

// equalDeltas compares deltas, a want of 0 meaning "did not move".
func equalDeltas(got, want map[string]float64) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			return false
		}
	}
	return true
}
