package metrics

import "github.com/prometheus/client_golang/prometheus"

// budgetMetrics are the series of the clients' budgets (package budget).
type budgetMetrics struct {
	budgetRefused     *prometheus.CounterVec
	budgetCharged     *prometheus.CounterVec
	budgetUnpriced    *prometheus.CounterVec
	budgetStoreErrors *prometheus.CounterVec
}

// budgetSeries makes the budgets' series.
func (m *Metrics) budgetSeries() []prometheus.Collector {
	m.budgetRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_budget_refused_total",
		Help: "Requests refused by their client's budgets before any upstream call, by client and budget: 429 budget_exceeded by the budget " +
			"(window.unit.count[.model]), 403 budget_unmetered_endpoint as budget=\"unmetered\".",
	}, []string{"client", "budget"})
	m.budgetCharged = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_budget_charged_total",
		Help: "What provider runs were charged against their client's budgets, by client, budget and estimated " +
			"(true: the run reported no usage and was charged its reservation). Cost budgets count micro-units.",
	}, []string{"client", "budget", "estimated"})
	m.budgetUnpriced = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_budget_unpriced_total",
		Help: "Provider runs of a client with cost budgets for a model its upstream has no price for (no prices entry, no default_price): charged no cost.",
	}, []string{"upstream", "model"})
	m.budgetStoreErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgate_budget_store_errors_total",
		Help: "Budget store operations that failed, by op (reserve, settle) and what the request got (refused, allowed, lost: a settlement not recorded).",
	}, []string{"op", "result"})
	return []prometheus.Collector{m.budgetRefused, m.budgetCharged, m.budgetUnpriced, m.budgetStoreErrors}
}

// BudgetRefused counts a request refused by client's budget.
func (m *Metrics) BudgetRefused(client, budget string) {
	m.budgetRefused.WithLabelValues(m.clientLabel(client), budget).Inc()
}

// BudgetCharged counts amount charged to client's budget.
func (m *Metrics) BudgetCharged(client, budget string, amount int64, estimated bool) {
	est := "false"
	if estimated {
		est = "true"
	}
	m.budgetCharged.WithLabelValues(m.clientLabel(client), budget, est).Add(float64(amount))
}

// BudgetUnpriced counts a run of model on upstream, for client, that had
// no price.
func (m *Metrics) BudgetUnpriced(upstream, model, client string) {
	m.budgetUnpriced.WithLabelValues(upstream, m.ModelLabel(client, model, true, true)).Inc()
}

// BudgetStoreError counts a failed budget store operation.
func (m *Metrics) BudgetStoreError(op, result string) {
	m.budgetStoreErrors.WithLabelValues(op, result).Inc()
}
