package breaker

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// ups is upstreams named names, with no models configured.
func ups(names ...string) []Upstream {
	out := make([]Upstream, len(names))
	for i, n := range names {
		out[i] = Upstream{Name: n}
	}
	return out
}

// report lets one request through name and reports res. It fails the test
// if the breaker rejects the request.
func report(t *testing.T, r *Registry, name string, res Result, class string) {
	t.Helper()
	done, err := r.Allow(name, "")
	if err != nil {
		t.Fatalf("Allow(%q): %v", name, err)
	}
	done(res, class)
}

func reportN(t *testing.T, r *Registry, name string, n int, res Result) {
	t.Helper()
	for range n {
		report(t, r, name, res, "transient")
	}
}

// rejected asserts that Allow rejects with an *OpenError and returns it.
func rejected(t *testing.T, r *Registry, name string) *OpenError {
	t.Helper()
	done, err := r.Allow(name, "")
	if err == nil {
		done(Excluded, "")
		t.Fatalf("Allow(%q) let the request through, want rejection", name)
	}
	var oe *OpenError
	if !errors.As(err, &oe) {
		t.Fatalf("Allow(%q) error = %T %v, want *OpenError", name, err, err)
	}
	return oe
}

func state(t *testing.T, r *Registry, name string) State {
	t.Helper()
	st, ok := r.Status(Key{Upstream: name})
	if !ok {
		t.Fatalf("Status(%q): unknown", name)
	}
	return st.State
}

// recorder collects OnStateChange calls.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (rec *recorder) on(k Key, from, to State) {
	name := k.Upstream
	if k.Model != "" {
		name += "/" + k.Model
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.events = append(rec.events, fmt.Sprintf("%s: %s->%s", name, from, to))
}

func (rec *recorder) take() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	ev := rec.events
	rec.events = nil
	return ev
}

func TestDefaults(t *testing.T) {
	s := Settings{}.withDefaults()
	want := Settings{
		ConsecutiveFailures: 5,
		MinRequests:         20,
		Interval:            60 * time.Second,
		OpenTimeout:         30 * time.Second,
		HalfOpenRequests:    1,
	}
	if s.ConsecutiveFailures != want.ConsecutiveFailures || s.MinRequests != want.MinRequests ||
		s.Interval != want.Interval || s.OpenTimeout != want.OpenTimeout ||
		s.HalfOpenRequests != want.HalfOpenRequests || s.FailureRatio != 0 {
		t.Errorf("defaults = %+v, want %+v", s, want)
	}
}

func TestTripsAfterConsecutiveFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a", "b"), Settings{}) // default: 5
		reportN(t, r, "a", 4, Failure)
		if got := state(t, r, "a"); got != Closed {
			t.Fatalf("after 4 failures state = %s, want closed", got)
		}
		// A success in between resets the run.
		report(t, r, "a", Success, "")
		reportN(t, r, "a", 4, Failure)
		if got := state(t, r, "a"); got != Closed {
			t.Fatalf("after success + 4 failures state = %s, want closed", got)
		}
		report(t, r, "a", Failure, "transient")
		if got := state(t, r, "a"); got != Open {
			t.Fatalf("after 5 consecutive failures state = %s, want open", got)
		}
		rejected(t, r, "a")
		// Breakers are per upstream.
		if got := state(t, r, "b"); got != Closed {
			t.Errorf("other upstream state = %s, want closed", got)
		}
		report(t, r, "b", Success, "")
	})
}

func TestSuccessFloodNeverTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 1, FailureRatio: 0.01, MinRequests: 1})
		for i := range 10_000 {
			report(t, r, "a", Success, "")
			if i%1000 == 0 {
				time.Sleep(7 * time.Second) // crosses Interval boundaries too
			}
		}
		st, _ := r.Status(Key{Upstream: "a"})
		if st.State != Closed || st.TotalFailures != 0 {
			t.Errorf("status = %+v, want closed with no failures", st)
		}
	})
}

func TestExcludedNotCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 3})
		reportN(t, r, "a", 2, Failure)
		reportN(t, r, "a", 50, Excluded)
		st, _ := r.Status(Key{Upstream: "a"})
		if st.State != Closed {
			t.Fatalf("state = %s after 2 failures and excluded ones, want closed", st.State)
		}
		// Excluded requests reset nothing and count nowhere.
		if st.ConsecutiveFailures != 2 || st.TotalFailures != 2 || st.TotalSuccesses != 0 || st.Requests != 2 {
			t.Fatalf("status = %+v, want 2 requests, 2 (consecutive) failures", st)
		}
		report(t, r, "a", Failure, "transient")
		if got := state(t, r, "a"); got != Open {
			t.Fatalf("after the 3rd failure state = %s, want open", got)
		}
	})
}

func TestExcludedDoNotDiluteFailureRatio(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 1000, FailureRatio: 0.5, MinRequests: 4})
		reportN(t, r, "a", 100, Excluded)
		report(t, r, "a", Success, "")
		report(t, r, "a", Failure, "transient")
		report(t, r, "a", Success, "")
		if got := state(t, r, "a"); got != Closed {
			t.Fatalf("state = %s after 3 counted requests, want closed", got)
		}
		report(t, r, "a", Failure, "transient") // 2/4 = 0.5
		if got := state(t, r, "a"); got != Open {
			t.Fatalf("state = %s at ratio 0.5 over 4 requests, want open", got)
		}
	})
}

func TestFailureRatio(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 1000, FailureRatio: 0.5, MinRequests: 10})
		// Alternate failure, success: ratio 0.5 from the 2nd request on,
		// but only the 10th completes MinRequests.
		for i := range 9 {
			res := Failure
			if i%2 == 1 {
				res = Success
			}
			report(t, r, "a", res, "transient")
		}
		if got := state(t, r, "a"); got != Closed {
			t.Fatalf("state = %s below MinRequests, want closed", got)
		}
		report(t, r, "a", Success, "") // successes never trip
		if got := state(t, r, "a"); got != Closed {
			t.Fatalf("state = %s after a success, want closed", got)
		}
		report(t, r, "a", Failure, "transient") // 6/11
		if got := state(t, r, "a"); got != Open {
			t.Fatalf("state = %s at ratio 6/11 with 11 requests, want open", got)
		}
	})
}

func TestFailureRatioBelowThreshold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 1000, FailureRatio: 0.5, MinRequests: 10})
		for i := range 100 {
			res := Success
			if i%3 == 0 {
				res = Failure
			}
			report(t, r, "a", res, "transient")
		}
		if got := state(t, r, "a"); got != Closed {
			t.Fatalf("state = %s at ratio 1/3, want closed", got)
		}
	})
}

func TestIntervalClearsCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 1000, FailureRatio: 0.5, MinRequests: 4, Interval: 10 * time.Second})
		reportN(t, r, "a", 3, Failure)
		time.Sleep(10 * time.Second)
		st, _ := r.Status(Key{Upstream: "a"})
		if st.Requests != 0 || st.TotalFailures != 0 {
			t.Fatalf("status = %+v, want interval counts cleared", st)
		}
		if st.ConsecutiveFailures != 3 {
			t.Errorf("ConsecutiveFailures = %d, want 3: time does not end a run", st.ConsecutiveFailures)
		}
		// 3 failures of the last interval no longer count towards the ratio.
		report(t, r, "a", Success, "")
		reportN(t, r, "a", 2, Failure)
		if got := state(t, r, "a"); got != Closed {
			t.Fatalf("state = %s with 3 requests in the interval, want closed", got)
		}
		time.Sleep(9 * time.Second) // still the same interval
		report(t, r, "a", Failure, "transient")
		if got := state(t, r, "a"); got != Open {
			t.Fatalf("state = %s at 3/4 failures in the interval, want open", got)
		}
	})
}

// A request counts when it completes, however long it took: a hung upstream
// whose requests outlive Interval still trips the breaker. (gobreaker's own
// Interval would drop those outcomes.)
func TestLongRequestsCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 3, Interval: 60 * time.Second})
		var hung []func(Result, string)
		for range 3 {
			done, err := r.Allow("a", "")
			if err != nil {
				t.Fatal(err)
			}
			hung = append(hung, done)
			time.Sleep(time.Second)
		}
		time.Sleep(6 * time.Minute) // 3 attempts of 120s, and backoff
		for _, done := range hung {
			done(Failure, "timeout")
		}
		st, _ := r.Status(Key{Upstream: "a"})
		if st.State != Open || st.LastFailureClass != "timeout" {
			t.Fatalf("status = %+v, want open after 3 long failures", st)
		}
	})
}

func TestOpenErrorRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 1, OpenTimeout: 30 * time.Second})
		report(t, r, "a", Failure, "transient")

		oe := rejected(t, r, "a")
		if oe.Upstream != "a" || oe.Forced || oe.RetryAfter != 30*time.Second {
			t.Errorf("OpenError = %+v, want upstream a, not forced, RetryAfter 30s", oe)
		}
		if got, want := oe.Error(), "upstream a is unavailable: circuit breaker open"; got != want {
			t.Errorf("Error() = %q, want %q", got, want)
		}

		time.Sleep(12*time.Second + 300*time.Millisecond)
		if oe := rejected(t, r, "a"); oe.RetryAfter != 18*time.Second {
			t.Errorf("RetryAfter = %v at 12.3s, want 18s (17.7s rounded up)", oe.RetryAfter)
		}

		time.Sleep(17*time.Second + 700*time.Millisecond) // exactly OpenTimeout
		if oe := rejected(t, r, "a"); oe.RetryAfter != time.Second {
			t.Errorf("RetryAfter = %v at the probe time, want the 1s minimum", oe.RetryAfter)
		}
	})
}

func TestHalfOpenProbesClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 1, OpenTimeout: 10 * time.Second, HalfOpenRequests: 2})
		report(t, r, "a", Failure, "transient")
		time.Sleep(10*time.Second + time.Millisecond)
		if got := state(t, r, "a"); got != HalfOpen {
			t.Fatalf("state after OpenTimeout = %s, want half-open", got)
		}

		p1, err := r.Allow("a", "")
		if err != nil {
			t.Fatalf("probe 1: %v", err)
		}
		p2, err := r.Allow("a", "")
		if err != nil {
			t.Fatalf("probe 2: %v", err)
		}
		// Both slots are taken: gobreaker's ErrTooManyRequests becomes an OpenError.
		if oe := rejected(t, r, "a"); oe.Forced || oe.RetryAfter < time.Second {
			t.Errorf("third request in half-open: %+v, want RetryAfter >= 1s, not forced", oe)
		}

		p1(Success, "")
		if got := state(t, r, "a"); got != HalfOpen {
			t.Fatalf("after 1 of 2 probes succeeded state = %s, want half-open", got)
		}
		p2(Success, "")
		st, _ := r.Status(Key{Upstream: "a"})
		if st.State != Closed || st.OpenedAt != nil || st.ProbeAt != nil {
			t.Fatalf("after 2 probes succeeded status = %+v, want closed, no OpenedAt/ProbeAt", st)
		}
		report(t, r, "a", Success, "")
	})
}

func TestHalfOpenFailedProbeReopens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 1, OpenTimeout: 10 * time.Second})
		report(t, r, "a", Failure, "transient")
		time.Sleep(10*time.Second + time.Millisecond)

		probe, err := r.Allow("a", "")
		if err != nil {
			t.Fatalf("probe: %v", err)
		}
		rejected(t, r, "a") // one probe slot
		time.Sleep(2 * time.Second)
		probe(Failure, "rate_limited")

		st, _ := r.Status(Key{Upstream: "a"})
		if st.State != Open {
			t.Fatalf("after failed probe state = %s, want open", st.State)
		}
		if oe := rejected(t, r, "a"); oe.RetryAfter != 10*time.Second {
			t.Errorf("RetryAfter = %v, want a fresh 10s", oe.RetryAfter)
		}
		if st.LastFailureClass != "rate_limited" {
			t.Errorf("LastFailureClass = %q, want rate_limited", st.LastFailureClass)
		}
	})
}

func TestHalfOpenExcludedProbeFreesSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 1, OpenTimeout: 10 * time.Second})
		report(t, r, "a", Failure, "transient")
		time.Sleep(10*time.Second + time.Millisecond)

		probe, err := r.Allow("a", "")
		if err != nil {
			t.Fatalf("probe: %v", err)
		}
		probe(Excluded, "") // the client went away: says nothing about the upstream
		if got := state(t, r, "a"); got != HalfOpen {
			t.Fatalf("after excluded probe state = %s, want half-open", got)
		}
		report(t, r, "a", Success, "")
		if got := state(t, r, "a"); got != Closed {
			t.Fatalf("after a successful probe state = %s, want closed", got)
		}
	})
}

func TestForceOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		r := New(ups("a"), Settings{OpenTimeout: 20 * time.Second, OnStateChange: rec.on})
		inflight, err := r.Allow("a", "")
		if err != nil {
			t.Fatal(err)
		}
		if err := r.ForceOpen(Key{Upstream: "a"}); err != nil {
			t.Fatal(err)
		}
		forcedAt := time.Now()
		if err := r.ForceOpen(Key{Upstream: "a"}); err != nil { // idempotent, no second event
			t.Fatal(err)
		}

		oe := rejected(t, r, "a")
		if !oe.Forced || oe.RetryAfter != 20*time.Second {
			t.Errorf("OpenError = %+v, want Forced, RetryAfter = OpenTimeout", oe)
		}
		// Long past OpenTimeout it still rejects: no probes while forced.
		time.Sleep(time.Hour)
		rejected(t, r, "a")

		inflight(Success, "") // a request let through before still reports
		st, _ := r.Status(Key{Upstream: "a"})
		if st.State != Open || !st.Forced || st.ProbeAt != nil ||
			st.OpenedAt == nil || !st.OpenedAt.Equal(forcedAt) || st.TotalSuccesses != 1 {
			t.Errorf("status = %+v, want forced open since %v, no ProbeAt, 1 success", st, forcedAt)
		}
		if got, want := rec.take(), []string{"a: closed->open"}; !slices.Equal(got, want) {
			t.Errorf("events = %q, want %q", got, want)
		}
	})
}

func TestForceOpenHidesUnderlyingChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		r := New(ups("a"), Settings{ConsecutiveFailures: 1, OpenTimeout: 10 * time.Second, OnStateChange: rec.on})
		inflight, err := r.Allow("a", "")
		if err != nil {
			t.Fatal(err)
		}
		if err := r.ForceOpen(Key{Upstream: "a"}); err != nil {
			t.Fatal(err)
		}
		inflight(Failure, "transient") // trips the breaker underneath
		time.Sleep(time.Minute)        // underneath: open → half-open
		if st, _ := r.Status(Key{Upstream: "a"}); st.State != Open || !st.Forced {
			t.Fatalf("status = %+v, want forced open", st)
		}
		if err := r.ForceClose(Key{Upstream: "a"}); err != nil {
			t.Fatal(err)
		}
		want := []string{"a: closed->open", "a: open->closed"}
		if got := rec.take(); !slices.Equal(got, want) {
			t.Errorf("events = %q, want %q", got, want)
		}
	})
}

func TestForceCloseResets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 3})
		old, err := r.Allow("a", "")
		if err != nil {
			t.Fatal(err)
		}
		reportN(t, r, "a", 3, Failure)
		if got := state(t, r, "a"); got != Open {
			t.Fatalf("state = %s, want open", got)
		}
		if err := r.ForceClose(Key{Upstream: "a"}); err != nil {
			t.Fatal(err)
		}
		st, _ := r.Status(Key{Upstream: "a"})
		if st.State != Closed || st.Forced || st.Requests != 0 || st.TotalFailures != 0 ||
			st.ConsecutiveFailures != 0 || st.OpenedAt != nil || st.ProbeAt != nil {
			t.Fatalf("after ForceClose status = %+v, want fresh closed", st)
		}
		// A done func of the replaced breaker is harmless.
		old(Failure, "stale")
		reportN(t, r, "a", 2, Failure)
		st, _ = r.Status(Key{Upstream: "a"})
		if st.State != Closed || st.ConsecutiveFailures != 2 || st.LastFailureClass != "transient" {
			t.Fatalf("status = %+v, want closed, 2 consecutive failures, class transient", st)
		}

		// ForceClose also clears a forced open.
		if err := r.ForceOpen(Key{Upstream: "a"}); err != nil {
			t.Fatal(err)
		}
		if err := r.ForceClose(Key{Upstream: "a"}); err != nil {
			t.Fatal(err)
		}
		report(t, r, "a", Success, "")
	})
}

func TestSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("c", "a", "b", "a"), Settings{ConsecutiveFailures: 2, OpenTimeout: 30 * time.Second})
		if got, want := r.Names(), []string{"a", "b", "c"}; !slices.Equal(got, want) {
			t.Fatalf("Names() = %q, want %q", got, want)
		}

		start := time.Now()
		report(t, r, "a", Failure, "transient")
		time.Sleep(time.Second)
		report(t, r, "a", Failure, "rate_limited") // trips
		openedAt := time.Now()
		report(t, r, "b", Success, "")
		if err := r.ForceOpen(Key{Upstream: "c"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)

		snap := r.Snapshot()
		if len(snap) != 3 || snap[0].Name != "a" || snap[1].Name != "b" || snap[2].Name != "c" {
			t.Fatalf("Snapshot() = %+v, want a, b, c", snap)
		}
		a, b, c := snap[0], snap[1], snap[2]

		if a.State != Open || a.Forced || a.LastFailureClass != "rate_limited" {
			t.Errorf("a = %+v, want open, last class rate_limited", a)
		}
		if a.LastFailureAt == nil || !a.LastFailureAt.Equal(start.Add(time.Second)) {
			t.Errorf("a.LastFailureAt = %v, want %v", a.LastFailureAt, start.Add(time.Second))
		}
		if a.OpenedAt == nil || !a.OpenedAt.Equal(openedAt) {
			t.Errorf("a.OpenedAt = %v, want %v", a.OpenedAt, openedAt)
		}
		if a.ProbeAt == nil || !a.ProbeAt.Equal(openedAt.Add(30*time.Second)) {
			t.Errorf("a.ProbeAt = %v, want %v", a.ProbeAt, openedAt.Add(30*time.Second))
		}

		if b.State != Closed || b.Requests != 1 || b.TotalSuccesses != 1 || b.ConsecutiveSuccesses != 1 ||
			b.LastFailureAt != nil || b.OpenedAt != nil || b.ProbeAt != nil {
			t.Errorf("b = %+v, want closed with 1 success", b)
		}
		if c.State != Open || !c.Forced || c.ProbeAt != nil || c.OpenedAt == nil {
			t.Errorf("c = %+v, want forced open with OpenedAt and no ProbeAt", c)
		}

		// Half-open: OpenedAt stays, ProbeAt goes.
		time.Sleep(30 * time.Second)
		if st, _ := r.Status(Key{Upstream: "a"}); st.State != HalfOpen || st.OpenedAt == nil || st.ProbeAt != nil {
			t.Errorf("a after OpenTimeout = %+v, want half-open with OpenedAt, no ProbeAt", st)
		}

		if _, ok := r.Status(Key{Upstream: "nope"}); ok {
			t.Error("Status of an unknown name reported ok")
		}

		// The JSON the admin API shows.
		js, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		// The fields of before model scope keep their names and order;
		// model, covers, state_since, counts_since and rejected are new.
		want := `{"name":"b","model":"","covers":"connection","state":"closed","forced":false,` +
			`"state_since":"2000-01-01T00:00:00Z","counts_since":"2000-01-01T00:00:00Z","requests":1,"total_successes":1,` +
			`"total_failures":0,"rejected":0,"consecutive_successes":1,"consecutive_failures":0}`
		if string(js) != want {
			t.Errorf("json = %s\nwant   %s", js, want)
		}
	})
}

func TestOnStateChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		r := New(ups("a"), Settings{ConsecutiveFailures: 1, OpenTimeout: 10 * time.Second, OnStateChange: rec.on})
		report(t, r, "a", Failure, "transient")
		time.Sleep(11 * time.Second)
		report(t, r, "a", Failure, "transient") // failed probe
		time.Sleep(11 * time.Second)
		report(t, r, "a", Success, "") // successful probe
		if err := r.ForceOpen(Key{Upstream: "a"}); err != nil {
			t.Fatal(err)
		}
		if err := r.ForceClose(Key{Upstream: "a"}); err != nil {
			t.Fatal(err)
		}
		if err := r.ForceClose(Key{Upstream: "a"}); err != nil { // already closed: no event
			t.Fatal(err)
		}
		want := []string{
			"a: closed->open",
			"a: open->half-open",
			"a: half-open->open",
			"a: open->half-open",
			"a: half-open->closed",
			"a: closed->open",
			"a: open->closed",
		}
		if got := rec.take(); !slices.Equal(got, want) {
			t.Errorf("events:\n got %q\nwant %q", got, want)
		}
	})
}

// The callback may call back into the Registry, even for the upstream
// whose state changed, and sees the failure that tripped it.
func TestOnStateChangeReentrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			r   *Registry
			got []Status
		)
		r = New(ups("a"), Settings{ConsecutiveFailures: 1, OnStateChange: func(k Key, from, to State) {
			name := k.Upstream
			st, _ := r.Status(Key{Upstream: name})
			got = append(got, st)
			if to == Open && !st.Forced {
				_ = r.ForceOpen(Key{Upstream: name}) // changes nothing visible: no event
			}
		}})
		report(t, r, "a", Failure, "server_error")
		if len(got) != 1 || got[0].State != Open || got[0].LastFailureClass != "server_error" {
			t.Fatalf("callback saw %+v, want one open status with class server_error", got)
		}
		if st, _ := r.Status(Key{Upstream: "a"}); !st.Forced {
			t.Errorf("status = %+v, want forced by the callback", st)
		}
	})
}

func TestUnknownName(t *testing.T) {
	r := New(ups("a"), Settings{})
	if _, err := r.Allow("x", ""); !errors.Is(err, ErrUnknownUpstream) {
		t.Errorf("Allow: err = %v, want ErrUnknownUpstream", err)
	} else if oe := (*OpenError)(nil); errors.As(err, &oe) {
		t.Errorf("Allow: err = %v is an OpenError", err)
	}
	if err := r.ForceOpen(Key{Upstream: "x"}); !errors.Is(err, ErrUnknownUpstream) {
		t.Errorf("ForceOpen: err = %v, want ErrUnknownUpstream", err)
	}
	if err := r.ForceClose(Key{Upstream: "x"}); !errors.Is(err, ErrUnknownUpstream) {
		t.Errorf("ForceClose: err = %v, want ErrUnknownUpstream", err)
	}
}

func TestDoneTwiceCountsOnce(t *testing.T) {
	r := New(ups("a"), Settings{ConsecutiveFailures: 2})
	done, err := r.Allow("a", "")
	if err != nil {
		t.Fatal(err)
	}
	done(Failure, "transient")
	done(Failure, "transient")
	if st, _ := r.Status(Key{Upstream: "a"}); st.State != Closed || st.TotalFailures != 1 {
		t.Errorf("status = %+v, want closed with 1 failure", st)
	}
}

func TestConcurrent(t *testing.T) {
	const workers, perWorker = 32, 500

	t.Run("counts", func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 1})
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range perWorker {
					done, err := r.Allow("a", "")
					if err != nil {
						t.Errorf("Allow: %v", err)
						return
					}
					res := Success
					if (w+i)%2 == 0 {
						res = Excluded
					}
					done(res, "")
				}
			})
		}
		wg.Wait()
		st, _ := r.Status(Key{Upstream: "a"})
		if want := uint32(workers * perWorker / 2); st.State != Closed || st.TotalSuccesses != want || st.Requests != want {
			t.Errorf("status = %+v, want closed, %d requests and successes", st, want)
		}
	})

	t.Run("chaos", func(t *testing.T) {
		var (
			mu   sync.Mutex
			last = map[string]State{}
			bad  []string
		)
		names := []string{"a", "b"}
		r := New(ups(names...), Settings{
			ConsecutiveFailures: 3,
			FailureRatio:        0.3,
			MinRequests:         5,
			OpenTimeout:         time.Nanosecond, // open ↔ half-open churns constantly
			HalfOpenRequests:    2,
			OnStateChange: func(k Key, from, to State) {
				name := k.Upstream
				mu.Lock()
				defer mu.Unlock()
				prev, ok := last[name]
				if !ok {
					prev = Closed
				}
				if from != prev || from == to {
					bad = append(bad, fmt.Sprintf("%s: %s->%s after %s", name, from, to, prev))
				}
				last[name] = to
			},
		})
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				name := names[w%len(names)]
				var held []func(Result, string)
				for i := range perWorker {
					switch {
					case w == 0 && i%50 == 0:
						_ = r.ForceOpen(Key{Upstream: name})
					case w == 1 && i%50 == 25:
						_ = r.ForceClose(Key{Upstream: name})
					case w == 2:
						_ = r.Snapshot()
					}
					done, err := r.Allow(name, "")
					if err != nil {
						if oe := (*OpenError)(nil); !errors.As(err, &oe) {
							t.Errorf("Allow: %v", err)
						}
						continue
					}
					if i%7 == 0 { // finish some later, across state changes
						held = append(held, done)
						continue
					}
					done(Result(i%3), "transient")
				}
				for _, done := range held {
					done(Failure, "late")
				}
			})
		}
		wg.Wait()
		snap := r.Snapshot() // delivers what it changes before it returns
		mu.Lock()
		defer mu.Unlock()
		if len(bad) > 0 {
			t.Errorf("OnStateChange calls do not chain: %q", bad)
		}
		for _, st := range snap {
			if prev, ok := last[st.Name]; ok && prev != st.State {
				t.Errorf("%s: last event to %s, state now %s", st.Name, prev, st.State)
			}
		}
	})
}

func BenchmarkAllow(b *testing.B) {
	r := New(ups("a", "b", "c"), Settings{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			done, err := r.Allow("b", "")
			if err != nil {
				b.Fatal(err)
			}
			done(Success, "")
		}
	})
}

// An outcome reported after a state change its request did not see counts
// nowhere: it says nothing about the upstream as it is now.
func TestOutcomeAcrossStateChangeIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 1, OpenTimeout: 10 * time.Second})
		old, err := r.Allow("a", "")
		if err != nil {
			t.Fatal(err)
		}
		report(t, r, "a", Failure, "transient") // open
		time.Sleep(11 * time.Second)
		report(t, r, "a", Success, "") // probe: closed again
		old(Failure, "transient")
		st, _ := r.Status(Key{Upstream: "a"})
		if st.State != Closed || st.TotalFailures != 0 || st.ConsecutiveFailures != 0 {
			t.Fatalf("status = %+v, want closed with no failures", st)
		}
	})
}
