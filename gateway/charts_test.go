package gateway

import (
	"context"
	"maps"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/outcome"
)

// requestsByOutcome is llmgate_requests_total for upstream, summed by its
// outcome label, parsed with Prometheus' own text parser. A series that
// does not exist yet counts as nothing.
func (h *harness) requestsByOutcome(upstream string) map[string]int {
	h.t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(h.metricsText()))
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]int{}
	f, ok := fams["llmgate_requests_total"]
	if !ok {
		return out
	}
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["upstream"] == upstream {
			out[labels["outcome"]] += int(m.GetCounter().GetValue())
		}
	}
	return out
}

var (
	chartCaption = regexp.MustCompile(`(?s)<figure class="chart-box" id="chart-primary">.*?</figcaption>`)
	captionGroup = regexp.MustCompile(`data-group="([a-z_]+)" data-count="(\d+)"`)
	chartSVG     = regexp.MustCompile(`(?s)<figure class="chart-box" id="chart-primary">.*?data-requests="(\d+)".*?<g class="lane requests">(.*?)</g>\s*<g class="lane latency">`)
	barSegment   = regexp.MustCompile(`data-class="([a-z_]+)" data-count="(\d+)"`)
)

// TestChartGroupsMatchMetrics: a mixed run — successes, replays of
// committed keys, a content-filtered answer, a 400, a transient failure
// that exhausted its retries and a breaker refusal — charted on the
// operator's page with the header's and the bars' counts per group equal
// to llmgate_requests_total's, grouped by the one mapping
// (outcome.GroupOf). Replays were drawn as "other" and the header counted
// them as "not success"; a breaker refusal was a gateway_error.
func TestChartGroupsMatchMetrics(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Retry.MaxAttempts = 3
		c.Breaker.ConsecutiveFailures = 100
	})
	sent := 0
	send := func(status int, hdr map[string]string) {
		t.Helper()
		if r := h.chat(chatBody, hdr); r.status != status {
			t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
		}
		sent++
		h.waitLogged(sent)
	}
	send(http.StatusOK, key("charts/1"))
	send(http.StatusOK, key("charts/2"))
	send(http.StatusOK, nil)
	send(http.StatusOK, key("charts/1")) // replays
	send(http.StatusOK, key("charts/2"))
	h.fake.Enqueue(fakeprovider.Step{FinishReason: "content_filter"})
	send(http.StatusOK, nil)
	h.fake.Enqueue(fakeprovider.Step{Status: 400})
	send(http.StatusBadRequest, nil)
	h.fake.Enqueue(fakeprovider.Step{Status: 503}, fakeprovider.Step{Status: 503}, fakeprovider.Step{Status: 503})
	send(http.StatusServiceUnavailable, key("charts/3"))
	if err := h.gw.admin.SetBreakerForced(context.Background(), breaker.Key{Upstream: "primary"}, true); err != nil {
		t.Fatal(err)
	}
	send(http.StatusServiceUnavailable, nil)

	byOutcome := h.requestsByOutcome("primary")
	wantGroups, total := map[string]int{}, 0
	for class, n := range byOutcome {
		wantGroups[string(outcome.GroupOf(classify.Class(class)))] += n
		total += n
	}
	for g, n := range map[outcome.Group]int{outcome.GroupSuccess: 3, outcome.GroupReplay: 2, outcome.GroupNotRetried: 1,
		outcome.GroupClientError: 1, outcome.GroupTransient: 1, outcome.GroupBreakerOpen: 1} {
		if wantGroups[string(g)] != n {
			t.Errorf("metrics: %d requests in group %s, want %d (by outcome: %v)", wantGroups[string(g)], g, n, byOutcome)
		}
	}
	if total != sent {
		t.Errorf("metrics count %d requests on primary, %d were sent", total, sent)
	}

	page := string(h.page(http.MethodGet, "/admin/", nil, h.login(), nil).body)
	caption := chartCaption.FindString(page)
	header := map[string]int{}
	for _, m := range captionGroup.FindAllStringSubmatch(caption, -1) {
		header[m[1]], _ = strconv.Atoi(m[2])
	}
	if !maps.Equal(header, wantGroups) {
		t.Errorf("the chart's header counts %v, metrics %v; caption:\n%s", header, wantGroups, caption)
	}
	if !strings.Contains(caption, strconv.Itoa(total)+" requests:") {
		t.Errorf("the chart's header does not say %d requests: %s", total, caption)
	}
	svg := chartSVG.FindStringSubmatch(page)
	if svg == nil {
		t.Fatalf("no requests lane for primary in the page")
	}
	bars := map[string]int{}
	for _, m := range barSegment.FindAllStringSubmatch(svg[2], -1) {
		n, _ := strconv.Atoi(m[2])
		bars[m[1]] += n
	}
	if n, _ := strconv.Atoi(svg[1]); n != total || !maps.Equal(bars, wantGroups) {
		t.Errorf("the chart draws %s requests as %v; metrics count %d as %v", svg[1], bars, total, wantGroups)
	}
}
