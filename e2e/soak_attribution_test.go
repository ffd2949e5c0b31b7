package e2e

import (
	"testing"
	"time"

	"github.com/llmgate/llmgate/gateway/sim"
)

// TestLostCallsPairByTime is the shape of a replica soak failure (seed
// 1796645895513613024): r0 was stopped past its lease while reading run
// 1859's answer; on waking, the attempt had timed out, so it retried (run
// 1869), and that run's commit failed with "not the owner" — the one line
// r0 logged. Paired in order, the line went to 1859, and 1869 was left
// "neither kept nor lost". Paired by time, the line is 1869's and the stop
// accounts for 1859.
func TestLostCallsPairByTime(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	lost := []sim.Run{
		{ID: 1859, Key: "k", Attempt: 1, Completed: true, Start: ms(31330), End: ms(31334.5), Via: "r0"},
		{ID: 1869, Key: "k", Attempt: 2, Completed: true, Start: ms(34340), End: ms(34343), Via: "r0"},
	}
	logged := map[string][]loggedFailure{"r0": {{err: "commit: not the owner", at: ms(34343.6)}}}
	faults := []soakFault{{kind: "stop", replica: "r0", from: ms(31335), to: ms(34338)}}
	got := map[int]string{}
	for _, c := range lostCalls("k", lost, nil, logged, faults) {
		got[c.Run] = c.Err + c.Fault
	}
	want := map[int]string{1859: "replica_stop", 1869: "commit: not the owner"}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("run %d: accounted for by %q, want %q (all: %v)", id, got[id], w, got)
		}
	}

	// Two failed commits of one replica each go to their own run, and a
	// run after the last line with no fault over it stays unaccounted for.
	lost = []sim.Run{
		{ID: 1, Key: "k", Completed: true, Start: ms(10), End: ms(20), Via: "r1"},
		{ID: 2, Key: "k", Completed: true, Start: ms(30), End: ms(40), Via: "r1"},
		{ID: 3, Key: "k", Completed: true, Start: ms(50), End: ms(60), Via: "r1"},
	}
	logged = map[string][]loggedFailure{"r1": {{err: "b", at: ms(45)}, {err: "a", at: ms(25)}}}
	got = map[int]string{}
	for _, c := range lostCalls("k", lost, nil, logged, nil) {
		got[c.Run] = c.Err + c.Fault
	}
	if got[1] != "a" || got[2] != "b" || got[3] != "" || len(got) != 2 {
		t.Errorf("got %v, want run 1 a, run 2 b, run 3 unaccounted for", got)
	}

	// A line the kept run accounts for (its commit's reply timed out after
	// the commit was applied) does not account for an earlier lost run,
	// which stays unaccounted for with no fault over it.
	lost = []sim.Run{{ID: 4, Key: "k", Completed: true, Start: ms(10), End: ms(20), Via: "r2"}}
	kept := &sim.Run{ID: 5, Key: "k", Completed: true, Start: ms(30), End: ms(40), Via: "r2"}
	logged = map[string][]loggedFailure{"r2": {{err: "commit: i/o timeout", at: ms(45)}}}
	if calls := lostCalls("k", lost, kept, logged, nil); len(calls) != 0 {
		t.Errorf("the kept run's failed-looking commit accounted for a lost run: %+v", calls[0])
	}
}
