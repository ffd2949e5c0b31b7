// Package metrics holds every Prometheus series llmgate exports, with
// bounded label values, and the small methods the rooms of the request path
// call to count what they did. It knows nothing of HTTP or the store.
package metrics

import (
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/classify"
)

// Metrics holds every Prometheus series the gateway exports. Label values
// are bounded: endpoints, upstreams and classes are fixed sets; models are
// the configured names plus at most maxModelLabels names that matched a
// wildcard and that an upstream answered successfully; anything else folds
// into "other"; clients are the configured names (SetClients) or "". Keys,
// clients' raw strings and secrets are never labels.
type Metrics struct {
	requests      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	attempts      *prometheus.CounterVec
	retries       *prometheus.CounterVec
	budget        *prometheus.CounterVec
	breakerState  *prometheus.GaugeVec
	breakerTrans  *prometheus.CounterVec
	breakerReject *prometheus.CounterVec
	fallbacks     *prometheus.CounterVec
	idem          *prometheus.CounterVec
	ttfb          *prometheus.HistogramVec
	authFailures  *prometheus.CounterVec
	Inflight      prometheus.Gauge

	budgetMetrics
	clientLimited  *prometheus.CounterVec
	clientFailOpen *prometheus.CounterVec
	clientStored   *prometheus.GaugeVec
	usageScans     *prometheus.CounterVec

	tokens       *prometheus.CounterVec
	tokensSaved  *prometheus.CounterVec
	usageMissing *prometheus.CounterVec

	DLQSize     *prometheus.GaugeVec
	DLQAlert    prometheus.Gauge
	DLQReplays  *prometheus.CounterVec
	DLQRecorded *prometheus.CounterVec
	dlqDropped  *prometheus.CounterVec

	mu          sync.Mutex
	models      map[string]bool
	modelsBy    map[string]int // the names each client learned (named first)
	idemTotals  map[string]int64
	exact       map[string]bool
	clients     map[string]bool // written by SetClients only, before serving
	tokenTotals map[tokenKey]*TokenCount
	missing     int64
}

const maxModelLabels = 64

// New registers every series with reg. exactModels are the configured
// model names, always their own label value.
func New(reg prometheus.Registerer, exactModels []string) *Metrics {
	m := &Metrics{
		models:      map[string]bool{},
		modelsBy:    map[string]int{},
		exact:       map[string]bool{},
		idemTotals:  map[string]int64{},
		clients:     map[string]bool{},
		tokenTotals: map[tokenKey]*TokenCount{},
	}
	for _, e := range exactModels {
		m.exact[e] = true
	}
	reg.MustRegister(m.deadLetterSeries()...)
	reg.MustRegister(m.requestSeries()...)
	reg.MustRegister(m.clientSeries()...)
	reg.MustRegister(m.tokenSeries()...)
	reg.MustRegister(m.budgetSeries()...)
	return m
}

// latencyBuckets are the buckets of every latency histogram, in seconds.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// requestSeries makes the series of client requests, upstream attempts,
// breakers and idempotency events, and returns them for registration.
// (A list of declarations: every series' name and help in one place.)
func (m *Metrics) requestSeries() []prometheus.Collector {
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_requests_total", Help: "Client requests by endpoint, model, upstream, status and outcome class.",
	}, []string{"endpoint", "model", "upstream", "status", "outcome"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "llmgate_request_duration_seconds", Help: "Client request latency, to the last byte.", Buckets: latencyBuckets,
	}, []string{"endpoint", "model", "upstream", "status", "outcome"})
	m.attempts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_upstream_attempts_total", Help: "Upstream attempts by upstream and outcome class.",
	}, []string{"upstream", "class"})
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_upstream_retries_total", Help: "Retries by upstream and the class of the failure retried.",
	}, []string{"upstream", "class"})
	m.budget = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_retry_budget_rejections_total", Help: "Retries denied by the process-wide retry budget.",
	}, []string{"upstream"})
	m.fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_fallbacks_total", Help: "Requests passed from an upstream to its fallback.",
	}, []string{"from", "to"})
	m.idem = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_idempotency_events_total",
		Help: "Idempotency events: claim, commit, release, replay, wait, conflict (409), mismatch (422), store_error, uncommitted, cache_hit, cache_miss, join, taken_over.",
	}, []string{"event"})
	m.authFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_upstream_auth_failures_total", Help: "Upstream answers refusing the gateway's credentials (401) or the request (403), by upstream and status.",
	}, []string{"upstream", "status"})
	m.ttfb = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "llmgate_stream_ttfb_seconds", Help: "Time from request to the first streamed event sent to the client.", Buckets: latencyBuckets,
	}, []string{"upstream"})
	m.Inflight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "llmgate_requests_in_flight", Help: "Client requests being served.",
	})
	series := []prometheus.Collector{m.requests, m.duration, m.attempts, m.retries, m.budget}
	series = append(series, m.breakerSeries()...)
	return append(series, m.fallbacks, m.idem, m.ttfb, m.Inflight, m.authFailures)
}

// breakerSeries makes the circuit breakers' series.
func (m *Metrics) breakerSeries() []prometheus.Collector {
	m.breakerState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "llmgate_breaker_state",
		Help: `Circuit breaker state per upstream and model (model "" is the upstream's own breaker): 0 closed, 1 half-open, 2 open.`,
	}, []string{"upstream", "model"})
	m.breakerTrans = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_breaker_transitions_total", Help: "Circuit breaker state transitions, per upstream and model.",
	}, []string{"upstream", "model", "from", "to"})
	m.breakerReject = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_breaker_rejections_total",
		Help: `Requests an open breaker answered at once, by upstream and the model whose breaker refused ("" for the upstream's own).`,
	}, []string{"upstream", "model"})
	return []prometheus.Collector{m.breakerState, m.breakerTrans, m.breakerReject}
}

// deadLetterSeries makes the dead-letter queue's series.
func (m *Metrics) deadLetterSeries() []prometheus.Collector {
	m.DLQSize = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "llmgate_deadletters", Help: "Dead letters waiting, by final class.",
	}, []string{"class"})
	m.DLQAlert = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "llmgate_deadletter_alert", Help: "1 while the dead-letter queue is over its alert threshold.",
	})
	m.DLQReplays = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_deadletter_replays_total", Help: "Dead-letter replays by result.",
	}, []string{"result"})
	m.DLQRecorded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_deadletters_recorded_total", Help: "Keyed requests recorded as dead letters, by final class.",
	}, []string{"class"})
	m.dlqDropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_deadletters_dropped_total",
		Help: "Dead letters deleted to keep their client within dead_letters.max_per_client and max_bytes_per_client (its oldest first), by client.",
	}, []string{"client"})
	return []prometheus.Collector{m.DLQSize, m.DLQAlert, m.DLQReplays, m.DLQRecorded, m.dlqDropped}
}

// clientSeries makes the series of clients' limits and stored bytes.
func (m *Metrics) clientSeries() []prometheus.Collector {
	m.clientLimited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_client_limited_total",
		Help: "Requests refused with 429 by their client's own limits, by client and limit: rate, concurrency, storage.",
	}, []string{"client", "limit"})
	m.clientFailOpen = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_client_limit_fail_open_total",
		Help: "Limit checks made without what they depend on (storage: the client's stored bytes were never counted from the store), by limit.",
	}, []string{"limit"})
	m.clientStored = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "llmgate_client_stored_bytes",
		Help: "Bytes committed under each client with a max_stored_bytes limit, as this process counts them against it.",
	}, []string{"client"})
	m.usageScans = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_client_usage_scans_total", Help: "Counts of a client's stored bytes from the store, by result: ok, error.",
	}, []string{"result"})
	return []prometheus.Collector{m.clientLimited, m.clientFailOpen, m.clientStored, m.usageScans}
}

// tokenSeries makes the series of tokens reported in upstream usage.
func (m *Metrics) tokenSeries() []prometheus.Collector {
	m.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_tokens_total",
		Help: "Tokens that upstream answers reported in their usage, by upstream, model, client and kind: input (prompt_tokens, input_tokens), output (completion_tokens, output_tokens), " +
			"cache_creation_input and cache_read_input (Anthropic's prompt cache, beside input).",
	}, []string{"upstream", "model", "client", "kind"})
	m.tokensSaved = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_tokens_saved_total",
		Help: "Tokens in the usage of committed answers replayed instead of paid for again (idempotency replays and cache hits), by upstream, model, client and kind.",
	}, []string{"upstream", "model", "client", "kind"})
	m.usageMissing = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_usage_missing_total",
		Help: "2xx upstream answers that reported no usage (a stream without stream_options.include_usage, a cut stream, a body too large to read), by upstream and endpoint.",
	}, []string{"upstream", "endpoint"})
	return []prometheus.Collector{m.tokens, m.tokensSaved, m.usageMissing}
}

// ClientLimited counts a request refused by its client's limit. Client
// names are the configured ones, a bounded set ("" is the one shared
// scope when no clients are configured).
func (m *Metrics) ClientLimited(client, limit string) {
	m.clientLimited.WithLabelValues(client, limit).Inc()
}

// DeadLettersDropped counts n of client's dead letters deleted to keep it
// within its bound.
func (m *Metrics) DeadLettersDropped(client string, n int) {
	m.dlqDropped.WithLabelValues(m.clientLabel(client)).Add(float64(n))
}

// ClientLimitFailOpen counts a check of limit made without what it
// depends on.
func (m *Metrics) ClientLimitFailOpen(limit string) { m.clientFailOpen.WithLabelValues(limit).Inc() }

// ClientStored sets a client's counted stored bytes.
func (m *Metrics) ClientStored(client string, bytes int64) {
	m.clientStored.WithLabelValues(client).Set(float64(bytes))
}

// UsageScan counts one count of a client's stored bytes from the store.
func (m *Metrics) UsageScan(ok bool) {
	result := "ok"
	if !ok {
		result = "error"
	}
	m.usageScans.WithLabelValues(result).Inc()
}

// ModelLabel bounds the model label's values. learn is true when an
// upstream accepted the model, which lets a wildcard-matched name in: at
// most maxModelLabels names, of which one client (the one that names it
// first) may take half, so one tenant naming many models leaves the other
// half to the rest; "" (no clients configured) may take all.
func (m *Metrics) ModelLabel(client, model string, routed, learn bool) string {
	if !routed {
		return "unknown"
	}
	if m.exact[model] {
		return model
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.models[model] {
		return model
	}
	share := maxModelLabels / 2
	if client == "" {
		share = maxModelLabels
	}
	if learn && len(m.models) < maxModelLabels && m.modelsBy[client] < share && utf8.ValidString(model) {
		m.models[model] = true
		m.modelsBy[client]++
		return model
	}
	return "other"
}

// RequestDone is one finished client request as Request counts it. The
// strings are label values, bounded as Metrics says (Model from
// ModelLabel).
type RequestDone struct {
	Endpoint string
	Model    string
	Upstream string // the upstream that answered, or "none"
	Status   int    // the status sent to the client
	Outcome  string // the outcome class
	Duration time.Duration
}

// Request counts a finished client request and observes its latency.
func (m *Metrics) Request(r RequestDone) {
	s := strconv.Itoa(r.Status)
	m.requests.WithLabelValues(r.Endpoint, r.Model, r.Upstream, s, r.Outcome).Inc()
	m.duration.WithLabelValues(r.Endpoint, r.Model, r.Upstream, s, r.Outcome).Observe(r.Duration.Seconds())
}

func (m *Metrics) Attempt(upstream string, o classify.Outcome) {
	m.attempts.WithLabelValues(upstream, string(o.Class)).Inc()
}

func (m *Metrics) Retry(upstream string, o classify.Outcome) {
	m.retries.WithLabelValues(upstream, string(o.Class)).Inc()
}

// UpstreamAuthFailure counts a 401/403 from an upstream.
func (m *Metrics) UpstreamAuthFailure(upstream string, status int) {
	m.authFailures.WithLabelValues(upstream, strconv.Itoa(status)).Inc()
}

func (m *Metrics) BudgetRejected(upstream string) { m.budget.WithLabelValues(upstream).Inc() }

// BreakerRejected counts a request the breaker of upstream and model
// refused (model "": the upstream's own breaker).
func (m *Metrics) BreakerRejected(upstream, model string) {
	m.breakerReject.WithLabelValues(upstream, model).Inc()
}

func (m *Metrics) Fallback(from, to string) { m.fallbacks.WithLabelValues(from, to).Inc() }

func (m *Metrics) IdemEvent(event string) {
	m.idem.WithLabelValues(event).Inc()
	m.mu.Lock()
	m.idemTotals[event]++
	m.mu.Unlock()
}

// IdemCounts returns the idempotency events since start, for /admin/stats.
func (m *Metrics) IdemCounts() map[string]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]int64, len(m.idemTotals))
	for k, v := range m.idemTotals {
		out[k] = v
	}
	return out
}

func (m *Metrics) StreamTTFB(upstream string, d time.Duration) {
	m.ttfb.WithLabelValues(upstream).Observe(d.Seconds())
}

// BreakerChange records a breaker's state change; from == to only sets
// the gauge (a breaker's first value). The model label is the breaker's
// (breaker.Key): bounded by the registry, as breaker.Settings says.
func (m *Metrics) BreakerChange(k breaker.Key, from, to breaker.State) {
	if from != to {
		m.breakerTrans.WithLabelValues(k.Upstream, k.Model, string(from), string(to)).Inc()
	}
	m.breakerState.WithLabelValues(k.Upstream, k.Model).Set(breakerGauge(to))
}

func breakerGauge(s breaker.State) float64 {
	switch s {
	case breaker.HalfOpen:
		return 1
	case breaker.Open:
		return 2
	}
	return 0
}
