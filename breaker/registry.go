package breaker

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// Key names one breaker: an upstream, and a model of it ("" for the
// upstream's own breaker).
type Key struct {
	Upstream string
	Model    string
}

// Upstream is one upstream a Registry keeps breakers for.
type Upstream struct {
	Name string
	// Models are the model names configured for it; under ScopeModel each
	// exact one (no "*") has a breaker from the start, outside the
	// MaxLearnedModels bound.
	Models []string
}

// Registry holds every breaker: per upstream, its own and (ScopeModel)
// one per model. It is safe for concurrent use.
type Registry struct {
	s     Settings
	names []string             // sorted
	ups   map[string]*upstream // never written after New, so read without a lock
}

// upstream is one upstream's breakers.
type upstream struct {
	name string
	// own is the upstream's own breaker: under ScopeUpstream the only one,
	// under ScopeModel the upstream-wide one for connection failures.
	own *entry

	mu      sync.RWMutex
	models  map[string]*entry
	learned int // models added after New, lanes not counted
	// learnedBy counts the models each client learned (named first): at
	// most its share (Registry.share) each.
	learnedBy map[string]int
	untracked bool // a model was refused a breaker (OnUntracked called)
}

// New returns a Registry with closed breakers for ups. Duplicate names
// share their breakers.
func New(ups []Upstream, s Settings) *Registry {
	r := &Registry{s: s.withDefaults(), ups: make(map[string]*upstream, len(ups))}
	for _, u := range ups {
		set, ok := r.ups[u.Name]
		if !ok {
			covers := "connection"
			if r.s.Scope == ScopeUpstream {
				covers = "upstream"
			}
			set = &upstream{name: u.Name, own: r.newEntry(Key{Upstream: u.Name}, covers), models: map[string]*entry{},
				learnedBy: map[string]int{}}
			r.ups[u.Name] = set
			r.names = append(r.names, u.Name)
		}
		if r.s.Scope == ScopeUpstream {
			continue
		}
		for _, m := range u.Models {
			if m != "" && !strings.Contains(m, "*") && set.models[m] == nil {
				set.models[m] = r.newEntry(Key{Upstream: u.Name, Model: m}, "model")
			}
		}
	}
	slices.Sort(r.names)
	return r
}

func (r *Registry) upstream(name string) (*upstream, error) {
	set, ok := r.ups[name]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownUpstream, name)
	}
	return set, nil
}

// model returns the breaker of model, making it if it is new: a lane's
// always, a learned model's while fewer than MaxLearnedModels were
// learned and fewer than its share by client (who names it first); else
// nil (the model has no breaker of its own).
// A model whose name looks like a lane but is not asked for as one (a
// client's body naming "(files)") has none: it cannot share a lane's fate
// nor make lanes past the bound.
func (r *Registry) model(set *upstream, model, client string, lane bool) *entry {
	if isLane(model) != lane {
		return nil
	}
	set.mu.RLock()
	e := set.models[model]
	set.mu.RUnlock()
	if e != nil {
		return e
	}
	e, first := r.learn(set, model, client, lane)
	if e == nil && first && r.s.OnUntracked != nil {
		r.s.OnUntracked(Key{Upstream: set.name, Model: model})
	}
	return e
}

// learn makes model's (or lane's) breaker under set's lock; first
// reports the first model of set refused one for want of room (not for a
// client past its share).
func (r *Registry) learn(set *upstream, model, client string, lane bool) (e *entry, first bool) {
	set.mu.Lock()
	defer set.mu.Unlock()
	if e := set.models[model]; e != nil {
		return e, false
	}
	covers := "lane"
	if !lane {
		if set.learned >= r.s.MaxLearnedModels {
			first, set.untracked = !set.untracked, true
			return nil, first
		}
		if set.learnedBy[client] >= r.share(client) || !utf8.ValidString(model) {
			return nil, false // (a name not UTF-8 could be no metric label)
		}
		set.learned++
		set.learnedBy[client]++
		covers = "model"
	}
	e = r.newEntry(Key{Upstream: set.name, Model: model}, covers)
	set.models[model] = e
	return e, false
}

// share is the most models client may learn per upstream: half of
// MaxLearnedModels (at least one), so that one tenant naming many models
// leaves the other half to the rest, as with every global bound; all of
// it for "" (no clients configured, or an operator).
func (r *Registry) share(client string) int {
	if client == "" {
		return r.s.MaxLearnedModels
	}
	return max(r.s.MaxLearnedModels/2, 1)
}

// find returns k's breaker without making one; nil if it has none.
func (r *Registry) find(k Key) *entry {
	set, ok := r.ups[k.Upstream]
	if !ok {
		return nil
	}
	if k.Model == "" {
		return set.own
	}
	set.mu.RLock()
	defer set.mu.RUnlock()
	return set.models[k.Model]
}

// Allow asks the breakers of upstream and model for permission to send a
// request. Under ScopeModel both the upstream-wide breaker and the
// model's must allow it (a request naming no model, model "", asks the
// upstream's only; a model past MaxLearnedModels, too, but only its
// connection failures count there); under ScopeUpstream model is ignored.
// A request naming no model should name its lane (see Lane) instead.
//
// If it is given, done must be called exactly once, when the request's
// outcome is known — for a stream, when the stream ends — with the result
// and, for a Failure, a short class ("transient", "rate_limited") kept as
// Status.LastFailureClass. Later calls are ignored.
//
// If a breaker rejects the request — open, forced open, or half-open with
// every probe slot taken — the error is an *OpenError (its Model says
// which breaker). An unknown upstream gives an error wrapping
// ErrUnknownUpstream.
func (r *Registry) Allow(upstream, model string) (done func(res Result, class string), err error) {
	return r.allowOn(upstream, model, "", false)
}

// AllowFor is Allow for a request of client ("": none configured): a model
// it is the first to name gets a breaker of its own within its share of
// MaxLearnedModels (half of it), so one client cannot take every slot.
func (r *Registry) AllowFor(client, upstream, model string) (done func(res Result, class string), err error) {
	return r.allowOn(upstream, model, client, false)
}

// AllowLane is Allow for a request that names no model, on the lane of its
// route family (see Lane): its failures open the lane, never the
// upstream's own breaker. Under ScopeUpstream it is Allow(upstream, "").
func (r *Registry) AllowLane(upstream, family string) (done func(res Result, class string), err error) {
	return r.allowOn(upstream, Lane(family), "", true)
}

func (r *Registry) allowOn(upstream, model, client string, lane bool) (done func(res Result, class string), err error) {
	set, err := r.upstream(upstream)
	if err != nil {
		return nil, err
	}
	own, err := r.allow(set.own)
	if err != nil {
		return nil, err
	}
	if r.s.Scope == ScopeUpstream || model == "" {
		return own.done, nil // done counts a ConnectionFailure as a Failure
	}
	e := r.model(set, model, client, lane)
	if e == nil {
		return func(res Result, class string) { own.done(ownResult(res), class) }, nil
	}
	m, err := r.allow(e)
	if err != nil {
		own.done(Excluded, "") // frees a half-open probe slot
		return nil, err
	}
	return func(res Result, class string) {
		m.done(modelResult(res), class)
		own.done(ownResult(res), class)
	}, nil
}

// ownResult is what the upstream-wide breaker counts of res when the
// model's breaker counts the rest.
func ownResult(res Result) Result {
	if res == Failure {
		return Success // the upstream answered; the model failed
	}
	return res // ConnectionFailure: done counts it as a Failure
}

// modelResult is what a model's breaker counts of res.
func modelResult(res Result) Result {
	if res == ConnectionFailure {
		return Excluded // the upstream's own breaker counts it
	}
	return res
}

// Names returns the upstream names, sorted.
func (r *Registry) Names() []string {
	return slices.Clone(r.names)
}

// entries returns every breaker, sorted by upstream, then model.
func (r *Registry) entries() []*entry {
	var out []*entry
	for _, name := range r.names {
		set := r.ups[name]
		out = append(out, set.own)
		set.mu.RLock()
		n := len(out)
		for _, e := range set.models {
			out = append(out, e)
		}
		set.mu.RUnlock()
		slices.SortFunc(out[n:], func(a, b *entry) int { return cmp.Compare(a.key.Model, b.key.Model) })
	}
	return out
}

// Keys returns the key of every breaker, sorted by upstream, then model.
func (r *Registry) Keys() []Key {
	es := r.entries()
	out := make([]Key, len(es))
	for i, e := range es {
		out[i] = e.key
	}
	return out
}

// Status returns k's breaker, or false if there is none (an unknown
// upstream, or a model no request or ForceOpen named yet).
func (r *Registry) Status(k Key) (Status, bool) {
	e := r.find(k)
	if e == nil {
		return Status{}, false
	}
	return r.status(e), true
}

// Snapshot returns every breaker, sorted by upstream, then model.
func (r *Registry) Snapshot() []Status {
	es := r.entries()
	out := make([]Status, 0, len(es))
	for _, e := range es {
		out = append(out, r.status(e))
	}
	return out
}

// UpstreamState is the worst state among the named upstream's breakers:
// open before half-open before closed.
func (r *Registry) UpstreamState(name string) State {
	set, ok := r.ups[name]
	if !ok {
		return Closed
	}
	worst := set.own.visibleState()
	set.mu.RLock()
	defer set.mu.RUnlock()
	for _, e := range set.models {
		if s := e.visibleState(); rank(s) > rank(worst) {
			worst = s
		}
	}
	return worst
}

func rank(s State) int {
	switch s {
	case Open:
		return 2
	case HalfOpen:
		return 1
	}
	return 0
}

// ForceOpen makes k's breaker reject every request until ForceClose: an
// operator draining a provider (k.Model "") or one model of it. A model
// not seen yet gets its breaker now, within MaxLearnedModels; past it the
// error says so. Requests already let through still report their outcome.
func (r *Registry) ForceOpen(k Key) error {
	set, err := r.upstream(k.Upstream)
	if err != nil {
		return err
	}
	e := set.own
	if k.Model != "" {
		if r.s.Scope == ScopeUpstream {
			return fmt.Errorf("breaker: upstream %q has one breaker for every model (scope upstream)", k.Upstream)
		}
		if e = r.model(set, k.Model, "", isLane(k.Model)); e == nil {
			return fmt.Errorf("breaker: upstream %q already keeps breakers for %d learned models, the most it keeps; model %q has no breaker of its own to force open (name it in the upstream's models, or force the upstream's own)", k.Upstream, r.s.MaxLearnedModels, k.Model)
		}
	}
	r.forceOpen(e)
	return nil
}

// ForceClose clears a forced open and resets k's breaker to a fresh closed
// state with zero counts, whatever its state. Outcomes of requests let
// through before it are ignored. A model with no breaker has nothing to
// close.
func (r *Registry) ForceClose(k Key) error {
	if _, err := r.upstream(k.Upstream); err != nil {
		return err
	}
	if e := r.find(k); e != nil {
		r.forceClose(e)
	}
	return nil
}
