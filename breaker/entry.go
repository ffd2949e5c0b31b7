package breaker

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// entry is one breaker and what the registry keeps beside it.
//
// Lock order: gobreaker's own mutex, then entry.mu. gobreaker calls its
// OnStateChange (entry.onChange) with its mutex held, so nothing may call
// into gobreaker while holding entry.mu.
type entry struct {
	key    Key
	covers string // Status.Covers
	// cur is the live breaker. ForceClose replaces it; a done func from an
	// older instance then updates only that discarded instance.
	cur        atomic.Pointer[instance]
	forcedFast atomic.Bool // mirrors forced, for the lock-free check in Allow
	halfOpen   atomic.Bool // mirrors state == HalfOpen, to mark probes in Allow
	// gen counts state changes (of cur, and ForceClose), as gobreaker's
	// generation does minus its interval resets: an outcome counts in win
	// only if no state change came between its Allow and its done.
	gen atomic.Uint64

	mu               sync.Mutex
	forced           bool      // forced open by an operator
	state            State     // the gobreaker state of cur, as its OnStateChange last reported
	since            time.Time // when the visible state began
	openedAt         time.Time // when cur last opened, or when forced open
	lastFailureClass string
	lastFailureAt    time.Time
	rejected         uint32 // since the visible state began
	trip             Trip   // what last opened it; Reason "" before the first opening
	tripping         Trip   // what ReadyToTrip saw, for the onChange that follows
	lastProbe        Probe  // Result "" before the first probe
	probeTimer       *time.Timer
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

func (r *Registry) newEntry(k Key, covers string) *entry {
	now := time.Now()
	e := &entry{key: k, covers: covers, state: Closed, since: now}
	e.win.start = now
	e.cur.Store(r.newInstance(e))
	return e
}

func (r *Registry) newInstance(e *entry) *instance {
	inst := &instance{}
	inst.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        e.key.Upstream + "/" + e.key.Model,
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
// after each failure in the closed state. What it trips on is kept for the
// onChange that follows at once.
func (r *Registry) readyToTrip(e *entry, c gobreaker.Counts) bool {
	if c.ConsecutiveFailures >= r.s.ConsecutiveFailures {
		e.mu.Lock()
		e.tripping = Trip{Reason: "consecutive_failures", Failures: c.ConsecutiveFailures}
		e.mu.Unlock()
		return true
	}
	if r.s.FailureRatio <= 0 {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.win.roll(time.Now(), r.s.Interval)
	succ, fail := e.win.successes, e.win.failures
	n := succ + fail
	if n >= r.s.MinRequests && float64(fail)/float64(n) >= r.s.FailureRatio {
		e.tripping = Trip{Reason: "failure_ratio", Failures: fail, Requests: n}
		return true
	}
	return false
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

func (e *entry) visibleState() State {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.visible()
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
	e.halfOpen.Store(e.state == HalfOpen)
	e.gen.Add(1)
	e.win.reset(now)
	e.stopProbeTimer()
	if e.state == Open {
		// gobreaker lets the probe through at its own time.Now a moment ago
		// plus OpenTimeout; this timer, no earlier, moves it to half-open
		// then, whether or not anyone asks (gobreaker would wait for the
		// next Allow or State).
		e.probeTimer = time.AfterFunc(r.s.OpenTimeout, func() { r.probeDue(e, inst) })
		if !e.forced { // a forced open keeps its own Trip
			e.trip = e.tripping
			if from == HalfOpen {
				e.trip = Trip{Reason: "probe_failed", Failures: 1}
			}
			e.trip.Class, e.trip.At = e.lastFailureClass, now
		}
		e.tripping = Trip{}
	}
	if e.forced {
		// Hidden behind the forced open; openedAt stays the time it was
		// forced, and ForceClose, the only way out, starts afresh.
		return
	}
	switch e.state {
	case Open:
		e.openedAt = now
	case Closed:
		e.openedAt = time.Time{}
	}
	// Not forced, so the state before this change was the visible one.
	r.changed(e, from, e.state, now)
}

// probeDue runs when inst's open timeout is over: it moves it to
// half-open. gobreaker moves only once its expiry is before now, and the
// timer may fire on that very instant (a fake clock), so it tries again a
// millisecond later while inst is still open.
func (r *Registry) probeDue(e *entry, inst *instance) {
	if e.cur.Load() != inst {
		return
	}
	inst.cb.State() // open → half-open, through onChange
	r.deliver(e)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cur.Load() == inst && e.state == Open && e.probeTimer != nil {
		e.probeTimer = time.AfterFunc(time.Millisecond, func() { r.probeDue(e, inst) })
	}
}

// stopProbeTimer stops the open timeout's timer. e.mu must be held.
func (e *entry) stopProbeTimer() {
	if e.probeTimer != nil {
		e.probeTimer.Stop()
		e.probeTimer = nil
	}
}

// changed records a visible state change: its time, fresh rejection
// counts, and the OnStateChange call. e.mu must be held.
func (r *Registry) changed(e *entry, from, to State, now time.Time) {
	if from == to {
		return
	}
	e.since, e.rejected = now, 0
	if r.s.OnStateChange == nil {
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
	locked := true
	defer func() {
		// Also on a panicking callback, so later changes are still
		// delivered; it panics with e.mu not held, which a fatal "unlock
		// of unlocked mutex" would make the whole process's end.
		if !locked {
			e.mu.Lock()
		}
		e.delivering = false
		e.mu.Unlock()
	}()
	for len(e.pending) > 0 {
		batch := e.pending
		e.pending = nil
		e.npending.Add(-int32(len(batch)))
		e.mu.Unlock()
		locked = false
		for _, c := range batch {
			r.s.OnStateChange(e.key, c.from, c.to)
		}
		e.mu.Lock()
		locked = true
	}
}

// allow asks e for permission: a call to finish, or an *OpenError.
func (r *Registry) allow(e *entry) (*call, error) {
	if e.forcedFast.Load() {
		return nil, r.openError(e)
	}
	inst := e.cur.Load()
	gdone, err := inst.cb.Allow() // may move open → half-open
	// Read after gobreaker's Allow, so that a change that came before it
	// does not make this request's outcome look stale.
	gen := e.gen.Load()
	probe := e.halfOpen.Load()
	r.deliver(e)
	if err != nil {
		// gobreaker.ErrOpenState or, half-open, gobreaker.ErrTooManyRequests.
		return nil, r.openError(e)
	}
	return &call{r: r, e: e, inst: inst, gen: gen, probe: probe, gdone: gdone}, nil
}

type call struct {
	r      *Registry
	e      *entry
	inst   *instance
	gen    uint64
	probe  bool // let through half-open
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
		c.record(err == nil, class)
	}
	c.gdone(err)
	c.r.deliver(c.e)
}

// record counts a success or a failure in the window and keeps a
// failure's class, and a probe's outcome.
func (c *call) record(ok bool, class string) {
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cur.Load() != c.inst {
		return
	}
	now := time.Now()
	current := e.gen.Load() == c.gen
	if current {
		e.win.roll(now, c.r.s.Interval)
		if ok {
			e.win.successes++
		} else {
			e.win.failures++
		}
		if c.probe {
			e.lastProbe = Probe{At: now, Result: "success"}
			if !ok {
				e.lastProbe = Probe{At: now, Result: "failure", Class: class}
			}
		}
	}
	if !ok {
		e.lastFailureClass = class
		e.lastFailureAt = now
	}
}

// openError builds the rejection of an open, forced open or half-open
// breaker, and counts it.
func (r *Registry) openError(e *entry) *OpenError {
	e.mu.Lock()
	forced, state, openedAt := e.forced, e.state, e.openedAt
	e.rejected++
	e.mu.Unlock()
	oe := &OpenError{Upstream: e.key.Upstream, Model: e.key.Model}
	if forced {
		oe.RetryAfter, oe.Forced = r.s.OpenTimeout, true
		return oe
	}
	var wait time.Duration
	if state == Open && !openedAt.IsZero() {
		wait = time.Until(openedAt.Add(r.s.OpenTimeout))
	}
	// Half-open with the probe slots taken has no known time; a second
	// is as good a guess as any and keeps Retry-After meaningful.
	oe.RetryAfter = roundUpSecond(wait)
	return oe
}

func roundUpSecond(d time.Duration) time.Duration {
	if d <= time.Second {
		return time.Second
	}
	return (d + time.Second - 1).Truncate(time.Second)
}

func (r *Registry) status(e *entry) Status {
	for {
		inst := e.cur.Load()
		// Lets gobreaker move open → half-open if it is time: the timer
		// does too, and this keeps a look on the very instant exact.
		inst.cb.State()
		c := inst.cb.Counts()
		r.deliver(e)

		e.mu.Lock()
		if e.cur.Load() != inst {
			e.mu.Unlock()
			continue // ForceClose ran meanwhile; c is of the old instance
		}
		st := r.statusLocked(e, c)
		e.mu.Unlock()
		return st
	}
}

// statusLocked is e's Status with c its gobreaker counts. e.mu must be held.
func (r *Registry) statusLocked(e *entry, c gobreaker.Counts) Status {
	e.win.roll(time.Now(), r.s.Interval)
	st := Status{
		Name:                 e.key.Upstream,
		Model:                e.key.Model,
		Covers:               e.covers,
		State:                e.visible(),
		Forced:               e.forced,
		StateSince:           e.since,
		CountsSince:          e.win.start,
		Requests:             e.win.successes + e.win.failures,
		TotalSuccesses:       e.win.successes,
		TotalFailures:        e.win.failures,
		Rejected:             e.rejected,
		ConsecutiveSuccesses: c.ConsecutiveSuccesses,
		ConsecutiveFailures:  c.ConsecutiveFailures,
		LastFailureClass:     e.lastFailureClass,
		LastFailureAt:        timePtr(e.lastFailureAt),
	}
	if e.trip.Reason != "" {
		t := e.trip
		st.OpenedBy = &t
	}
	if e.lastProbe.Result != "" {
		p := e.lastProbe
		st.LastProbe = &p
	}
	if st.State != Closed {
		st.OpenedAt = timePtr(e.openedAt)
	}
	if st.State == Open && !st.Forced && !e.openedAt.IsZero() {
		st.ProbeAt = timePtr(e.openedAt.Add(r.s.OpenTimeout))
	}
	return st
}

// forceOpen makes e reject every request until forceClose.
func (r *Registry) forceOpen(e *entry) {
	e.mu.Lock()
	if !e.forced {
		from := e.visible()
		now := time.Now()
		e.forced = true
		e.forcedFast.Store(true)
		e.openedAt = now
		e.trip = Trip{Reason: "forced", At: now}
		r.changed(e, from, Open, now)
	}
	e.mu.Unlock()
	r.deliver(e)
}

// forceClose clears a forced open and resets e to a fresh closed state.
func (r *Registry) forceClose(e *entry) {
	// Built outside e.mu: nothing may call into gobreaker under it, and a
	// fresh breaker is closed without calling its OnStateChange.
	inst := r.newInstance(e)
	e.mu.Lock()
	from := e.visible()
	now := time.Now()
	e.cur.Store(inst)
	e.gen.Add(1)
	e.win.reset(now)
	e.stopProbeTimer()
	e.forced = false
	e.forcedFast.Store(false)
	e.halfOpen.Store(false)
	e.state = Closed
	e.openedAt = time.Time{}
	r.changed(e, from, Closed, now)
	e.mu.Unlock()
	r.deliver(e)
}
