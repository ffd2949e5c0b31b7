package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/deadletter"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

type dlqList struct {
	DeadLetters []cache.DeadLetter `json:"dead_letters"`
	Total       int
	Summary     []deadletter.GroupCount
}

func listDLQ(t *testing.T, h *harness, query string) dlqList {
	t.Helper()
	r := h.admin(http.MethodGet, "/admin/deadletters"+query)
	if r.status != 200 {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	var l dlqList
	if err := json.Unmarshal(r.body, &l); err != nil {
		t.Fatal(err)
	}
	return l
}

func TestDeadLetterRecordedAndReplayed(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Clients = []config.Client{{Name: "team-a", Key: "key-a"}}
		c.Retry.MaxAttempts = 2
	})
	hdr := map[string]string{"Authorization": "Bearer key-a", "Idempotency-Key": "order-9/summarize"}
	h.fake.SetDefault(fakeprovider.Step{Status: 503})
	if r := h.chat(chatBody, hdr); r.status != 503 {
		t.Fatalf("status %d", r.status)
	}
	l := listDLQ(t, h, "")
	if l.Total != 1 {
		t.Fatalf("dead letters %d", l.Total)
	}
	d := l.DeadLetters[0]
	if d.Client != "team-a" || d.Key != "order-9/summarize" || d.Endpoint != "/v1/chat/completions" || d.Class != "transient" ||
		d.Attempts != 2 || d.Model != "gpt-4o-mini" || len(d.Upstreams) != 1 || d.Upstreams[0] != "primary" || d.FirstAt.IsZero() {
		t.Fatalf("dead letter fields: %+v", d)
	}
	// The body is kept, headers are not.
	r := h.admin(http.MethodGet, "/admin/deadletters/"+d.ID)
	if !strings.Contains(string(r.body), `Hello`) || strings.Contains(string(r.body), "key-a") {
		t.Fatalf("get: %s", r.body)
	}
	// A second failure of the same key updates the record.
	h.chat(chatBody, hdr)
	if l := listDLQ(t, h, ""); l.Total != 1 || l.DeadLetters[0].Failures != 2 {
		t.Fatalf("after second failure: %+v", l)
	}

	// The upstream recovers; the operator replays.
	h.fake.SetDefault(fakeprovider.Step{})
	r = h.admin(http.MethodPost, "/admin/deadletters/"+d.ID+"/replay")
	if r.status != 200 || !strings.Contains(string(r.body), `"status":200`) {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	calls := h.fake.Calls("")
	if got := h.fake.Requests()[calls-1].Header.Get("Idempotency-Key"); got != idempotency.ForwardKey(nil, cache.Key{Scope: "team-a", Endpoint: "/v1/chat/completions", ID: "order-9/summarize"}) {
		t.Fatalf("replay sent key %q upstream", got)
	}
	if l := listDLQ(t, h, ""); l.Total != 0 {
		t.Fatalf("replayed dead letter not resolved: %+v", l)
	}
	// The client's retry gets the committed answer without another call.
	r = h.chat(chatBody, hdr)
	if r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("client retry: %d %v", r.status, r.header)
	}
	if h.fake.Calls("") != calls {
		t.Fatal("client retry called upstream")
	}
}

func TestDeadLetterSummaryAndGroupReplay(t *testing.T) {
	backup := fakeprovider.New(fakeprovider.Options{})
	burl := newTestServer(t, backup)
	h := newHarness(t, func(c *config.Config) {
		c.Retry.MaxAttempts = 1
		c.Upstreams[0].Models = []string{"gpt-*"}
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "other", BaseURL: burl + "/v1", Models: []string{"llama-*"}, Timeout: config.Duration(time.Second)})
		c.DeadLetters.ReplayPerSecond = 1000
	})
	h.fake.SetDefault(fakeprovider.Step{Status: 503})
	backup.SetDefault(fakeprovider.Step{Status: 429})
	for i, k := range []string{"a", "b", "c"} {
		h.chat(chatBody, key(k))
		if i < 2 {
			h.chat(`{"model":"llama-3","messages":[{"role":"user","content":"x"}]}`, key("l"+k))
		}
	}
	// Permanent failures are not dead letters.
	h.fake.Enqueue(fakeprovider.Step{Status: 400})
	h.chat(chatBody, key("bad-request"))
	l := listDLQ(t, h, "")
	if l.Total != 5 {
		t.Fatalf("total %d", l.Total)
	}
	want := []deadletter.GroupCount{{Upstream: "primary", Class: "transient", Count: 3}, {Upstream: "other", Class: "rate_limited", Count: 2}}
	if len(l.Summary) != 2 || l.Summary[0] != want[0] || l.Summary[1] != want[1] {
		t.Fatalf("summary %+v", l.Summary)
	}
	if l := listDLQ(t, h, "?upstream=other&class=rate_limited"); l.Total != 2 {
		t.Fatalf("filtered %d", l.Total)
	}
	if l := listDLQ(t, h, "?limit=2"); len(l.DeadLetters) != 2 || l.Total != 5 {
		t.Fatalf("page %d of %d", len(l.DeadLetters), l.Total)
	}
	// Fix the primary; replay its group.
	h.fake.SetDefault(fakeprovider.Step{})
	r := h.admin(http.MethodPost, "/admin/deadletters/replay?upstream=primary")
	if r.status != 200 || !strings.Contains(string(r.body), `"succeeded":3`) {
		t.Fatalf("group replay: %d %s", r.status, r.body)
	}
	if l := listDLQ(t, h, ""); l.Total != 2 {
		t.Fatalf("after group replay %d", l.Total)
	}
	id := listDLQ(t, h, "").DeadLetters[0].ID
	if r := h.admin(http.MethodDelete, "/admin/deadletters/"+id); r.status != 200 {
		t.Fatalf("delete %d", r.status)
	}
	if l := listDLQ(t, h, ""); l.Total != 1 {
		t.Fatalf("after delete %d", l.Total)
	}
}

func TestDeadLetterAlertWebhook(t *testing.T) {
	var mu sync.Mutex
	var got []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, string(b))
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Retry.MaxAttempts = 1
		c.DeadLetters.AlertThreshold = 2
		c.DeadLetters.WebhookURL = hook.URL + "/hooks/secret-path"
	})
	h.fake.SetDefault(fakeprovider.Step{Status: 503})
	h.chat(chatBody, key("x1"))
	h.chat(chatBody, key("x2"))
	h.chat(chatBody, key("x3"))
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no webhook alert")
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || !strings.Contains(got[0], `"text"`) || !strings.Contains(got[0], "dead letters") {
		t.Fatalf("webhook payloads %q", got)
	}
	if !strings.Contains(h.logs.String(), "over its alert threshold") || strings.Contains(h.logs.String(), "secret-path") {
		t.Fatal("alert log missing, or the webhook URL leaked into it")
	}
}

// TestMetricsAfterScriptedRun parses /metrics with the Prometheus text
// parser and checks the named series carry the values the run produced.
func TestMetricsAfterScriptedRun(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Retry.MaxAttempts = 3 })
	h.fake.Enqueue(fakeprovider.Step{Status: 503}, fakeprovider.Step{})
	h.chat(chatBody, key("m1"))
	h.chat(chatBody, key("m1"))                                                             // replay
	h.chat(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}]}`, key("m1")) // 422
	h.fake.Enqueue(fakeprovider.Step{FinishReason: "content_filter"})
	h.chat(chatBody, nil)
	h.chat(streamBody, nil)

	r := h.admin(http.MethodGet, "/metrics")
	if r.status != 200 {
		t.Fatalf("metrics %d", r.status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(r.body)))
	if err != nil {
		t.Fatal(err)
	}
	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		f, ok := fams[name]
		if !ok {
			t.Fatalf("no series %s", name)
		}
		sum := 0.0
	next:
		for _, m := range f.Metric {
			for k, v := range labels {
				found := false
				for _, lp := range m.Label {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
		return sum
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"llmgate_upstream_attempts_total", map[string]string{"upstream": "primary", "class": "transient"}, 1},
		{"llmgate_upstream_retries_total", map[string]string{"upstream": "primary", "class": "transient"}, 1},
		{"llmgate_idempotency_events_total", map[string]string{"event": "replay"}, 1},
		{"llmgate_idempotency_events_total", map[string]string{"event": "mismatch"}, 1},
		{"llmgate_idempotency_events_total", map[string]string{"event": "commit"}, 1},
		{"llmgate_requests_total", map[string]string{"endpoint": "chat_completions", "outcome": "content_filter", "status": "200"}, 1},
		{"llmgate_requests_total", map[string]string{"endpoint": "chat_completions"}, 5},
		{"llmgate_request_duration_seconds", map[string]string{"endpoint": "chat_completions"}, 5},
		{"llmgate_stream_ttfb_seconds", map[string]string{"upstream": "primary"}, 1},
		{"llmgate_breaker_state", map[string]string{"upstream": "primary"}, 0},
		{"llmgate_store_records", nil, 1},
		{"llmgate_deadletters", nil, 0},
		{"llmgate_retry_budget_rejections_total", nil, 0},
	}
	for _, c := range checks {
		if c.name == "llmgate_retry_budget_rejections_total" || c.name == "llmgate_deadletters" {
			continue // no samples until something happens; registered is enough
		}
		if got := value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// Model labels stay bounded: a model nobody configured and no upstream
	// accepted folds into "other"/"unknown".
	for _, m := range fams["llmgate_requests_total"].Metric {
		for _, lp := range m.Label {
			if lp.GetName() == "model" && lp.GetValue() != "gpt-4o-mini" {
				t.Errorf("unexpected model label %q", lp.GetValue())
			}
		}
	}
}

// A key whose call failed, and whose retry then served an answer too large
// to record, has succeeded: its not-stored marker resolves its dead letter
// (an operator's replay would only get the marker's 410), for a JSON answer
// and a stream alike.
func TestNotStoredMarkerResolvesTheDeadLetter(t *testing.T) {
	for _, tc := range []struct{ name, body, answer string }{
		{"json", chatBody, fixedJSON(8 << 10)},
		{"stream", streamBody, fixedStream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *config.Config) {
				c.Idempotency.MaxRecordBytes = 1024
				c.Retry.MaxAttempts = 1
			})
			h.fake.Enqueue(fakeprovider.Step{Status: 503}, fakeprovider.Step{Body: tc.answer})
			if r := h.chat(tc.body, key("big-after-503")); r.status != 503 {
				t.Fatalf("first call: %d %s", r.status, r.body)
			}
			if l := listDLQ(t, h, ""); l.Total != 1 {
				t.Fatalf("dead letters after the 503: %d", l.Total)
			}
			if r := h.chat(tc.body, key("big-after-503")); r.status != 200 {
				t.Fatalf("retry: %d %.200s", r.status, r.body)
			}
			h.gw.requests.WaitCalls()
			if r := h.chat(tc.body, key("big-after-503")); r.status != http.StatusGone {
				t.Fatalf("no marker committed: the key answered %d", r.status)
			}
			if l := listDLQ(t, h, ""); l.Total != 0 {
				t.Fatalf("the dead letter of a key answered once is still listed: %+v", l.DeadLetters)
			}
		})
	}
}

// releaseHook runs after the store has released a key: the moment a
// client's retry may claim it.
type releaseHook struct {
	Store
	after func()
}

func (s *releaseHook) Release(ctx context.Context, k cache.Key, owner string) error {
	err := s.Store.Release(ctx, k, owner)
	if s.after != nil {
		s.after()
	}
	return err
}

// A retry that succeeds as soon as the failed call releases its key leaves
// no dead letter behind: the letter is recorded before the key is released,
// so the retry's success finds it and resolves it. (Released first, the
// letter was written after the retry had succeeded, and stayed listed for a
// key that had its answer.)
func TestDeadLetterOfKeyRetriedAtOnceIsResolved(t *testing.T) {
	var hook *releaseHook
	h := newHarnessStore(t, func(c *config.Config) {
		c.Clients = []config.Client{{Name: "team-a", Key: "key-a"}}
		c.Retry.MaxAttempts = 1
	}, func(s Store) Store { hook = &releaseHook{Store: s}; return hook }, fakeprovider.Options{})
	hdr := map[string]string{"Authorization": "Bearer key-a", "Idempotency-Key": "order-12/summarize"}
	var retry *result
	hook.after = func() {
		hook.after = nil // the retry's own releases, if any, run nothing
		h.fake.SetDefault(fakeprovider.Step{})
		r := h.chat(chatBody, hdr)
		retry = &r
	}
	h.fake.SetDefault(fakeprovider.Step{Status: 503})
	if r := h.chat(chatBody, hdr); r.status != 503 {
		t.Fatalf("first call: %d %s", r.status, r.body)
	}
	if retry == nil || retry.status != 200 {
		t.Fatalf("the retry made at the release: %+v", retry)
	}
	if l := listDLQ(t, h, ""); l.Total != 0 {
		t.Fatalf("a dead letter is listed for a key that has its answer: %+v", l.DeadLetters)
	}
}

// An offset past any list, up to the largest integer, is an empty page,
// not a 500 from an offset+limit that overflowed.
func TestDeadLetterListHugeOffset(t *testing.T) {
	h := newHarness(t, nil)
	for _, q := range []string{"offset=9223372036854775807", "offset=9223372036854775000&limit=1000", "offset=5"} {
		r := h.admin(http.MethodGet, "/admin/deadletters?"+q)
		if r.status != 200 || !strings.Contains(string(r.body), `"dead_letters":[]`) || strings.Contains(string(r.body), "next_offset") {
			t.Fatalf("%s: %d %s", q, r.status, r.body)
		}
	}
}
