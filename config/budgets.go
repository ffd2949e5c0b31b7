package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Budget windows: a budget's counter starts again at the start of each
// UTC minute, day or month.
const (
	WindowMinute = "minute"
	WindowDay    = "day"
	WindowMonth  = "month"
)

// What a budget counts of each run's usage.
const (
	CountInput  = "input"
	CountOutput = "output"
	CountTotal  = "total"
)

// Budget caps what one client spends in a window, in tokens or in money,
// across all replicas. A request whose reservation does not fit gets 429
// budget_exceeded before any upstream call (see package budget).
type Budget struct {
	// Window is minute, day or month, aligned to UTC.
	Window string `yaml:"window"`
	// Tokens caps the tokens Count counts in the window. Exactly one of
	// Tokens and Cost is set.
	Tokens int64 `yaml:"tokens"`
	// Cost caps the money spent in the window, priced by the upstreams'
	// prices tables ("25.00": 25 units of the operator's currency).
	Cost Money `yaml:"cost"`
	// Count is which tokens count (and are priced, for a Cost budget):
	// input, output or total. If empty, total.
	Count string `yaml:"count"`
	// Model, when set, scopes the budget to the models it matches (a glob,
	// as upstreams[].models are); other models pass it by.
	Model string `yaml:"model"`
}

// CountOrTotal is b's Count, total when empty.
func (b Budget) CountOrTotal() string {
	if b.Count == "" {
		return CountTotal
	}
	return b.Count
}

// ID names b among its client's budgets, stably across restarts and
// replicas: the part of its counter's key that is not the client or the
// window's start ("day.tokens.total", "month.cost.input.gpt-4o*").
func (b Budget) ID() string {
	unit := "tokens"
	if b.Cost > 0 {
		unit = "cost"
	}
	id := b.Window + "." + unit + "." + b.CountOrTotal()
	if b.Model != "" {
		id += "." + b.Model
	}
	return id
}

// Matches reports whether b applies to a request for model.
func (b Budget) Matches(model string) bool {
	return b.Model == "" || globMatch(b.Model, model)
}

// Budgets are the settings every client's budgets share: how a request's
// reservation is estimated, how long one lives, and what happens when the
// budget store cannot be reached.
type Budgets struct {
	// DefaultMaxTokens is the output a request is reserved for when it
	// sets no max_tokens, max_completion_tokens or max_output_tokens.
	// If 0, 4096.
	DefaultMaxTokens int64 `yaml:"default_max_tokens"`
	// BytesPerToken estimates a prompt's tokens from its body's size: the
	// body's bytes divided by it, rounded up. If 0, 4. 1 never
	// underestimates a text prompt (a token is at least one byte), at the
	// price of reserving about four times what most prompts use.
	BytesPerToken int64 `yaml:"bytes_per_token"`
	// ReservationTTL is how long a reservation holds budget when its run
	// never settles (the gateway crashed mid-call): after it, the budget
	// is free again. It must outlast the longest call, retry.deadline.
	// If 0, retry.deadline + 5m (or 1h with no retry.deadline).
	ReservationTTL Duration `yaml:"reservation_ttl"`
	// OnStoreError is what a budgeted client's request gets when the
	// budget store cannot be reached: "refuse" (503, the default: a budget
	// is a promise to the operator) or "allow" (the request runs
	// uncharged, counted in llmgate_budget_store_errors_total).
	OnStoreError string `yaml:"on_store_error"`
	// AllowUnmetered lets budgeted clients make the passthrough calls that
	// spend at the provider without usage the gateway can charge as they
	// run (SpendsUnmetered: images, audio, batches); they run uncharged.
	// If false (the default), such a call is refused with 403
	// budget_unmetered_endpoint. A client's own allow_unmetered wins.
	AllowUnmetered bool `yaml:"allow_unmetered"`
}

// Budget store failure policies (Budgets.OnStoreError).
const (
	OnStoreErrorRefuse = "refuse"
	OnStoreErrorAllow  = "allow"
)

// TTL is the reservation TTL in force: ReservationTTL, or derived from
// deadline (retry.deadline) when it is 0.
func (b Budgets) TTL(deadline time.Duration) time.Duration {
	switch {
	case b.ReservationTTL > 0:
		return b.ReservationTTL.D()
	case deadline > 0:
		return deadline + 5*time.Minute
	}
	return time.Hour
}

// Price is what an upstream charges per million tokens of each kind, in
// money (Money: micro-units of the operator's currency).
type Price struct {
	// Input is per million input tokens not read from a prompt cache.
	Input Money `yaml:"input"`
	// Output is per million output tokens (reasoning tokens included, as
	// providers count them).
	Output Money `yaml:"output"`
	// CachedInput is per million input tokens read from the prompt cache
	// (OpenAI's cached_tokens, Anthropic's cache_read_input_tokens). If 0,
	// Input.
	CachedInput Money `yaml:"cached_input"`
	// CacheWrite is per million input tokens written to the prompt cache
	// (Anthropic's cache_creation_input_tokens). If 0, Input.
	CacheWrite Money `yaml:"cache_write"`
}

// PriceOf is the price u charges for model: its prices entry (an exact
// name first, then the first glob in name order that matches), else its
// default_price; ok is false when neither is set (the model is
// uncounted in money).
func (u Upstream) PriceOf(model string) (p Price, ok bool) {
	if p, ok := u.Prices[model]; ok {
		return p, true
	}
	best := ""
	for pattern := range u.Prices {
		if strings.ContainsAny(pattern, "*?[") && globMatch(pattern, model) && (best == "" || pattern < best) {
			best = pattern
		}
	}
	if best != "" {
		return u.Prices[best], true
	}
	if u.DefaultPrice != nil {
		return *u.DefaultPrice, true
	}
	return Price{}, false
}

// Money is an amount in micro-units (millionths) of the operator's
// currency, an integer end to end: "2.50" is 2500000. In YAML it is
// written as a decimal number of currency units with at most six decimals.
type Money int64

// MicroUnits per currency unit.
const MicroUnits = 1_000_000

// ParseMoney reads a decimal amount of currency units ("2.5", "0.000075",
// "12", "-1") into micro-units, exactly: no float is involved.
func ParseMoney(s string) (Money, error) {
	bad := fmt.Errorf("%q is not an amount (write units with up to six decimals, e.g. \"2.50\")", s)
	t := strings.TrimSpace(s)
	neg := strings.HasPrefix(t, "-")
	whole, frac, _ := strings.Cut(strings.TrimPrefix(t, "-"), ".")
	if whole == "" && frac == "" || !digits(whole) || !digits(frac) {
		return 0, bad
	}
	if len(frac) > 6 {
		return 0, fmt.Errorf("%q has more than six decimals (amounts are kept in micro-units)", s)
	}
	w := int64(0)
	if whole != "" {
		var err error
		if w, err = strconv.ParseInt(whole, 10, 64); err != nil || w > math.MaxInt64/MicroUnits-1 {
			return 0, bad
		}
	}
	f := int64(0)
	if frac != "" {
		f, _ = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64)
	}
	v := w*MicroUnits + f
	if neg {
		v = -v
	}
	return Money(v), nil
}

// digits reports whether s is ASCII digits only (or empty).
func digits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// String writes m in currency units, with six decimals.
func (m Money) String() string {
	sign := ""
	v := int64(m)
	if v < 0 {
		sign, v = "-", -v
	}
	return fmt.Sprintf("%s%d.%06d", sign, v/MicroUnits, v%MicroUnits)
}

// MarshalYAML writes m as UnmarshalYAML reads it.
func (m Money) MarshalYAML() (any, error) { return m.String(), nil }

// UnmarshalYAML reads an amount from the scalar's text, never through a
// float.
func (m *Money) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return durationError(n.Line, n.Column, "an amount is a number, e.g. \"2.50\"")
	}
	v, err := ParseMoney(n.Value)
	if err != nil {
		return durationError(n.Line, n.Column, err.Error())
	}
	*m = v
	return nil
}

// validateBudgets checks budgets, every client's budgets and tokens per
// minute, and the upstreams' prices.
func (c *Config) validateBudgets(p *problems) {
	b := c.Budgets
	positive(p, "budgets.default_max_tokens", b.DefaultMaxTokens)
	positive(p, "budgets.bytes_per_token", b.BytesPerToken)
	if d := c.Retry.Deadline.D(); b.ReservationTTL < 0 || d > 0 && b.ReservationTTL != 0 && b.ReservationTTL.D() <= d {
		p.add("budgets.reservation_ttl", "%v must be longer than retry.deadline (%v): a reservation must outlast the call it holds budget for",
			b.ReservationTTL.D(), d)
	}
	switch b.OnStoreError {
	case OnStoreErrorRefuse, OnStoreErrorAllow:
	default:
		p.add("budgets.on_store_error", "%q is not refuse or allow", b.OnStoreError)
	}
	if n := c.ClientLimits.TokensPerMinute; n < 0 {
		p.add("client_limits.tokens_per_minute", "%d is not %s", n, limitRange(0))
	}
	priced := false
	for i, u := range c.Upstreams {
		priced = priced || len(u.Prices) > 0 || u.DefaultPrice != nil
		for model, pr := range u.Prices {
			f := fmt.Sprintf("upstreams[%d].prices[%q]", i, model)
			if model == "" {
				p.add(f, "empty model name (name a model, or a glob such as gpt-4o*)")
			}
			validatePrice(p, f, pr)
		}
		if u.DefaultPrice != nil {
			validatePrice(p, fmt.Sprintf("upstreams[%d].default_price", i), *u.DefaultPrice)
		}
	}
	for i, cl := range c.Clients {
		if n := cl.Limits.TokensPerMinute; n < -1 {
			p.add(fmt.Sprintf("clients[%d].limits.tokens_per_minute", i), "%d is not %s", n, limitRange(-1))
		}
		if cl.AllowUnmetered != nil && len(cl.AllBudgets(c.ClientLimits)) == 0 {
			p.add(fmt.Sprintf("clients[%d].allow_unmetered", i),
				"set, but the client has no budgets and no tokens_per_minute, so none of its calls is refused as unmetered (remove it, or give the client a budget)")
		}
		seen := map[string]int{}
		for j, bu := range cl.Budgets {
			f := fmt.Sprintf("clients[%d].budgets[%d]", i, j)
			validateBudget(p, f, bu, priced)
			if k, dup := seen[bu.ID()]; dup {
				p.add(f, "same window, unit, count and model as clients[%d].budgets[%d] (keep one)", i, k)
			}
			seen[bu.ID()] = j
		}
	}
}

func validateBudget(p *problems, f string, b Budget, priced bool) {
	switch b.Window {
	case WindowMinute, WindowDay, WindowMonth:
	default:
		p.add(f+".window", "%q is not minute, day or month", b.Window)
	}
	switch b.Count {
	case "", CountInput, CountOutput, CountTotal:
	default:
		p.add(f+".count", "%q is not input, output or total", b.Count)
	}
	switch {
	case b.Tokens < 0:
		p.add(f+".tokens", "%d is negative", b.Tokens)
	case b.Cost < 0:
		p.add(f+".cost", "%s is negative", b.Cost)
	case b.Tokens > 0 && b.Cost > 0:
		p.add(f, "both tokens and cost are set (one budget caps one of them: write two budgets)")
	case b.Tokens == 0 && b.Cost == 0:
		p.add(f, "neither tokens nor cost is set (set the cap, e.g. tokens: 1000000 or cost: \"25.00\")")
	case b.Cost > 0 && !priced:
		p.add(f+".cost", "no upstream has prices or default_price, so no cost is ever counted (set upstreams[].prices)")
	}
}

func validatePrice(p *problems, f string, pr Price) {
	for _, v := range []struct {
		name string
		m    Money
	}{{"input", pr.Input}, {"output", pr.Output}, {"cached_input", pr.CachedInput}, {"cache_write", pr.CacheWrite}} {
		switch {
		case v.m < 0:
			p.add(f+"."+v.name, "%s is negative", v.m)
		case v.m > 1_000_000*MicroUnits:
			p.add(f+"."+v.name, "%s per million tokens is over 1000000.000000 (prices are per million tokens)", v.m)
		}
	}
}
