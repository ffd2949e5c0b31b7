// Package breaker keeps the gateway's circuit breakers: a registry of
// gobreaker v2 TwoStepCircuitBreakers that the gateway asks for permission
// before a request (Allow) and tells the request's outcome once it is known
// (the done func Allow returns), plus snapshots for the admin API and an
// operator's forced open / forced close.
//
// By default (ScopeModel) each upstream has a breaker per model, so one
// failing model does not refuse its neighbours, and one upstream-wide
// breaker that counts the failures no model can be blamed for: the
// connection-level ones (ConnectionFailure: refused, DNS, TLS, no
// response), which it counts against every model of the upstream. With
// ScopeUpstream there is one breaker per upstream, counting every failure.
//
// It knows nothing of HTTP or of the other llmgate packages: the caller
// decides what a Success, a Failure or an Excluded request is.
package breaker

import (
	"errors"
	"time"
)

// State is a breaker's state as the admin API and OnStateChange show it.
type State string

// The states of a breaker.
const (
	Closed   State = "closed"
	Open     State = "open"
	HalfOpen State = "half-open"
)

// Result is what a request, retries included, came to, as the breaker
// counts it.
type Result int

const (
	// Success: the provider answered — a success, a permanent error, a
	// filtered or empty completion. The provider is up.
	Success Result = iota
	// Failure: the request ended transient after its retries.
	Failure
	// Excluded: the client cancelled. Counted neither as a success nor as a
	// failure, and it resets neither consecutive count.
	Excluded
	// ConnectionFailure: a Failure in which the upstream never answered at
	// the HTTP level (connection refused, DNS, TLS, the connection closed
	// before a response). Under ScopeModel it counts against the
	// upstream-wide breaker, which refuses every model when it opens, and
	// not against the model's own; under ScopeUpstream it is a Failure.
	ConnectionFailure
)

// Scope says what one breaker covers.
type Scope string

// The scopes.
const (
	// ScopeModel: a breaker per upstream and model, plus the upstream-wide
	// one for connection-level failures. The default.
	ScopeModel Scope = "model"
	// ScopeUpstream: one breaker per upstream, for every model.
	ScopeUpstream Scope = "upstream"
)

// Lane is the model of the breaker that requests naming no model count on,
// per route family ("files", "vector_stores"): "(files)". A family's
// failures open its lane only, never the upstream's own breaker, which
// would refuse every model. Callers pass a fixed set of families, so lanes
// are not bounded by MaxLearnedModels.
func Lane(family string) string { return "(" + family + ")" }

// LaneFamily is the route family of a lane's model ("files" of
// "(files)"), and whether model names a lane at all (see Lane).
func LaneFamily(model string) (family string, ok bool) {
	if len(model) > 2 && model[0] == '(' && model[len(model)-1] == ')' {
		return model[1 : len(model)-1], true
	}
	return "", false
}

// isLane reports whether model names a lane (see Lane).
func isLane(model string) bool {
	_, ok := LaneFamily(model)
	return ok
}

// DefaultMaxLearnedModels is Settings.MaxLearnedModels when it is 0.
const DefaultMaxLearnedModels = 64

// Settings configures every breaker of a Registry. The zero value works.
type Settings struct {
	// ConsecutiveFailures trips a closed breaker after this many consecutive
	// failures. A success resets the run; time does not. If 0, 5 is used.
	ConsecutiveFailures uint32
	// FailureRatio, if > 0, also trips a closed breaker when
	// failures/(successes+failures) in the current interval reaches it,
	// once at least MinRequests requests have completed in that interval.
	// Excluded requests and requests still in flight are not counted.
	FailureRatio float64
	// MinRequests is the minimum number of completed requests in the
	// interval before FailureRatio applies. If 0, 20 is used.
	MinRequests uint32
	// Interval is the cyclic period after which the counts FailureRatio
	// and Status use are cleared. A request counts in the interval it
	// completes in, however long ago it started. If <= 0, 60s is used.
	Interval time.Duration
	// OpenTimeout is how long a breaker stays open before it lets a
	// half-open probe through. If <= 0, 30s is used.
	OpenTimeout time.Duration
	// HalfOpenRequests is how many probes a half-open breaker lets through;
	// it closes once that many have succeeded. If 0, 1 is used.
	HalfOpenRequests uint32
	// Scope: ScopeModel or ScopeUpstream. If "", ScopeModel.
	Scope Scope
	// MaxLearnedModels bounds, per upstream, the models that get a breaker
	// of their own besides the ones Upstream.Models names. A model first
	// seen (Allow) when as many have been learned gets no breaker of its
	// own: only the upstream-wide one guards it (connection failures), so
	// no two untracked models share a fate, and a tenant naming many
	// models cannot make one breaker refuse them all. One client may learn
	// half of them (AllowFor). Learned breakers live as long as the
	// Registry. If 0, DefaultMaxLearnedModels is used.
	MaxLearnedModels int
	// OnUntracked, if not nil, is called the first time per upstream a
	// model gets no breaker because MaxLearnedModels were learned, with
	// that model's key (for a warning log). Called without a lock held.
	OnUntracked func(k Key)
	// OnStateChange, if not nil, is called whenever the state a breaker
	// shows changes, forced changes and a timed open → half-open included.
	// It is called without any lock of the registry held, so it may call
	// back into the Registry; calls for one breaker are made one at a
	// time, in order.
	OnStateChange func(k Key, from, to State)
}

func (s Settings) withDefaults() Settings {
	if s.ConsecutiveFailures == 0 {
		s.ConsecutiveFailures = 5
	}
	if s.MinRequests == 0 {
		s.MinRequests = 20
	}
	if s.Interval <= 0 {
		s.Interval = 60 * time.Second
	}
	if s.OpenTimeout <= 0 {
		s.OpenTimeout = 30 * time.Second
	}
	if s.HalfOpenRequests == 0 {
		s.HalfOpenRequests = 1
	}
	if s.Scope == "" {
		s.Scope = ScopeModel
	}
	if s.MaxLearnedModels <= 0 {
		s.MaxLearnedModels = DefaultMaxLearnedModels
	}
	return s
}

// OpenError is returned by Allow when a breaker rejects a request.
type OpenError struct {
	Upstream string
	// Model is the model whose breaker is open; "" when it is the
	// upstream's (every model of it is refused).
	Model string
	// RetryAfter is the time until the breaker lets a probe through,
	// rounded up to whole seconds and at least 1s. For a forced-open
	// breaker, which has no such time, it is Settings.OpenTimeout.
	RetryAfter time.Duration
	// Forced reports that an operator forced the breaker open.
	Forced bool
}

func (e *OpenError) Error() string {
	if e.Model != "" {
		return "model " + e.Model + " of upstream " + e.Upstream + " is unavailable: circuit breaker open"
	}
	return "upstream " + e.Upstream + " is unavailable: circuit breaker open"
}

// ErrUnknownUpstream is wrapped by the error Allow, ForceOpen and ForceClose
// return for a name the Registry was not built with.
var ErrUnknownUpstream = errors.New("breaker: unknown upstream")
