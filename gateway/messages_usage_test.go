package gateway

import (
	"net/http"
	"testing"
)

// TestMessagesTokenUsage: the token counters say what Anthropic's usage
// says — a JSON message's usage; a stream's message_start input and cache
// counts with the last message_delta's output count (cumulative, never
// added to message_start's) — cache creation and cache reads in their own
// kinds; a replay counts the committed answer's usage as saved, JSON and
// stream alike.
func TestMessagesTokenUsage(t *testing.T) {
	h := newMessagesHarness(t, nil)
	series := func(name, kind string) string {
		return name + `{client="team",kind="` + kind + `",model="claude-sonnet-4-5",upstream="anthropic"}`
	}
	// The fake's JSON message reports 12 in, 7 out, 3 cache written, 5
	// read; its stream 12, 3 and 5 at message_start and 9 out at the end.
	counts := func(name string, out float64) map[string]float64 {
		return map[string]float64{series(name, "input"): 12, series(name, "output"): out,
			series(name, "cache_creation_input"): 3, series(name, "cache_read_input"): 5}
	}
	for _, st := range []struct {
		name, body string
		hdr        map[string]string
		want       map[string]float64
	}{
		{"json", messagesBody, nil, counts("llmgate_tokens_total", 7)},
		{"stream", messagesStreamBody, nil, counts("llmgate_tokens_total", 9)},
		{"keyed json", messagesBody, key("u-msg-json"), counts("llmgate_tokens_total", 7)},
		{"keyed json replayed", messagesBody, key("u-msg-json"), counts("llmgate_tokens_saved_total", 7)},
		{"keyed stream", messagesStreamBody, key("u-msg-stream"), counts("llmgate_tokens_total", 9)},
		{"keyed stream replayed", messagesStreamBody, key("u-msg-stream"), counts("llmgate_tokens_saved_total", 9)},
	} {
		before := tokenSeries(t, h.harness)
		r := h.messages("/v1/messages", st.body, st.hdr)
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", st.name, r.status, r.body)
		}
		if got := deltas(before, tokenSeries(t, h.harness)); !equalDeltas(got, st.want) {
			t.Errorf("%s: counters moved by %v, want %v", st.name, got, st.want)
		}
	}
}
