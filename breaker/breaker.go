// Package breaker keeps one circuit breaker per upstream: a registry of
// gobreaker v2 TwoStepCircuitBreakers that the gateway asks for permission
// before a request (Allow) and tells the request's outcome once it is known
// (the done func Allow returns), plus snapshots for the admin API and an
// operator's forced open / forced close.
//
// It knows nothing of HTTP or of the other llmgate packages: the caller
// decides what a Success, a Failure or an Excluded request is.
package breaker

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
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
)

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
	// OnStateChange, if not nil, is called whenever the state an upstream
	// shows changes, forced changes included. It is called without any
	// lock of the registry held, so it may call back into the Registry;
	// calls for one upstream are made one at a time, in order.
	OnStateChange func(name string, from, to State)
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
	return s
}

// OpenError is returned by Allow when the breaker rejects a request.
type OpenError struct {
	Upstream string
	// RetryAfter is the time until the breaker lets a probe through,
	// rounded up to whole seconds and at least 1s. For a forced-open
	// breaker, which has no such time, it is Settings.OpenTimeout.
	RetryAfter time.Duration
	// Forced reports that an operator forced the breaker open.
	Forced bool
}

func (e *OpenError) Error() string {
	return "upstream " + e.Upstream + " is unavailable: circuit breaker open"
}

// ErrUnknownUpstream is wrapped by the error Allow, ForceOpen and ForceClose
// return for a name the Registry was not built with.
var ErrUnknownUpstream = errors.New("breaker: unknown upstream")

// Status is one breaker as the admin API shows it.
type Status struct {
	Name  string `json:"name"`
	State State  `json:"state"`
	// Forced reports that an operator forced the breaker open.
	Forced bool `json:"forced"`
	// Requests, TotalSuccesses and TotalFailures count the requests that
	// completed in the current interval, or since the last state change if
	// that is later. Requests is their sum: excluded requests and requests
	// in flight are not counted.
	Requests       uint32 `json:"requests"`
	TotalSuccesses uint32 `json:"total_successes"`
	TotalFailures  uint32 `json:"total_failures"`
	// ConsecutiveSuccesses and ConsecutiveFailures are the current runs
	// since the last state change; they are zero while open.
	ConsecutiveSuccesses uint32 `json:"consecutive_successes"`
	ConsecutiveFailures  uint32 `json:"consecutive_failures"`
	// LastFailureClass and LastFailureAt describe the latest Failure
	// reported. They survive ForceClose: they are history, not counts.
	LastFailureClass string     `json:"last_failure_class,omitempty"`
	LastFailureAt    *time.Time `json:"last_failure_at,omitempty"`
	// OpenedAt is when the breaker last opened (or was forced open); set
	// while open or half-open.
	OpenedAt *time.Time `json:"opened_at,omitempty"`
	// ProbeAt is when an open breaker will let a probe through; unset when
	// the breaker is not open or is forced open.
	ProbeAt *time.Time `json:"probe_at,omitempty"`
}

// Registry holds one breaker per upstream name. It is safe for concurrent
// use.
type Registry struct {
	s       Settings
	names   []string          // sorted
	entries map[string]*entry // never written after New, so read without a lock
}

// New returns a Registry with a closed breaker for each of names.
// Duplicate names share one breaker.
func New(names []string, s Settings) *Registry {
	r := &Registry{
		s:       s.withDefaults(),
		entries: make(map[string]*entry, len(names)),
	}
	for _, name := range names {
		if _, ok := r.entries[name]; ok {
			continue
		}
		e := &entry{name: name, state: Closed}
		e.win.start = time.Now()
		e.cur.Store(r.newInstance(e))
		r.entries[name] = e
		r.names = append(r.names, name)
	}
	slices.Sort(r.names)
	return r
}

// entry is one upstream's breaker and what the registry keeps beside it.
//
// Lock order: gobreaker's own mutex, then entry.mu. gobreaker calls its
// OnStateChange (entry.onChange) with its mutex held, so nothing may call
// into gobreaker while holding entry.mu.
type entry struct {
	name string
	// cur is the live breaker. ForceClose replaces it; a done func from an
	// older instance then updates only that discarded instance.
	cur        atomic.Pointer[instance]
	forcedFast atomic.Bool // mirrors forced, for the lock-free check in Allow
	// gen counts state changes (of cur, and ForceClose), as gobreaker's
	// generation does minus its interval resets: an outcome counts in win
	// only if no state change came between its Allow and its done.
	gen atomic.Uint64

	mu               sync.Mutex
	forced           bool      // forced open by an operator
	state            State     // the gobreaker state of cur, as its OnStateChange last reported
	openedAt         time.Time // when cur last opened, or when forced open
	lastFailureClass string
	lastFailureAt    time.Time
	win              window
	// pending holds OnStateChange calls not yet made. They are queued under
	// mu and made by whichever goroutine finds delivering false, outside
	// any lock (gobreaker's included), one at a time and in order.
	pending    []stateChange
	delivering bool
	npending   atomic.Int32 // len(pending), for a lock-free fast path
}

type stateChange struct{ from, to State }

// window counts the outcomes completed in one Interval.
//
// Why not gobreaker's own Interval: gobreaker ties an outcome to the
// generation its request started in and drops it if the closed state's
// counts were cleared meanwhile. A request that outlives Interval — a hung
// upstream at a 120s timeout, times the retries, against a 60s Interval —
// would then never count, and a hanging provider would never trip the
// breaker. So gobreaker's closed state never clears (Interval 0) and keeps
// the consecutive runs; this window, which counts an outcome when it
// completes, feeds FailureRatio and Status.
type window struct {
	start               time.Time
	successes, failures uint32
}

// roll starts a new window if the current one is over.
func (w *window) roll(now time.Time, interval time.Duration) {
	if elapsed := now.Sub(w.start); elapsed >= interval {
		w.start = w.start.Add(elapsed.Truncate(interval))
		w.successes, w.failures = 0, 0
	}
}

func (w *window) reset(now time.Time) { *w = window{start: now} }

type instance struct {
	cb *gobreaker.TwoStepCircuitBreaker[struct{}]
}

// Sentinel errors handed to gobreaker's done func. gobreaker counts a nil
// error as a success, anything else as a failure, unless IsExcluded says
// to ignore it; errExcluded is the only error it excludes.
var (
	errFailure  = errors.New("breaker: failure")
	errExcluded = errors.New("breaker: excluded")
)

func (r *Registry) newInstance(e *entry) *instance {
	inst := &instance{}
	inst.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        e.name,
		MaxRequests: r.s.HalfOpenRequests,
		Interval:    0, // never clear the closed state's counts; see window
		Timeout:     r.s.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool { return r.readyToTrip(e, c) },
		IsExcluded:  func(err error) bool { return err == errExcluded },
		OnStateChange: func(_ string, _, to gobreaker.State) {
			r.onChange(e, inst, to)
		},
	})
	return inst
}

// readyToTrip is gobreaker's ReadyToTrip, called with gobreaker's mutex held
// after each failure in the closed state.
func (r *Registry) readyToTrip(e *entry, c gobreaker.Counts) bool {
	if c.ConsecutiveFailures >= r.s.ConsecutiveFailures {
		return true
	}
	if r.s.FailureRatio <= 0 {
		return false
	}
	e.mu.Lock()
	e.win.roll(time.Now(), r.s.Interval)
	succ, fail := e.win.successes, e.win.failures
	e.mu.Unlock()
	n := succ + fail
	return n >= r.s.MinRequests && float64(fail)/float64(n) >= r.s.FailureRatio
}

func fromGobreaker(s gobreaker.State) State {
	switch s {
	case gobreaker.StateOpen:
		return Open
	case gobreaker.StateHalfOpen:
		return HalfOpen
	default:
		return Closed
	}
}

// visible is the state the outside world sees. e.mu must be held.
func (e *entry) visible() State {
	if e.forced {
		return Open
	}
	return e.state
}

// onChange is gobreaker's OnStateChange, called with gobreaker's mutex held.
// It records the change and queues the user's callback for later.
func (r *Registry) onChange(e *entry, inst *instance, to gobreaker.State) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cur.Load() != inst {
		return // a done func of an instance ForceClose replaced
	}
	now := time.Now()
	from := e.state
	e.state = fromGobreaker(to)
	e.gen.Add(1)
	e.win.reset(now)
	if e.forced {
		// Hidden behind the forced open; openedAt stays the time it was
		// forced, and ForceClose, the only way out, starts afresh.
		return
	}
	switch e.state {
	case Open:
		// gobreaker's own open timer started at its time.Now a moment
		// ago; this one is no earlier, so ProbeAt is never too soon.
		e.openedAt = now
	case Closed:
		e.openedAt = time.Time{}
	}
	// Not forced, so the state before this change was the visible one.
	r.queue(e, from, e.state)
}

// queue records a visible state change for OnStateChange. e.mu must be held.
func (r *Registry) queue(e *entry, from, to State) {
	if r.s.OnStateChange == nil || from == to {
		return
	}
	e.pending = append(e.pending, stateChange{from, to})
	e.npending.Add(1)
}

// deliver makes the queued OnStateChange calls, unless another goroutine is
// already making them (it will make ours too). It must be called with no
// lock held, after every call into gobreaker that may change its state.
func (r *Registry) deliver(e *entry) {
	if e.npending.Load() == 0 {
		return
	}
	e.mu.Lock()
	if e.delivering {
		e.mu.Unlock()
		return
	}
	e.delivering = true
	defer func() {
		// Also on a panicking callback, so later changes are still delivered.
		e.delivering = false
		e.mu.Unlock()
	}()
	for len(e.pending) > 0 {
		batch := e.pending
		e.pending = nil
		e.npending.Add(-int32(len(batch)))
		e.mu.Unlock()
		for _, c := range batch {
			r.s.OnStateChange(e.name, c.from, c.to)
		}
		e.mu.Lock()
	}
}

func (r *Registry) lookup(name string) (*entry, error) {
	e, ok := r.entries[name]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownUpstream, name)
	}
	return e, nil
}

// Allow asks the named upstream's breaker for permission to send a request.
//
// If it is given, done must be called exactly once, when the request's
// outcome is known — for a stream, when the stream ends — with the result
// and, for a Failure, a short class ("transient", "rate_limited") kept as
// Status.LastFailureClass. Later calls are ignored.
//
// If the breaker rejects the request — open, forced open, or half-open with
// every probe slot taken — the error is an *OpenError. An unknown name gives
// an error wrapping ErrUnknownUpstream.
func (r *Registry) Allow(name string) (done func(res Result, class string), err error) {
	e, err := r.lookup(name)
	if err != nil {
		return nil, err
	}
	if e.forcedFast.Load() {
		return nil, &OpenError{Upstream: name, RetryAfter: r.s.OpenTimeout, Forced: true}
	}
	inst := e.cur.Load()
	gdone, err := inst.cb.Allow() // may move open → half-open
	// Read after gobreaker's Allow, so that a change that came before it
	// does not make this request's outcome look stale.
	gen := e.gen.Load()
	r.deliver(e)
	if err != nil {
		// gobreaker.ErrOpenState or, half-open, gobreaker.ErrTooManyRequests.
		return nil, r.openError(e)
	}
	c := &call{r: r, e: e, inst: inst, gen: gen, gdone: gdone}
	return c.done, nil
}

type call struct {
	r      *Registry
	e      *entry
	inst   *instance
	gen    uint64
	gdone  func(error)
	called atomic.Bool
}

func (c *call) done(res Result, class string) {
	if c.called.Swap(true) {
		return
	}
	err := errFailure
	switch res {
	case Success:
		err = nil
	case Excluded:
		err = errExcluded
	}
	if err != errExcluded {
		// Recorded before gobreaker hears of it, so that ReadyToTrip sees
		// this outcome and an OnStateChange callback reporting the trip
		// can read the class from Status.
		e := c.e
		e.mu.Lock()
		if e.cur.Load() == c.inst {
			now := time.Now()
			if e.gen.Load() == c.gen {
				e.win.roll(now, c.r.s.Interval)
				if err == nil {
					e.win.successes++
				} else {
					e.win.failures++
				}
			}
			if err != nil {
				e.lastFailureClass = class
				e.lastFailureAt = now
			}
		}
		e.mu.Unlock()
	}
	c.gdone(err)
	c.r.deliver(c.e)
}

// openError builds the rejection for an open or half-open breaker.
func (r *Registry) openError(e *entry) *OpenError {
	e.mu.Lock()
	forced, state, openedAt := e.forced, e.state, e.openedAt
	e.mu.Unlock()
	if forced {
		return &OpenError{Upstream: e.name, RetryAfter: r.s.OpenTimeout, Forced: true}
	}
	var wait time.Duration
	if state == Open && !openedAt.IsZero() {
		wait = time.Until(openedAt.Add(r.s.OpenTimeout))
	}
	// Half-open with the probe slots taken has no known time; a second
	// is as good a guess as any and keeps Retry-After meaningful.
	return &OpenError{Upstream: e.name, RetryAfter: roundUpSecond(wait)}
}

func roundUpSecond(d time.Duration) time.Duration {
	if d <= time.Second {
		return time.Second
	}
	return (d + time.Second - 1).Truncate(time.Second)
}

// Names returns the upstream names, sorted.
func (r *Registry) Names() []string {
	return slices.Clone(r.names)
}

// Status returns the named upstream's breaker, or false for an unknown name.
func (r *Registry) Status(name string) (Status, bool) {
	e, ok := r.entries[name]
	if !ok {
		return Status{}, false
	}
	return r.status(e), true
}

// Snapshot returns every breaker, sorted by name.
func (r *Registry) Snapshot() []Status {
	out := make([]Status, 0, len(r.names))
	for _, name := range r.names {
		out = append(out, r.status(r.entries[name]))
	}
	return out
}

func (r *Registry) status(e *entry) Status {
	for {
		inst := e.cur.Load()
		inst.cb.State() // lets gobreaker move open → half-open if it is time
		c := inst.cb.Counts()
		r.deliver(e)

		e.mu.Lock()
		if e.cur.Load() != inst {
			e.mu.Unlock()
			continue // ForceClose ran meanwhile; c is of the old instance
		}
		e.win.roll(time.Now(), r.s.Interval)
		st := Status{
			Name:                 e.name,
			State:                e.visible(),
			Forced:               e.forced,
			Requests:             e.win.successes + e.win.failures,
			TotalSuccesses:       e.win.successes,
			TotalFailures:        e.win.failures,
			ConsecutiveSuccesses: c.ConsecutiveSuccesses,
			ConsecutiveFailures:  c.ConsecutiveFailures,
			LastFailureClass:     e.lastFailureClass,
			LastFailureAt:        timePtr(e.lastFailureAt),
		}
		if st.State != Closed {
			st.OpenedAt = timePtr(e.openedAt)
		}
		if st.State == Open && !st.Forced && !e.openedAt.IsZero() {
			st.ProbeAt = timePtr(e.openedAt.Add(r.s.OpenTimeout))
		}
		e.mu.Unlock()
		return st
	}
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// ForceOpen makes the named upstream's breaker reject every request until
// ForceClose: an operator draining a provider. Requests already let through
// still report their outcome.
func (r *Registry) ForceOpen(name string) error {
	e, err := r.lookup(name)
	if err != nil {
		return err
	}
	e.mu.Lock()
	if !e.forced {
		from := e.visible()
		e.forced = true
		e.forcedFast.Store(true)
		e.openedAt = time.Now()
		r.queue(e, from, Open)
	}
	e.mu.Unlock()
	r.deliver(e)
	return nil
}

// ForceClose clears a forced open and resets the named upstream's breaker to
// a fresh closed state with zero counts, whatever its state. Outcomes of
// requests let through before it are ignored.
func (r *Registry) ForceClose(name string) error {
	e, err := r.lookup(name)
	if err != nil {
		return err
	}
	// Built outside e.mu: nothing may call into gobreaker under it, and a
	// fresh breaker is closed without calling its OnStateChange.
	inst := r.newInstance(e)
	e.mu.Lock()
	from := e.visible()
	e.cur.Store(inst)
	e.gen.Add(1)
	e.win.reset(time.Now())
	e.forced = false
	e.forcedFast.Store(false)
	e.state = Closed
	e.openedAt = time.Time{}
	r.queue(e, from, Closed)
	e.mu.Unlock()
	r.deliver(e)
	return nil
}
