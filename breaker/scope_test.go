package breaker

import (
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestModelScopeIsolatesModels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New([]Upstream{{Name: "u", Models: []string{"a", "b", "x-*"}}}, Settings{ConsecutiveFailures: 3})
		for range 3 {
			done, err := r.Allow("u", "a")
			if err != nil {
				t.Fatal(err)
			}
			done(Failure, "transient")
		}
		_, err := r.Allow("u", "a")
		var oe *OpenError
		if !errors.As(err, &oe) || oe.Model != "a" || oe.Upstream != "u" {
			t.Fatalf("Allow(u, a) after 3 failures: %v, want model a's breaker open", err)
		}
		for _, m := range []string{"b", "x-new", ""} {
			done, err := r.Allow("u", m)
			if err != nil {
				t.Fatalf("Allow(u, %q) with only a open: %v", m, err)
			}
			done(Success, "")
		}
		if st, _ := r.Status(Key{"u", ""}); st.State != Closed || st.Covers != "connection" || st.TotalSuccesses != 6 {
			// a's three failures were answers: the upstream itself is up.
			t.Errorf("upstream-wide = %+v, want closed with 6 successes", st)
		}
		var keys []string
		for _, k := range r.Keys() {
			keys = append(keys, k.Upstream+"/"+k.Model)
		}
		if want := []string{"u/", "u/a", "u/b", "u/x-new"}; !slices.Equal(keys, want) {
			t.Errorf("Keys() = %q, want %q (wildcards are no model)", keys, want)
		}
		if got := r.UpstreamState("u"); got != Open {
			t.Errorf("UpstreamState = %s, want open (the worst of its breakers)", got)
		}
	})
}

func TestConnectionFailureOpensEveryModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New([]Upstream{{Name: "u", Models: []string{"a", "b"}}, {Name: "v"}}, Settings{ConsecutiveFailures: 3})
		for range 3 {
			done, err := r.Allow("u", "a")
			if err != nil {
				t.Fatal(err)
			}
			done(ConnectionFailure, "transient")
		}
		for _, m := range []string{"a", "b", "never-seen", ""} {
			_, err := r.Allow("u", m)
			var oe *OpenError
			if !errors.As(err, &oe) || oe.Model != "" {
				t.Errorf("Allow(u, %q): %v, want the upstream-wide breaker open", m, err)
			}
		}
		if st, _ := r.Status(Key{"u", "a"}); st.State != Closed || st.Requests != 0 {
			t.Errorf("a's own breaker = %+v, want closed and untouched", st)
		}
		st, _ := r.Status(Key{"u", ""})
		if st.OpenedBy == nil || st.OpenedBy.Failures != 3 || st.Rejected != 4 {
			t.Errorf("upstream-wide = %+v, want opened by 3 failures, 4 rejected", st)
		}
		if _, err := r.Allow("v", "a"); err != nil {
			t.Errorf("another upstream: %v", err)
		}
	})
}

func TestScopeUpstreamCountsEveryModel(t *testing.T) {
	r := New([]Upstream{{Name: "u", Models: []string{"a", "b"}}}, Settings{ConsecutiveFailures: 2, Scope: ScopeUpstream})
	for _, m := range []string{"a", "b"} {
		done, err := r.Allow("u", m)
		if err != nil {
			t.Fatal(err)
		}
		done(Failure, "transient")
	}
	if _, err := r.Allow("u", "c"); err == nil {
		t.Fatal("scope upstream: two models' failures did not open the upstream's breaker")
	}
	if got := len(r.Snapshot()); got != 1 {
		t.Errorf("%d breakers, want 1 per upstream", got)
	}
	if err := r.ForceOpen(Key{"u", "a"}); err == nil {
		t.Error("ForceOpen of a model under scope upstream succeeded")
	}
}

func TestLearnedModelsAreCapped(t *testing.T) {
	var untracked []Key
	r := New([]Upstream{{Name: "u", Models: []string{"conf"}}}, Settings{MaxLearnedModels: 2, ConsecutiveFailures: 2,
		OnUntracked: func(k Key) { untracked = append(untracked, k) }})
	for _, m := range []string{"m1", "m2", "m3", "m4", "m1", "(forged)"} {
		done, err := r.Allow("u", m)
		if err != nil {
			t.Fatal(err)
		}
		done(Success, "")
	}
	done, err := r.AllowLane("u", "files")
	if err != nil {
		t.Fatal(err)
	}
	done(Success, "")
	var models []string
	for _, st := range r.Snapshot() {
		models = append(models, st.Model)
	}
	if want := []string{"", "(files)", "conf", "m1", "m2"}; !slices.Equal(models, want) {
		t.Fatalf("models %q, want %q (lanes outside the cap, no shared breaker past it, no lane a body names)", models, want)
	}
	if want := []Key{{"u", "m3"}}; !slices.Equal(untracked, want) {
		t.Errorf("OnUntracked calls %v, want %v (once per upstream)", untracked, want)
	}
	// Past the cap, two models share no fate: m3's failures open nothing,
	// and m4 is still let through.
	for range 3 {
		done, err := r.Allow("u", "m3")
		if err != nil {
			t.Fatalf("m3 after its failures: %v", err)
		}
		done(Failure, "transient")
	}
	if _, err := r.Allow("u", "m4"); err != nil {
		t.Errorf("m4 after m3 failed: %v", err)
	}
	if st, _ := r.Status(Key{"u", ""}); st.State != Closed {
		t.Errorf("upstream's own breaker after an untracked model's failures: %s", st.State)
	}
	if err := r.ForceOpen(Key{"u", "m5"}); err == nil || !strings.Contains(err.Error(), "m5") {
		t.Errorf("forcing a model past the cap: %v, want an error naming it", err)
	}
}

// An open breaker turns half-open when its probe is due, with nobody
// asking: the OnStateChange call (metrics, charts, log) comes on time.
func TestOpenTurnsHalfOpenWhenDue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		r := New(ups("a"), Settings{ConsecutiveFailures: 1, OpenTimeout: 10 * time.Second, OnStateChange: rec.on})
		report(t, r, "a", Failure, "transient")
		opened := time.Now()
		time.Sleep(10*time.Second + time.Millisecond)
		synctest.Wait()
		if got, want := rec.take(), []string{"a: closed->open", "a: open->half-open"}; !slices.Equal(got, want) {
			t.Fatalf("events with no request or look: %q, want %q", got, want)
		}
		st, _ := r.Status(Key{Upstream: "a"})
		if st.State != HalfOpen || st.StateSince.Sub(opened) > 10*time.Second+time.Millisecond || st.StateSince.Sub(opened) < 10*time.Second {
			t.Errorf("status = %+v, want half-open since %v", st, opened.Add(10*time.Second))
		}
	})
}

// What opened a breaker survives gobreaker's reset of its counts on the
// state change, and the probes' outcomes are kept.
func TestOpenedByAndProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(ups("a"), Settings{ConsecutiveFailures: 3, OpenTimeout: 10 * time.Second})
		reportN(t, r, "a", 2, Failure)
		time.Sleep(time.Second)
		report(t, r, "a", Failure, "rate_limited")
		opened := time.Now()
		rejected(t, r, "a")
		st, _ := r.Status(Key{Upstream: "a"})
		want := Trip{Reason: "consecutive_failures", Failures: 3, Class: "rate_limited", At: opened}
		if st.OpenedBy == nil || *st.OpenedBy != want {
			t.Fatalf("opened_by = %+v, want %+v", st.OpenedBy, want)
		}
		if st.Requests != 0 || !st.CountsSince.Equal(opened) || st.Rejected != 1 || !st.StateSince.Equal(opened) {
			t.Errorf("status = %+v, want counts since %v (0), 1 rejected", st, opened)
		}
		if st.ProbeAt == nil || !st.ProbeAt.Equal(opened.Add(10*time.Second)) || st.LastProbe != nil {
			t.Errorf("probe_at = %v last_probe = %v, want %v and none", st.ProbeAt, st.LastProbe, opened.Add(10*time.Second))
		}

		time.Sleep(11 * time.Second)
		report(t, r, "a", Failure, "server_error") // the probe fails
		st, _ = r.Status(Key{Upstream: "a"})
		if st.State != Open || st.OpenedBy.Reason != "probe_failed" || st.OpenedBy.Class != "server_error" ||
			st.LastProbe == nil || st.LastProbe.Result != "failure" || st.LastProbe.Class != "server_error" {
			t.Fatalf("after a failed probe: %+v (opened_by %+v, last_probe %+v)", st, st.OpenedBy, st.LastProbe)
		}

		time.Sleep(11 * time.Second)
		report(t, r, "a", Success, "")
		st, _ = r.Status(Key{Upstream: "a"})
		if st.State != Closed || st.LastProbe.Result != "success" || st.OpenedBy.Reason != "probe_failed" {
			t.Errorf("after a good probe: %+v (opened_by %+v, last_probe %+v), want closed, history kept", st, st.OpenedBy, st.LastProbe)
		}
		if err := r.ForceOpen(Key{Upstream: "a"}); err != nil {
			t.Fatal(err)
		}
		if st, _ := r.Status(Key{Upstream: "a"}); st.OpenedBy.Reason != "forced" {
			t.Errorf("forced: opened_by %+v", st.OpenedBy)
		}
	})
}

// BenchmarkAllowModel is Allow and done for a model: the model's breaker
// and the upstream's own.
func BenchmarkAllowModel(b *testing.B) {
	r := New([]Upstream{{Name: "b", Models: []string{"m"}}}, Settings{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			done, err := r.Allow("b", "m")
			if err != nil {
				b.Fatal(err)
			}
			done(Success, "")
		}
	})
}

// TestLearnedModelsShared: one client may learn at most half the
// upstream's MaxLearnedModels; past its share a model it names first gets
// no breaker of its own (as past the cap), and the other half stays for
// the rest. A model another client learned is anyone's, counted against
// no one else. Without clients ("") the whole cap is one tenant's. One
// tenant naming many models used to take every slot, and another
// tenant's failing model then opened no breaker at all.
func TestLearnedModelsShared(t *testing.T) {
	r := New([]Upstream{{Name: "u"}}, Settings{MaxLearnedModels: 4, ConsecutiveFailures: 2})
	allow := func(client, model string) {
		t.Helper()
		done, err := r.AllowFor(client, "u", model)
		if err != nil {
			t.Fatalf("%s naming %s: %v", client, model, err)
		}
		done(Success, "")
	}
	for _, m := range []string{"a1", "a2", "a3", "a4", "a5"} {
		allow("mallory", m)
	}
	allow("alice", "a1") // learned by mallory: alice's share untouched
	allow("alice", "b1")
	allow("alice", "b2")
	allow("alice", "b3") // past alice's share too
	var models []string
	for _, st := range r.Snapshot() {
		models = append(models, st.Model)
	}
	if want := []string{"", "a1", "a2", "b1", "b2"}; !slices.Equal(models, want) {
		t.Fatalf("models %q, want %q: two for each client", models, want)
	}
	// Alice's model opens as a learned model's does.
	for range 2 {
		done, err := r.AllowFor("alice", "u", "b1")
		if err != nil {
			t.Fatal(err)
		}
		done(Failure, "transient")
	}
	if _, err := r.AllowFor("alice", "u", "b1"); err == nil {
		t.Error("alice's failing model did not open its breaker")
	}

	solo := New([]Upstream{{Name: "u"}}, Settings{MaxLearnedModels: 4})
	for _, m := range []string{"m1", "m2", "m3", "m4"} {
		done, err := solo.AllowFor("", "u", m)
		if err != nil {
			t.Fatal(err)
		}
		done(Success, "")
	}
	if n := len(solo.Snapshot()); n != 5 {
		t.Errorf("without clients, %d breakers, want the upstream's own and 4 learned", n)
	}
}

// TestStateChangeCallbackPanicIsRecoverable: OnStateChange panicking (a
// metric label the Prometheus client refuses, say) is an ordinary panic
// that the request's recover catches, and the breaker goes on working and
// delivering later changes. It ran with the entry's lock released, and
// the deferred unlock then unlocked it again: "fatal error: sync: unlock
// of unlocked mutex", which nothing recovers, ending the process for
// every tenant. A model name that is not UTF-8 gets no breaker of its
// own (it could be no metric label).
func TestStateChangeCallbackPanicIsRecoverable(t *testing.T) {
	var changes atomic.Int32
	r := New([]Upstream{{Name: "u"}}, Settings{ConsecutiveFailures: 1, OnStateChange: func(k Key, from, to State) {
		if changes.Add(1) == 1 {
			panic("label refused")
		}
	}})
	fail := func() (panicked any) {
		defer func() { panicked = recover() }()
		done, err := r.Allow("u", "m")
		if err != nil {
			return nil
		}
		done(Failure, "transient")
		return nil
	}
	if p := fail(); p == nil {
		t.Fatal("the callback's panic did not reach the caller")
	}
	if _, err := r.Allow("u", "m"); err == nil {
		t.Fatal("the breaker did not open")
	}
	if err := r.ForceClose(Key{"u", "m"}); err != nil {
		t.Fatal(err)
	}
	if got := changes.Load(); got < 2 {
		t.Errorf("%d state changes delivered, want the later ones too", got)
	}
	if _, err := r.AllowFor("alice", "u", "m-\xff"); err != nil {
		t.Fatal(err)
	}
	for _, st := range r.Snapshot() {
		if st.Model == "m-\xff" {
			t.Error("a model name that is not UTF-8 got a breaker of its own")
		}
	}
}
