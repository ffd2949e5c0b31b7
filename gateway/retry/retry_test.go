package retry

import (
	"context"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmgate/llmgate/classify"
)

func fixed(r float64) func() float64 { return func() float64 { return r } }

const almostOne = 0.9999999999999999 // the largest float64 below 1

func TestBackoff(t *testing.T) {
	p := Policy{BaseDelay: time.Second, MaxDelay: 30 * time.Second}
	tests := []struct {
		name string
		p    Policy
		n    int
		r    float64
		want time.Duration
	}{
		{"rnd 0", p, 0, 0, 0},
		{"first retry half", p, 0, 0.5, 500 * time.Millisecond},
		{"fourth retry half", p, 3, 0.5, 4 * time.Second},
		{"capped at MaxDelay", p, 5, 0.5, 15 * time.Second},
		{"n=100 does not overflow", p, 100, 0.5, 15 * time.Second},
		{"n=MaxInt", p, math.MaxInt, 0.5, 15 * time.Second},
		{"negative n is the first retry", p, -3, 0.5, 500 * time.Millisecond},
		{"rnd 1 is the ceiling", p, 0, 1, time.Second},
		{"rnd NaN is 0", p, 0, math.NaN(), 0},
		{"rnd negative is 0", p, 0, -1, 0},
		{"base above max", Policy{BaseDelay: time.Minute, MaxDelay: time.Second}, 0, 0.5, 500 * time.Millisecond},
		{"zero policy: 1s base", Policy{}, 0, 0.5, 500 * time.Millisecond},
		{"zero policy: 30s cap", Policy{}, 50, 0.5, 15 * time.Second},
		{"huge max delay", Policy{BaseDelay: time.Second, MaxDelay: math.MaxInt64}, 100, almostOne, math.MaxInt64 - 1023}, // 2⁶³·(1-2⁻⁵³)
		{"huge max delay, rnd 1", Policy{BaseDelay: time.Second, MaxDelay: math.MaxInt64}, 100, 1, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Backoff(tt.n, fixed(tt.r)); got != tt.want {
				t.Errorf("Backoff(%d, %v) = %v, want %v", tt.n, tt.r, got, tt.want)
			}
		})
	}
}

// TestBackoffBounds checks full jitter's range for every retry index: the
// delay spans [0, min(MaxDelay, BaseDelay·2ⁿ)] and never leaves it.
func TestBackoffBounds(t *testing.T) {
	p := Policy{BaseDelay: 100 * time.Millisecond, MaxDelay: 10 * time.Second}
	for n := range 100 {
		ceil := p.MaxDelay
		if n < 7 {
			ceil = min(p.MaxDelay, p.BaseDelay<<n)
		}
		if got := p.Backoff(n, fixed(0)); got != 0 {
			t.Errorf("Backoff(%d, 0) = %v, want 0", n, got)
		}
		if got := p.Backoff(n, fixed(almostOne)); got > ceil || got < ceil-ceil/1000 {
			t.Errorf("Backoff(%d, 0.999…) = %v, want just under %v", n, got, ceil)
		}
		for range 50 {
			if got := p.Backoff(n, nil); got < 0 || got > ceil {
				t.Errorf("Backoff(%d, rand) = %v, out of [0, %v]", n, got, ceil)
			}
		}
	}
}

// outcomes returns an attempt func that returns os in turn (the last one
// from then on) and records when each attempt was made.
func outcomes(at *[]time.Time, os ...classify.Outcome) func(context.Context, int) classify.Outcome {
	return func(_ context.Context, n int) classify.Outcome {
		*at = append(*at, time.Now())
		return os[min(n, len(os))-1]
	}
}

var (
	success     = classify.Outcome{Class: classify.Success, Status: 200}
	unavailable = classify.Outcome{Class: classify.Transient, Reason: "status 503", Status: 503}
	internal    = classify.Outcome{Class: classify.ServerError, Reason: "status 500", Status: 500}
	refused     = classify.Outcome{Class: classify.Transient, Reason: "connection refused"}
	limited     = func(d time.Duration) classify.Outcome {
		return classify.Outcome{Class: classify.RateLimited, Reason: "status 429", Status: 429, RetryAfter: d, HasRetryAfter: true}
	}
)

func TestRunAttempts(t *testing.T) {
	tests := []struct {
		name     string
		policy   Policy
		outcomes []classify.Outcome
		attempts int
		stop     StopReason
		class    classify.Class
	}{
		{"success first", Policy{}, []classify.Outcome{success}, 1, StopDone, classify.Success},
		{"503 x3", Policy{}, []classify.Outcome{unavailable}, 3, StopAttempts, classify.Transient},
		{"503 then success", Policy{}, []classify.Outcome{unavailable, refused, success}, 3, StopDone, classify.Success},
		{"500: one retry only", Policy{MaxAttempts: 5}, []classify.Outcome{internal}, 2, StopAttempts, classify.ServerError},
		{"503 then 500 then 500", Policy{MaxAttempts: 5}, []classify.Outcome{unavailable, internal, internal}, 2, StopAttempts, classify.ServerError},
		{"max attempts 1", Policy{MaxAttempts: 1}, []classify.Outcome{unavailable}, 1, StopAttempts, classify.Transient},
		{"max attempts 6", Policy{MaxAttempts: 6}, []classify.Outcome{refused}, 6, StopAttempts, classify.Transient},
	}
	// Every class that is not retryable stops after one attempt.
	for _, c := range []classify.Class{classify.Quota, classify.ClientError, classify.Auth,
		classify.ContentFilter, classify.Empty, classify.Canceled} {
		tests = append(tests, struct {
			name     string
			policy   Policy
			outcomes []classify.Outcome
			attempts int
			stop     StopReason
			class    classify.Class
		}{"non-retryable " + string(c), Policy{}, []classify.Outcome{{Class: c}}, 1, StopDone, c})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var at []time.Time
				l := &Loop{Policy: tt.policy, Rand: fixed(0.5)}
				o, st := l.Run(context.Background(), time.Time{}, outcomes(&at, tt.outcomes...))
				if o.Class != tt.class || st.Attempts != tt.attempts || st.Stop != tt.stop || len(at) != tt.attempts {
					t.Errorf("Run = %s, %+v (%d calls); want %s after %d attempts, stop %q",
						o.Class, st, len(at), tt.class, tt.attempts, tt.stop)
				}
				if st.Retries != st.Attempts-1 {
					t.Errorf("Retries = %d after %d attempts", st.Retries, st.Attempts)
				}
			})
		})
	}
}

func TestRunBackoffWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var at []time.Time
		l := &Loop{Policy: Policy{MaxAttempts: 4, BaseDelay: time.Second}, Rand: fixed(0.5)}
		_, st := l.Run(context.Background(), time.Time{}, outcomes(&at, unavailable))
		// Full jitter at 0.5: half of 1s, 2s, 4s.
		want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}
		for i, w := range want {
			if got := at[i+1].Sub(at[i]); got != w {
				t.Errorf("wait before attempt %d = %v, want %v", i+2, got, w)
			}
		}
		if st.Waited != 3500*time.Millisecond {
			t.Errorf("Waited = %v, want 3.5s", st.Waited)
		}
	})
}

func TestRunHonoursRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var at []time.Time
		l := &Loop{Rand: fixed(0)} // backoff would not wait at all
		o, st := l.Run(context.Background(), time.Now().Add(time.Minute), outcomes(&at, limited(7*time.Second), success))
		if o.Class != classify.Success || st.Attempts != 2 || st.Stop != StopDone {
			t.Fatalf("Run = %+v, %+v", o, st)
		}
		if got := at[1].Sub(at[0]); got < 7*time.Second {
			t.Errorf("second attempt %v after the first, want >= 7s (Retry-After)", got)
		}
		if st.Waited != 7*time.Second {
			t.Errorf("Waited = %v, want 7s", st.Waited)
		}
	})
}

func TestRunRetryAfterBeyondDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var at []time.Time
		var b = NewBudget(BudgetOptions{MinPerSecond: 0.1, Window: 10 * time.Second})
		l := &Loop{Budget: b}
		o, st := l.Run(context.Background(), start.Add(5*time.Second), outcomes(&at, limited(10*time.Second)))
		if st.Stop != StopDeadline || st.Attempts != 1 || o.Class != classify.RateLimited {
			t.Errorf("Run = %+v, %+v; want stop deadline after 1 attempt", o, st)
		}
		if waited := time.Since(start); waited != 0 || st.Waited != 0 {
			t.Errorf("Run waited %v (Stats %v) before giving up; want no wait", waited, st.Waited)
		}
		// The retry that was not made did not use up the budget.
		if !b.TryRetry() {
			t.Error("the budget's one retry was spent on a retry never made")
		}
	})
}

func TestRunBackoffBeyondDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var at []time.Time
		l := &Loop{Policy: Policy{BaseDelay: 10 * time.Second}, Rand: fixed(0.5)} // 5s backoff
		_, st := l.Run(context.Background(), start.Add(time.Second), outcomes(&at, refused))
		if st.Stop != StopDeadline || st.Attempts != 1 || time.Since(start) != 0 {
			t.Errorf("Run = %+v after %v; want stop deadline after 1 attempt, at once", st, time.Since(start))
		}
	})
}

func TestRunContextDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var at []time.Time
		_, st := (&Loop{}).Run(ctx, time.Time{}, outcomes(&at, limited(10*time.Second)))
		if st.Stop != StopDeadline || st.Attempts != 1 {
			t.Errorf("Run = %+v; want stop deadline: ctx's deadline counts", st)
		}
	})
}

func TestRunNoDeadlineWaitsLong(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var at []time.Time
		_, st := (&Loop{}).Run(context.Background(), time.Time{}, outcomes(&at, limited(time.Hour), success))
		if st.Stop != StopDone || st.Attempts != 2 || st.Waited != time.Hour {
			t.Errorf("Run = %+v; want a 1h wait, then success", st)
		}
	})
}

// runInBackground starts Run and waits until it is blocked in its first
// wait (5s of backoff).
func runInBackground(t *testing.T, ctx context.Context, l *Loop) <-chan Stats {
	t.Helper()
	l.Rand = fixed(0.5)
	l.Policy.BaseDelay = 10 * time.Second
	done := make(chan Stats, 1)
	go func() {
		var at []time.Time
		_, st := l.Run(ctx, time.Time{}, outcomes(&at, unavailable))
		done <- st
	}()
	synctest.Wait()
	select {
	case st := <-done:
		t.Fatalf("Run returned before it was stopped: %+v", st)
	default:
	}
	return done
}

func TestRunCanceledDuringWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		done := runInBackground(t, ctx, &Loop{})
		cancel()
		st := <-done
		if st.Stop != StopCanceled || st.Attempts != 1 || st.Retries != 0 {
			t.Errorf("Run = %+v; want canceled after 1 attempt", st)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("Run returned %v after the cancel, want at once", d)
		}
	})
}

func TestRunShutdownDuringWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		shutdown := make(chan struct{})
		done := runInBackground(t, context.Background(), &Loop{Shutdown: shutdown})
		close(shutdown)
		st := <-done
		if st.Stop != StopCanceled || st.Attempts != 1 {
			t.Errorf("Run = %+v; want canceled after 1 attempt", st)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("Run returned %v after shutdown, want at once", d)
		}
	})
}

func TestRunCanceledBeforeWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		b := NewBudget(BudgetOptions{MinPerSecond: 0.1, Window: 10 * time.Second})
		_, st := (&Loop{Budget: b}).Run(ctx, time.Time{}, func(context.Context, int) classify.Outcome {
			cancel() // the client leaves during the attempt, which ends transient
			return refused
		})
		if st.Stop != StopCanceled || st.Attempts != 1 || !b.TryRetry() {
			t.Errorf("Run = %+v; want canceled after 1 attempt, budget untouched", st)
		}
	})
}

func TestRunOnRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type call struct {
			n    int
			o    classify.Outcome
			wait time.Duration
		}
		var calls []call
		l := &Loop{
			Policy:  Policy{MaxAttempts: 3, BaseDelay: time.Second},
			Rand:    fixed(0.5),
			OnRetry: func(n int, o classify.Outcome, wait time.Duration) { calls = append(calls, call{n, o, wait}) },
		}
		var at []time.Time
		l.Run(context.Background(), time.Time{}, outcomes(&at, refused, limited(3*time.Second), success))
		want := []call{{2, refused, 500 * time.Millisecond}, {3, limited(3 * time.Second), 3 * time.Second}}
		if len(calls) != len(want) {
			t.Fatalf("OnRetry calls = %+v, want %+v", calls, want)
		}
		for i := range want {
			if calls[i] != want[i] {
				t.Errorf("OnRetry call %d = %+v, want %+v", i, calls[i], want[i])
			}
		}
	})
}

func TestRunBudgetDenies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// One retry per 10s window, no ratio to speak of (no requests).
		b := NewBudget(BudgetOptions{Ratio: 0, MinPerSecond: 0.1, Window: 10 * time.Second})
		l := &Loop{Policy: Policy{MaxAttempts: 5}, Budget: b, Rand: fixed(0)}
		var at []time.Time
		_, st := l.Run(context.Background(), time.Time{}, outcomes(&at, unavailable))
		if st.Stop != StopBudget || st.Attempts != 2 || st.Retries != 1 {
			t.Errorf("Run = %+v; want the second retry denied by the budget", st)
		}
	})
}

// takeover is a Loop.Abandon whose channel is made when first asked for,
// as a keyed call's lease makes it.
type takeover struct {
	ch    chan struct{}
	asked int
}

func (k *takeover) Taken() <-chan struct{} {
	k.asked++
	if k.ch == nil {
		k.ch = make(chan struct{})
	}
	return k.ch
}

// A call whose answer can no longer be used (its key taken over) makes no
// further attempt: not after an attempt that failed once it was taken, and
// not after a wait it was taken during, which it ends there.
func TestRunAbandoned(t *testing.T) {
	t.Run("before the wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var at []time.Time
			k := &takeover{ch: make(chan struct{})}
			close(k.ch)
			l := &Loop{Policy: Policy{MaxAttempts: 4, BaseDelay: time.Second}, Rand: fixed(0.5), Abandon: k}
			_, st := l.Run(context.Background(), time.Time{}, outcomes(&at, unavailable))
			if st.Attempts != 1 || st.Stop != StopAbandoned || st.Waited != 0 {
				t.Fatalf("Run = %+v, want 1 attempt, no wait, stopped abandoned", st)
			}
		})
	})
	t.Run("during the wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var at []time.Time
			k := &takeover{ch: make(chan struct{})} // made before the goroutine closes it
			l := &Loop{Rand: fixed(0), Abandon: k}
			start := time.Now()
			go func() {
				time.Sleep(3 * time.Second)
				close(k.ch)
			}()
			_, st := l.Run(context.Background(), time.Now().Add(time.Minute), outcomes(&at, limited(7*time.Second), success))
			if st.Attempts != 1 || st.Stop != StopAbandoned {
				t.Fatalf("Run = %+v, want 1 attempt, stopped abandoned", st)
			}
			if took := time.Since(start); took != 3*time.Second {
				t.Fatalf("Run returned after %v, want 3s: when the key was taken, not at the Retry-After's end", took)
			}
		})
	})
	t.Run("never taken", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var at []time.Time
			k := &takeover{}
			l := &Loop{Rand: fixed(0), Abandon: k}
			o, st := l.Run(context.Background(), time.Now().Add(time.Minute), outcomes(&at, unavailable, success))
			if o.Class != classify.Success || st.Attempts != 2 || st.Stop != StopDone || k.asked != 1 {
				t.Fatalf("Run = %+v, %+v, asked %d times; want the retry made, Abandon asked once", o, st, k.asked)
			}
		})
	})
}
