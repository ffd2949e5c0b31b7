package budget

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ChartSamples is how many samples of a budget a View keeps per window:
// the window is cut into that many equal slots, and each slot keeps the
// last reading taken in it.
const ChartSamples = 60

// Snapshot is every budgeted client's budgets in their current windows,
// as read at At.
type Snapshot struct {
	At time.Time
	// Clients are the budgets of each client whose read succeeded.
	Clients map[string][]Status
	// Failed are the clients whose budgets could not be read.
	Failed map[string]bool
}

// Sample is one reading of a budget: its slot in the window (0 to
// ChartSamples−1), when it was read, and what was spent and held then.
type Sample struct {
	Slot        int
	At          time.Time
	Spent, Held int64
}

// Series is one budget of one client over its current window: the
// budget now, and its samples in slot order.
type Series struct {
	Client  string
	Status  Status
	Start   time.Time
	Samples []Sample
}

// ViewOptions configure a View.
type ViewOptions struct {
	// TTL is how long one read of the store serves every reader
	// (/metrics, the admin API and page). If 0, one second.
	TTL time.Duration
	// Timeout bounds one read of the store. If 0, two seconds.
	Timeout time.Duration
}

// View is what operators see of the budgets: one read of every budgeted
// client's counters serves every reader for TTL (so scrapes of several
// Prometheus servers do not each hit the store), the samples of the
// page's charts, and a prometheus.Collector of the gauges.
type View struct {
	l       *Ledger
	o       ViewOptions
	clients []string

	mu     sync.Mutex
	snap   Snapshot
	read   bool
	series map[seriesKey]*slots
}

type seriesKey struct{ client, budget string }

// slots are one budget's samples in one window.
type slots struct {
	start time.Time
	s     [ChartSamples]Sample
	set   [ChartSamples]bool
}

// NewView returns the View of l's budgets.
func NewView(l *Ledger, o ViewOptions) *View {
	if o.TTL <= 0 {
		o.TTL = time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	v := &View{l: l, o: o, series: map[seriesKey]*slots{}}
	if l != nil {
		for c := range l.o.Budgets {
			v.clients = append(v.clients, c)
		}
		slices.Sort(v.clients)
	}
	return v
}

// Budgeted reports whether client has any budget.
func (v *View) Budgeted(client string) bool { return v.l.Budgeted(client) }

// Snapshot returns the budgets as read at most TTL ago (by the Ledger's
// clock), reading the store when that read is older. A client whose read
// fails is in Failed, logged when it starts failing, not again until it
// has been read once more.
func (v *View) Snapshot(ctx context.Context) Snapshot {
	if v.l == nil {
		return Snapshot{}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.l.o.Now()
	if v.read && now.Sub(v.snap.At) < v.o.TTL && !now.Before(v.snap.At) {
		return v.snap
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), v.o.Timeout)
	defer cancel()
	next := Snapshot{At: now, Clients: map[string][]Status{}, Failed: map[string]bool{}}
	for _, c := range v.clients {
		st, err := v.l.Status(ctx, c)
		if err != nil {
			next.Failed[c] = true
			if !v.snap.Failed[c] {
				v.l.o.Logger.Warn("budgets could not be read for operators (metrics, admin API); their series are left out until they can",
					slog.String("client", c), slog.Any("err", err))
			}
			continue
		}
		next.Clients[c] = st
		v.sample(c, st, now)
	}
	v.snap, v.read = next, true
	return next
}

// sample keeps st's readings in their slots of the window.
func (v *View) sample(client string, st []Status, now time.Time) {
	for _, s := range st {
		start, reset := Window(s.Window, now)
		k := seriesKey{client, s.Budget}
		sl := v.series[k]
		if sl == nil || !sl.start.Equal(start) {
			sl = &slots{start: start}
			v.series[k] = sl
		}
		i := int(int64(now.Sub(start)) * ChartSamples / int64(reset.Sub(start)))
		i = min(max(i, 0), ChartSamples-1)
		sl.s[i] = Sample{Slot: i, At: now, Spent: s.Spent, Held: s.Held}
		sl.set[i] = true
	}
}

// Chart reads the budgets (Snapshot) and returns each budget of every
// client read with its samples in the current window, by client then in
// the client's order of budgets; and the clients that failed, sorted.
func (v *View) Chart(ctx context.Context) (series []Series, failed []string) {
	snap := v.Snapshot(ctx)
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, c := range v.clients {
		if snap.Failed[c] {
			failed = append(failed, c)
			continue
		}
		for _, st := range snap.Clients[c] {
			start, _ := Window(st.Window, snap.At)
			s := Series{Client: c, Status: st, Start: start}
			if sl := v.series[seriesKey{c, st.Budget}]; sl != nil && sl.start.Equal(start) {
				for i, ok := range sl.set {
					if ok {
						s.Samples = append(s.Samples, sl.s[i])
					}
				}
			}
			series = append(series, s)
		}
	}
	return series, failed
}

// The gauges' descriptions. Amounts are tokens, or micro-units of money
// for a cost budget (as llmgate_budget_charged_total counts them).
var (
	descLimit = gaugeDesc(prometheus.GaugeOpts{Name: "llmgate_budget_limit",
		Help: "Each client's budget: its limit in the window (tokens, or micro-units of money for a cost budget). " +
			"budget is window.unit.count[.model], as in llmgate_budget_refused_total."})
	descSpent = gaugeDesc(prometheus.GaugeOpts{Name: "llmgate_budget_spent",
		Help: "What the client's settled runs were charged in the budget's current window (tokens, or micro-units)."})
	descHeld = gaugeDesc(prometheus.GaugeOpts{Name: "llmgate_budget_held",
		Help: "What the client's runs in flight reserve on the budget (tokens, or micro-units)."})
	descRemaining = gaugeDesc(prometheus.GaugeOpts{Name: "llmgate_budget_remaining",
		Help: "The budget's limit less what was spent in the window, at least 0 (tokens, or micro-units)."})
	descReset = gaugeDesc(prometheus.GaugeOpts{Name: "llmgate_budget_reset_timestamp_seconds",
		Help: "When the budget's current window ends and its spend starts again from 0 (Unix time)."})
)

// gaugeDesc is the description of a gauge by client, budget and window.
func gaugeDesc(o prometheus.GaugeOpts) *prometheus.Desc {
	return prometheus.NewDesc(o.Name, o.Help, []string{"client", "budget", "window"}, nil)
}

// Describe is prometheus.Collector's.
func (v *View) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLimit, descSpent, descHeld, descRemaining, descReset} {
		ch <- d
	}
}

// Collect is prometheus.Collector's: the gauges of the Snapshot. A client
// whose budgets could not be read has no series in this scrape; the
// scrape itself never fails.
func (v *View) Collect(ch chan<- prometheus.Metric) {
	snap := v.Snapshot(context.Background())
	for _, c := range v.clients {
		for _, st := range snap.Clients[c] {
			labels := []string{c, st.Budget, st.Window}
			for _, g := range []struct {
				d *prometheus.Desc
				v float64
			}{
				{descLimit, float64(st.Limit)}, {descSpent, float64(st.Spent)}, {descHeld, float64(st.Held)},
				{descRemaining, float64(st.Remaining)}, {descReset, float64(st.Reset.Unix())},
			} {
				ch <- prometheus.MustNewConstMetric(g.d, prometheus.GaugeValue, g.v, labels...)
			}
		}
	}
}
