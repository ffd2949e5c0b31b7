package metrics

import (
	"cmp"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/classify"
)

// Token usage: llmgate_tokens_total and llmgate_tokens_saved_total are
// labelled by upstream, model, client and kind (input, output, and for
// answers that report them, Anthropic's cache_creation_input and
// cache_read_input, which its input_tokens does not include), and
// llmgate_usage_missing_total by upstream and endpoint. Every label set is
// bounded, so together they are too: at most
// upstreams × (exact models + 64 + 1) × (clients + 1) × 4 series each —
// the configured upstreams; the model label of llmgate_requests_total
// (ModelLabel); the configured client names plus "".

// SetClients names the configured clients, the values the client label
// takes; any other name counts under "". Call it once, before serving.
func (m *Metrics) SetClients(names []string) {
	for _, n := range names {
		m.clients[n] = true
	}
}

// clientLabel bounds the client label: a configured name, else "" — the
// shared scope when no clients are configured, or a client no longer
// configured (an operator may replay a removed client's dead letter).
func (m *Metrics) clientLabel(client string) string {
	if m.clients[client] {
		return client
	}
	return ""
}

// Usage counts a 2xx upstream answer to a request for model from client:
// the tokens it reported, or, when it reported none, one answer whose
// usage is missing (never zero tokens).
func (m *Metrics) Usage(upstream, endpoint, model, client string, t classify.Tokens) {
	if !t.Reported {
		m.usageMissing.WithLabelValues(upstream, endpoint).Inc()
		m.mu.Lock()
		m.missing++
		m.mu.Unlock()
		return
	}
	model, client = m.ModelLabel(client, model, true, true), m.clientLabel(client)
	m.tokens.WithLabelValues(upstream, model, client, "input").Add(float64(t.In))
	m.tokens.WithLabelValues(upstream, model, client, "output").Add(float64(t.Out))
	addCache(m.tokens, upstream, model, client, t)
	m.addTokens(tokenKey{upstream, model, client}, t, false)
}

// UsageSaved counts the tokens a replayed committed answer reported: what
// the replay did not pay for again. A record without usage counts
// nothing.
func (m *Metrics) UsageSaved(upstream, model, client string, t classify.Tokens) {
	if !t.Reported {
		return
	}
	model, client = m.ModelLabel(client, model, true, true), m.clientLabel(client)
	m.tokensSaved.WithLabelValues(upstream, model, client, "input").Add(float64(t.In))
	m.tokensSaved.WithLabelValues(upstream, model, client, "output").Add(float64(t.Out))
	addCache(m.tokensSaved, upstream, model, client, t)
	m.addTokens(tokenKey{upstream, model, client}, t, true)
}

// addCache counts the prompt-cache tokens of t (Anthropic's), whose
// series exist only where an answer reported some: an OpenAI-only
// gateway shows none.
func addCache(c *prometheus.CounterVec, upstream, model, client string, t classify.Tokens) {
	if t.CacheCreation > 0 {
		c.WithLabelValues(upstream, model, client, "cache_creation_input").Add(float64(t.CacheCreation))
	}
	if t.CacheRead > 0 {
		c.WithLabelValues(upstream, model, client, "cache_read_input").Add(float64(t.CacheRead))
	}
}

type tokenKey struct{ upstream, model, client string }

func (m *Metrics) addTokens(k tokenKey, t classify.Tokens, saved bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.tokenTotals[k]
	if c == nil {
		c = &TokenCount{Upstream: k.upstream, Model: k.model, Client: k.client}
		m.tokenTotals[k] = c
	}
	if saved {
		c.SavedInput += t.In
		c.SavedOutput += t.Out
		return
	}
	c.Input += t.In
	c.Output += t.Out
}

// TokenCount is the tokens counted since start under one upstream, model
// label and client label.
type TokenCount struct {
	Upstream, Model, Client string
	// Input and Output were reported by upstream answers.
	Input, Output int64
	// SavedInput and SavedOutput were reported by replayed answers.
	SavedInput, SavedOutput int64
}

// TokenTotals is the token usage counted since start, for the operator's
// page: the same numbers as the token series.
type TokenTotals struct {
	// Input, Output, SavedInput and SavedOutput are the sums of By.
	Input, Output, SavedInput, SavedOutput int64
	// UsageMissing counts 2xx upstream answers that reported no usage.
	UsageMissing int64
	// By holds one entry per upstream, model and client, in that order.
	By []TokenCount
}

// TokenTotals returns the token usage counted since start.
func (m *Metrics) TokenTotals() TokenTotals {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := TokenTotals{UsageMissing: m.missing, By: make([]TokenCount, 0, len(m.tokenTotals))}
	for _, c := range m.tokenTotals {
		t.By = append(t.By, *c)
		t.Input += c.Input
		t.Output += c.Output
		t.SavedInput += c.SavedInput
		t.SavedOutput += c.SavedOutput
	}
	slices.SortFunc(t.By, func(a, b TokenCount) int {
		return cmp.Or(cmp.Compare(a.Upstream, b.Upstream), cmp.Compare(a.Model, b.Model), cmp.Compare(a.Client, b.Client))
	})
	return t
}
