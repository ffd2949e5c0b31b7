// Package budget keeps each client's token and cost budgets
// (clients[].budgets, tokens_per_minute): before a provider run it
// reserves an estimate on every budget that applies, and refuses the
// request when one does not fit; after the run it settles with the usage
// the provider reported, or the estimate when it reported none.
//
// Counters are kept per client, budget and window (a UTC minute, day or
// month) in the store — Badger, local and crash-safe; Redis, atomic
// across replicas — as integers: tokens, or money in micro-units.
//
// # Overshoot
//
// A reservation is taken only if, on every counter it touches, spent +
// held + the estimate stays within the limit; settling replaces the
// estimate by the charge. So spend passes a limit only by runs charged
// more than they reserved, and only by what those in flight together
// underestimated: when the last reservation that fit was taken, spent +
// held + its estimate ≤ limit, so at the end
//
//	spent ≤ limit + Σ max(0, charged − reserved), over the runs in flight then.
//
// The output part of an estimate is the request's own max_tokens (or
// budgets.default_max_tokens), which providers do not exceed, so what
// can be underestimated is the prompt (its bytes / budgets.bytes_per_token)
// and, for a cost budget, a price: each run is priced at its upstream,
// the reservation at the dearest upstream of the plan. A request the
// gateway retried after a 2xx that was cut (every such run is billed) is
// charged for each run: its retries add up to retry.max_attempts − 1
// further estimates to the bound.
package budget

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/metrics"
)

// Store keeps the budget counters (cache/badger, cache/redis).
type Store interface {
	ReserveBudget(ctx context.Context, scope string, h cache.BudgetHold) (refused int, err error)
	SettleBudget(ctx context.Context, scope, id string, lines []cache.BudgetLine) error
	ReadBudgets(ctx context.Context, scope string, counters []string) ([]cache.BudgetCount, error)
}

// Options configure a Ledger. Store and Metrics are required when any
// client has a budget.
type Options struct {
	// Budgets are each client's budgets by name (config.Client.AllBudgets);
	// "" is the one shared scope when no clients are configured.
	Budgets map[string][]config.Budget
	// Upstreams price the runs (config.Upstream.PriceOf), by name.
	Upstreams map[string]config.Upstream
	Settings  config.Budgets
	// AllowUnmetered are the budgeted clients, by name, whose passthrough
	// calls that spend unmetered run (config.Client.UnmeteredAllowed).
	AllowUnmetered map[string]bool
	// Deadline is retry.deadline: the reservation ttl is derived from it
	// when Settings.ReservationTTL is 0.
	Deadline time.Duration
	Store    Store
	Metrics  *metrics.Metrics
	// Now is the clock of the windows. If nil, time.Now.
	Now func() time.Time
	// Logger: if nil, logs are discarded.
	Logger *slog.Logger
}

// Ledger reserves and settles the clients' budgets.
type Ledger struct {
	o   Options
	ttl time.Duration
}

// New returns a Ledger.
func New(o Options) *Ledger {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Ledger{o: o, ttl: o.Settings.TTL(o.Deadline)}
}

// Budgeted reports whether client has any budget.
func (l *Ledger) Budgeted(client string) bool { return l != nil && len(l.o.Budgets[client]) > 0 }

// Unmetered refuses a budgeted client's passthrough call that spends
// where no budget can charge it (config.SpendsUnmetered), unless the
// client may (Options.AllowUnmetered): an *apierror.UnmeteredRefused,
// counted as a refusal of budget "unmetered". nil for any other call.
func (l *Ledger) Unmetered(client, method, path string) error {
	if !l.Budgeted(client) || l.o.AllowUnmetered[client] || !config.SpendsUnmetered(method, path) {
		return nil
	}
	l.o.Metrics.BudgetRefused(client, UnmeteredBudget)
	return &apierror.UnmeteredRefused{Client: client, Method: method, Path: path}
}

// UnmeteredLater is Unmetered for a billed call whose usage comes only
// later (a background response: its answer is queued, without usage):
// refused when one of client's budgets applies to model, unless the
// client may spend unmetered. what names the call in the refusal.
func (l *Ledger) UnmeteredLater(client, model, method, what string) error {
	if !l.Budgeted(client) || l.o.AllowUnmetered[client] {
		return nil
	}
	for _, b := range l.o.Budgets[client] {
		if b.Matches(model) {
			l.o.Metrics.BudgetRefused(client, UnmeteredBudget)
			return &apierror.UnmeteredRefused{Client: client, Method: method, Path: what}
		}
	}
	return nil
}

// UnmeteredBudget is the budget label of Unmetered's refusals in
// llmgate_budget_refused_total.
const UnmeteredBudget = "unmetered"

// Request is what one request's runs are reserved for.
type Request struct {
	Client, Model string
	// Upstreams are the plan's upstreams, the routed one first: a cost
	// estimate is priced at the dearest of them.
	Upstreams []string
	// Estimate is the tokens reserved per run (Estimate reads a body).
	Estimate classify.Tokens
}

// Hold is the reservation of one request. Settle it once, with its runs.
type Hold struct {
	l     *Ledger
	id    string
	req   Request
	lines []line
}

// line is one budget a hold touches, in the window it was taken in: a
// run is charged to the window its request was reserved in.
type line struct {
	budget   config.Budget
	counter  string
	reset    time.Time
	reserved int64
}

// Reserve reserves req's estimate on every budget of its client that
// applies to its model. It returns nil, nil when none does. A budget it
// does not fit is an *Exceeded; an unreachable store, under
// on_store_error: refuse, an *Unavailable (allow: nil, nil, counted).
func (l *Ledger) Reserve(ctx context.Context, req Request) (*Hold, error) {
	if l == nil {
		return nil, nil
	}
	now := l.o.Now().UTC()
	h := &Hold{l: l, id: newID(), req: req}
	for _, b := range l.o.Budgets[req.Client] {
		if !b.Matches(req.Model) {
			continue
		}
		start, reset := Window(b.Window, now)
		ln := line{budget: b, counter: b.ID() + "@" + windowLabel(b.Window, start), reset: reset}
		ln.reserved = l.amountForEstimate(b, req)
		h.lines = append(h.lines, ln)
	}
	if len(h.lines) == 0 {
		return nil, nil
	}
	for _, ln := range h.lines {
		if limit := limitOf(ln.budget); ln.reserved > limit {
			// It can never fit, in this window or the next: no store
			// call, no reset to wait for.
			l.o.Metrics.BudgetRefused(req.Client, ln.budget.ID())
			return nil, &apierror.BudgetExceeded{Client: req.Client, Budget: ln.budget.ID(), What: describe(ln.budget), Window: ln.budget.Window,
				Reset: ln.reset, Never: true, Figures: &apierror.BudgetFigures{Limit: limit, Needs: ln.reserved, Cost: ln.budget.Cost > 0}}
		}
	}
	hold := cache.BudgetHold{ID: h.id, TTL: l.ttl, Lines: make([]cache.BudgetLine, len(h.lines))}
	for i, ln := range h.lines {
		hold.Lines[i] = cache.BudgetLine{Counter: ln.counter, Limit: limitOf(ln.budget), Amount: ln.reserved, Until: l.until(ln.reset)}
	}
	refused, err := l.o.Store.ReserveBudget(ctx, req.Client, hold)
	if err != nil && ctx.Err() != nil && context.Cause(ctx) != context.DeadlineExceeded {
		// The request's own end (its deadline, its client leaving, the
		// gateway shutting down: a cause other than ctx's own timeout)
		// cut the store call short. Not the store's failure: neither
		// counted nor allowed through.
		return nil, &RequestEnded{Cause: context.Cause(ctx)}
	}
	if err != nil {
		return nil, l.storeFailed(req.Client, err)
	}
	if refused > 0 {
		ln := h.lines[refused-1]
		l.o.Metrics.BudgetRefused(req.Client, ln.budget.ID())
		return nil, &apierror.BudgetExceeded{Client: req.Client, Budget: ln.budget.ID(), What: describe(ln.budget), Window: ln.budget.Window,
			Reset: ln.reset, RetryAfter: ln.reset.Sub(now), Figures: l.figures(ctx, req.Client, ln)}
	}
	return h, nil
}

// figures reads a refused line's counter for the refusal's message: nil
// when the store cannot say (the refusal stands without them). They are
// read after the refusal, so a run that settled in between shows.
func (l *Ledger) figures(ctx context.Context, client string, ln line) *apierror.BudgetFigures {
	got, err := l.o.Store.ReadBudgets(ctx, client, []string{ln.counter})
	if err != nil || len(got) != 1 {
		return nil
	}
	return &apierror.BudgetFigures{Spent: got[0].Spent, Held: got[0].Held, Limit: limitOf(ln.budget), Needs: ln.reserved, Cost: ln.budget.Cost > 0}
}

// until is how long a counter whose window ends at reset is kept: past
// its window by the reservation ttl (its last run may settle then), and
// an hour for the operator to read it.
func (l *Ledger) until(reset time.Time) time.Time { return reset.Add(l.ttl + time.Hour) }

// RequestEnded is Reserve's answer when the request's own end cut its
// store call short (Cause says what ended it).
type RequestEnded struct{ Cause error }

func (e *RequestEnded) Error() string { return "reserving the budget: " + e.Cause.Error() }
func (e *RequestEnded) Unwrap() error { return e.Cause }

// storeFailed is Reserve's answer when the store failed: refused
// (Unavailable) or, under on_store_error: allow, run uncharged.
func (l *Ledger) storeFailed(client string, err error) error {
	if l.o.Settings.OnStoreError == config.OnStoreErrorAllow {
		l.o.Metrics.BudgetStoreError("reserve", "allowed")
		l.o.Logger.Warn("budget store unreachable; request runs uncharged (budgets.on_store_error: allow)", "client", client, "err", err)
		return nil
	}
	l.o.Metrics.BudgetStoreError("reserve", "refused")
	return &apierror.BudgetUnavailable{Err: err}
}

// Run is one provider run a request made and the provider billed: its
// upstream and what it reported (Usage.Reported false: nothing, and it
// is charged its reservation).
type Run struct {
	Upstream string
	Usage    classify.Tokens
}

// Settle charges h's runs (none: the request never reached a provider
// that billed it, and the reservation is released) and ends h. Called on
// a nil Hold it does nothing. The settlement outlives the request's
// context (it is bounded by ctx's values only, and timeout).
func (h *Hold) Settle(ctx context.Context, timeout time.Duration, runs []Run) {
	if h == nil {
		return
	}
	l := h.l
	lines := make([]cache.BudgetLine, len(h.lines))
	for i, ln := range h.lines {
		lines[i] = cache.BudgetLine{Counter: ln.counter, Until: l.until(ln.reset)}
		for _, r := range runs {
			charge, estimated := l.charge(ln, h.req, r)
			lines[i].Amount = cache.AddCapped(lines[i].Amount, charge)
			l.o.Metrics.BudgetCharged(h.req.Client, ln.budget.ID(), charge, estimated)
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := l.o.Store.SettleBudget(ctx, h.req.Client, h.id, lines); err != nil {
		// The reservation expires by itself; what the runs cost beyond it
		// is not counted.
		l.o.Metrics.BudgetStoreError("settle", "lost")
		l.o.Logger.Error("budget settlement not recorded; the reservation expires after budgets.reservation_ttl",
			"client", h.req.Client, "err", err)
	}
}

// charge is what run r costs on line ln: its reported usage, or — none
// reported — the line's reservation (estimated).
func (l *Ledger) charge(ln line, req Request, r Run) (amount int64, estimated bool) {
	if !r.Usage.Reported {
		return ln.reserved, true
	}
	if ln.budget.Cost == 0 {
		return tokensOf(ln.budget.CountOrTotal(), r.Usage), false
	}
	u, ok := l.o.Upstreams[r.Upstream]
	p, priced := u.PriceOf(req.Model)
	if !ok || !priced {
		l.o.Metrics.BudgetUnpriced(r.Upstream, req.Model, req.Client)
		return 0, false
	}
	return Cost(ln.budget.CountOrTotal(), r.Usage, p), false
}

// amountForEstimate is what a run of req reserves on b.
func (l *Ledger) amountForEstimate(b config.Budget, req Request) int64 {
	if b.Cost == 0 {
		return tokensOf(b.CountOrTotal(), req.Estimate)
	}
	var most int64
	for _, name := range req.Upstreams {
		if p, ok := l.o.Upstreams[name].PriceOf(req.Model); ok {
			most = max(most, Cost(b.CountOrTotal(), req.Estimate, EstimatePrice(p)))
		}
	}
	return most
}

// EstimatePrice is p for pricing an estimate, whose input tokens may turn
// out cached or written to the prompt cache: every input token at the
// dearest of p's input prices (Anthropic's cache writes cost more than
// fresh input), so a reservation is never priced below what its prompt can
// cost.
func EstimatePrice(p config.Price) config.Price {
	p.Input = max(p.Input, p.CachedInput, p.CacheWrite)
	return p
}

func limitOf(b config.Budget) int64 {
	if b.Cost > 0 {
		return int64(b.Cost)
	}
	return b.Tokens
}

// tokensOf is the tokens of t that count counts. Anthropic's cache
// tokens are input beside In; OpenAI's cached_tokens are in In already.
func tokensOf(count string, t classify.Tokens) int64 {
	in := cache.AddCapped(cache.AddCapped(t.In, t.CacheCreation), t.CacheRead)
	switch count {
	case config.CountInput:
		return in
	case config.CountOutput:
		return t.Out
	}
	return cache.AddCapped(in, t.Out)
}

// Cost is what the tokens of t that count counts cost at p, in
// micro-units, rounded up (a run is never charged less than it cost):
// input not cached at p.Input, OpenAI's cached_tokens and Anthropic's
// cache reads at p.CachedInput, Anthropic's cache writes at p.CacheWrite,
// output at p.Output, each price per million tokens. Exact integer
// arithmetic, capped at math.MaxInt64.
func Cost(count string, t classify.Tokens, p config.Price) int64 {
	cached, write := p.CachedInput, p.CacheWrite
	if cached == 0 {
		cached = p.Input
	}
	if write == 0 {
		write = p.Input
	}
	var parts [][2]int64
	if count != config.CountOutput {
		fresh := max(t.In-t.Cached, 0)
		parts = append(parts, [2]int64{fresh, int64(p.Input)}, [2]int64{t.Cached + t.CacheRead, int64(cached)},
			[2]int64{t.CacheCreation, int64(write)})
	}
	if count != config.CountInput {
		parts = append(parts, [2]int64{t.Out, int64(p.Output)})
	}
	var hi, lo uint64
	for _, pt := range parts {
		h, l := bits.Mul64(uint64(max(pt[0], 0)), uint64(max(pt[1], 0)))
		var c uint64
		lo, c = bits.Add64(lo, l, 0)
		hi += h + c
	}
	const perMillion = 1_000_000
	if hi >= perMillion {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, perMillion)
	if r > 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// mulCapped is a × b for a, b ≥ 0, capped at math.MaxInt64.
func mulCapped(a, b int64) int64 {
	if hi, lo := bits.Mul64(uint64(a), uint64(b)); hi == 0 && lo <= math.MaxInt64 {
		return int64(lo)
	}
	return math.MaxInt64
}

// Window is the UTC window of kind (minute, day, month) now is in: its
// start, and its end, when the budget resets.
func Window(kind string, now time.Time) (start, reset time.Time) {
	now = now.UTC()
	switch kind {
	case config.WindowMinute:
		start = now.Truncate(time.Minute)
		return start, start.Add(time.Minute)
	case config.WindowMonth:
		start = time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 1, 0)
	}
	start = time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	return start, start.AddDate(0, 0, 1)
}

// windowLabel names a window in its counter: 2026-12-02T03:46,
// 2026-12-02, 2026-12.
func windowLabel(kind string, start time.Time) string {
	switch kind {
	case config.WindowMinute:
		return start.Format("2006-01-02T15:04")
	case config.WindowMonth:
		return start.Format("2006-01")
	}
	return start.Format("2006-01-02")
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Output is what a request may produce, for its reservation.
type Output struct {
	// MaxTokens is max_tokens, max_completion_tokens or max_output_tokens;
	// 0 when the request set none: budgets.default_max_tokens.
	MaxTokens int64
	// Choices is n or best_of: each may be billed MaxTokens. If <= 0, 1.
	Choices int64
	// Prompts is how many prompts a legacy completion holds, each answered
	// Choices times. If <= 0, 1.
	Prompts int64
	// None: the endpoint produces no output tokens (embeddings).
	None bool
	// Later: what the call spends is reported only later (a background
	// response), not by its answer.
	Later bool
}

// Estimate is what one run of a request is reserved for: its body's
// bytes over bytes_per_token (rounded up) as input, and out's MaxTokens
// (or default_max_tokens) for each choice of each prompt as output.
func Estimate(s config.Budgets, bodyBytes int, out Output) classify.Tokens {
	per := max(s.BytesPerToken, 1)
	t := classify.Tokens{In: (int64(bodyBytes) + per - 1) / per, Reported: true}
	if out.None {
		return t
	}
	t.Out = out.MaxTokens
	if t.Out <= 0 {
		t.Out = s.DefaultMaxTokens
	}
	t.Out = mulCapped(t.Out, mulCapped(max(out.Choices, 1), max(out.Prompts, 1)))
	return t
}

// describe is b in words, for the refusal's message.
func describe(b config.Budget) string {
	what := fmt.Sprintf("%d %s tokens", b.Tokens, b.CountOrTotal())
	if b.Cost > 0 {
		what = b.Cost.String() + " of cost"
		if b.CountOrTotal() != config.CountTotal {
			what += " on " + b.CountOrTotal() + " tokens"
		}
	}
	what += " per " + b.Window
	if b.Model != "" {
		what += " for models " + b.Model
	}
	return what
}

// Status is one budget of a client in its current window, for operators
// (GET /admin/clients). Limit, Spent, Held and Remaining are tokens, or
// micro-units of money for a cost budget.
type Status struct {
	Budget string `json:"budget"`
	Window string `json:"window"`
	// Unit is tokens or cost; Count which tokens count; Model the scope.
	Unit  string `json:"unit"`
	Count string `json:"count"`
	Model string `json:"model,omitempty"`
	Limit int64  `json:"limit"`
	Spent int64  `json:"spent"`
	// Held is what the runs in flight reserve.
	Held int64 `json:"held"`
	// Remaining is Limit − Spent, at least 0.
	Remaining int64     `json:"remaining"`
	Reset     time.Time `json:"reset"`
}

// Status reads client's budgets in their current windows (none: nil).
func (l *Ledger) Status(ctx context.Context, client string) ([]Status, error) {
	if !l.Budgeted(client) {
		return nil, nil
	}
	now := l.o.Now().UTC()
	bs := l.o.Budgets[client]
	out := make([]Status, len(bs))
	counters := make([]string, len(bs))
	for i, b := range bs {
		start, reset := Window(b.Window, now)
		counters[i] = b.ID() + "@" + windowLabel(b.Window, start)
		unit := "tokens"
		if b.Cost > 0 {
			unit = "cost"
		}
		out[i] = Status{Budget: b.ID(), Window: b.Window, Unit: unit, Count: b.CountOrTotal(), Model: b.Model, Limit: limitOf(b), Reset: reset}
	}
	counts, err := l.o.Store.ReadBudgets(ctx, client, counters)
	if err != nil {
		return nil, fmt.Errorf("read budgets of %q: %w", client, err)
	}
	for i, c := range counts {
		out[i].Spent, out[i].Held = c.Spent, c.Held
		out[i].Remaining = max(out[i].Limit-c.Spent, 0)
	}
	return out, nil
}
