// Package retry is the one retry loop of the gateway: it makes attempts
// against one upstream until classify says an outcome is not worth another,
// the attempts or the process-wide retry Budget run out, or the request's
// deadline would pass; between attempts it waits what the upstream asked
// (Retry-After) or a full-jitter backoff, on timers that give way to the
// request's context and to shutdown.
//
// Nothing else in the process retries — not the HTTP transport, not a
// client library — so that one request never turns into attempts×attempts
// upstream calls, and the circuit breaker around the loop learns once per
// request.
package retry

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/llmgate/llmgate/classify"
)

// Policy bounds the attempts against one upstream. The zero value works.
type Policy struct {
	// MaxAttempts counts every attempt, the first included. If <= 0, 3 is
	// used.
	MaxAttempts int
	// BaseDelay is the backoff ceiling before the first retry; it doubles
	// for each retry after that. If <= 0, 1s is used.
	BaseDelay time.Duration
	// MaxDelay caps the backoff ceiling. If <= 0, 30s is used.
	MaxDelay time.Duration
}

func (p Policy) maxAttempts() int {
	if p.MaxAttempts <= 0 {
		return 3
	}
	return p.MaxAttempts
}

func (p Policy) baseDelay() time.Duration {
	if p.BaseDelay <= 0 {
		return time.Second
	}
	return p.BaseDelay
}

func (p Policy) maxDelay() time.Duration {
	if p.MaxDelay <= 0 {
		return 30 * time.Second
	}
	return p.MaxDelay
}

// Backoff returns the full-jitter delay before retry n (n = 0 for the first
// retry): uniform in [0, min(MaxDelay, BaseDelay·2ⁿ)]. Full jitter rather
// than a fixed or "equal" jitter because it spreads a herd of clients that
// failed together the most (AWS Architecture Blog, "Exponential Backoff
// and Jitter"). rnd returns a float64 in [0,1); if nil, math/rand/v2's
// Float64 is used. A negative n counts as 0; a huge n does not overflow.
func (p Policy) Backoff(n int, rnd func() float64) time.Duration {
	base, maxd := p.baseDelay(), p.maxDelay()
	ceil := maxd
	n = max(n, 0)
	// base<<n <= maxd, tested without computing base<<n, which could
	// overflow.
	if base <= maxd && n < 63 && base <= maxd>>n {
		ceil = base << n
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	r := rnd()
	if !(r > 0) { // 0, negative, NaN
		return 0
	}
	f := r * float64(ceil)
	if r >= 1 || f >= float64(ceil) {
		return ceil
	}
	return time.Duration(f)
}

// StopReason says why Run stopped.
type StopReason string

// The reasons Run stops.
const (
	// StopDone: the outcome was not retryable (a success included).
	StopDone StopReason = "done"
	// StopAttempts: Policy.MaxAttempts, or the outcome class's own cap
	// (classify.Class.MaxAttempts), was reached.
	StopAttempts StopReason = "attempts"
	// StopBudget: the retry Budget denied the next retry.
	StopBudget StopReason = "budget"
	// StopDeadline: the next wait (a backoff or the upstream's Retry-After)
	// would end after the deadline. Run does not sleep first.
	StopDeadline StopReason = "deadline"
	// StopCanceled: the context was done, or shutdown began, during a wait.
	StopCanceled StopReason = "canceled"
	// StopAbandoned: Abandon said no answer can be used any more (a keyed
	// call's key was taken over), before or during a wait.
	StopAbandoned StopReason = "abandoned"
)

// Stats is what one Run did.
type Stats struct {
	Attempts int
	Retries  int
	Stop     StopReason
	// Waited is the time spent waiting between attempts.
	Waited time.Duration
}

// Loop runs attempts with retries. The zero value works; a Loop may be
// shared by concurrent Runs as long as its fields are not changed.
type Loop struct {
	Policy Policy
	// Budget limits retries process-wide. If nil, retries are limited only
	// by Policy. Run does not call Budget.Request: the caller records each
	// client request once, however many upstreams (and Runs) it takes.
	Budget *Budget
	// Client is whose retries these are, for its share of Budget ("":
	// none).
	Client string
	// Rand returns a float64 in [0,1) for the backoff jitter. If nil,
	// math/rand/v2's Float64 is used.
	Rand func() float64
	// Shutdown, when closed, ends any wait (StopCanceled). May be nil.
	Shutdown <-chan struct{}
	// OnRetry, if not nil, is called before each wait: n is the attempt
	// that will follow (2 for the first retry), o the outcome that is
	// being retried, wait the time Run will wait first.
	OnRetry func(n int, o classify.Outcome, wait time.Duration)
	// Abandon, if not nil, is asked only when a retry is due: its channel
	// is closed once the caller can no longer use any answer (a keyed
	// call whose key another owner has taken over, which no answer of this
	// call can be committed under). Then no retry is made: Run stops
	// before the wait, or ends it (StopAbandoned).
	Abandon Abandoner
}

// Abandoner is Loop.Abandon. Taken is called only when a retry is due, so
// the channel may be made then.
type Abandoner interface {
	Taken() <-chan struct{}
}

// Run calls attempt (n = 1, 2, ...) until it returns an outcome that is not
// Retryable, the attempts are used up (Policy.MaxAttempts, or the class's
// own MaxAttempts), the Budget denies a retry, or the next wait would pass
// the deadline. The deadline is the earlier of deadline (zero: none) and
// ctx's own.
//
// Between attempts Run waits the outcome's RetryAfter when it has one,
// else Backoff(retry index). A wait that would end after the deadline is
// not started: Run stops at once with StopDeadline, so that the caller can
// answer (or try the next upstream) while there is still time. A retry is
// taken from the Budget only once it is sure to be waited for and made.
//
// Run returns the last outcome and what it did.
func (l *Loop) Run(ctx context.Context, deadline time.Time, attempt func(ctx context.Context, n int) classify.Outcome) (classify.Outcome, Stats) {
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	maxAttempts := l.Policy.maxAttempts()
	var st Stats
	for n := 1; ; n++ {
		o := attempt(ctx, n)
		st.Attempts = n
		switch {
		case !o.Class.Retryable():
			st.Stop = StopDone
			return o, st
		case n >= maxAttempts, o.Class.MaxAttempts() > 0 && n >= o.Class.MaxAttempts():
			st.Stop = StopAttempts
			return o, st
		}
		wait := o.RetryAfter
		if !o.HasRetryAfter {
			wait = l.Policy.Backoff(st.Retries, l.Rand)
		}
		start := time.Now()
		if !deadline.IsZero() && start.Add(wait).After(deadline) {
			st.Stop = StopDeadline
			return o, st
		}
		if ctx.Err() != nil {
			st.Stop = StopCanceled
			return o, st
		}
		var abandon <-chan struct{}
		if l.Abandon != nil {
			if abandon = l.Abandon.Taken(); closed(abandon) {
				st.Stop = StopAbandoned
				return o, st
			}
		}
		if l.Budget != nil && !l.Budget.TryRetryFor(l.Client) {
			st.Stop = StopBudget
			return o, st
		}
		if l.OnRetry != nil {
			l.OnRetry(n+1, o, wait)
		}
		stop := l.sleep(ctx, wait, abandon)
		st.Waited += time.Since(start)
		if stop == "" && closed(abandon) {
			stop = StopAbandoned // taken over as the wait ended
		}
		if stop != "" {
			st.Stop = stop
			return o, st
		}
		st.Retries++
	}
}

// sleep waits d, or until ctx is done or shutdown begins (StopCanceled),
// or abandon is closed (StopAbandoned); "" when the whole wait passed.
func (l *Loop) sleep(ctx context.Context, d time.Duration, abandon <-chan struct{}) StopReason {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return ""
	case <-ctx.Done():
		return StopCanceled
	case <-l.Shutdown:
		return StopCanceled
	case <-abandon:
		return StopAbandoned
	}
}

// Abandoned reports whether a (nil: never) says no answer can be used any
// more (its channel is closed), without waiting.
func Abandoned(a Abandoner) bool { return a != nil && closed(a.Taken()) }

// closed reports whether ch (nil: never) is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
