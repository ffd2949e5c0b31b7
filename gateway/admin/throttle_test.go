package admin

import (
	"fmt"
	"testing"
	"time"
)

// attempt runs one sign-in attempt from addr through t: "wait" when it
// must wait (and for how long), else "ok" or "wrong" as the token was.
func attempt(t *throttle, addr string, right bool) (string, time.Duration) {
	wait, ok, _ := t.begin(addr)
	if !ok {
		return "wait", wait
	}
	t.end(addr, right)
	if right {
		return "ok", 0
	}
	return "wrong", 0
}

// TestThrottlePolicy reads as the policy: five wrong tokens are free;
// then the address waits 1s, 2s, 4s … up to 5m between tries; the right
// token once the wait is over is accepted and forgets the failures; other
// addresses are unaffected; failures are forgotten after 15 minutes.
func TestThrottlePolicy(t *testing.T) {
	c := newClock()
	th := newThrottle(ThrottleOptions{}, c.now)
	const a, b = "198.51.100.7", "203.0.113.9"

	for i := range 5 {
		if got, _ := attempt(th, a, false); got != "wrong" {
			t.Fatalf("failure %d: %s, want it tried", i+1, got)
		}
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}
	for i, w := range want {
		got, wait := attempt(th, a, true)
		if got != "wait" || wait != w {
			t.Fatalf("after %d failures: %s %s, want wait %s", 5+i, got, wait, w)
		}
		if got, _ := attempt(th, b, false); got != "wrong" {
			t.Fatalf("another address was held back: %s", got)
		}
		th.end(b, true) // b is only a bystander; keep it clean
		c.advance(w - time.Millisecond)
		if got, _ := attempt(th, a, false); got != "wait" {
			t.Fatalf("a millisecond before the wait ends: %s", got)
		}
		c.advance(time.Millisecond)
		if got, _ := attempt(th, a, false); got != "wrong" {
			t.Fatalf("once the wait ended: %s, want the token tried", got)
		}
	}
	// The wait is capped.
	for range 20 {
		_, wait := attempt(th, a, false)
		if wait > 5*time.Minute {
			t.Fatalf("wait %s beyond the 5m cap", wait)
		}
		c.advance(wait)
		attempt(th, a, false)
	}
	if _, wait := attempt(th, a, true); wait != 5*time.Minute {
		t.Fatalf("wait after many failures %s, want the cap 5m", wait)
	}

	// Not a lock-out: once the wait is over, the right token is accepted,
	// and the failures are forgotten.
	c.advance(5 * time.Minute)
	if got, _ := attempt(th, a, true); got != "ok" {
		t.Fatalf("right token after the wait: %s", got)
	}
	for i := range 5 {
		if got, _ := attempt(th, a, false); got != "wrong" {
			t.Fatalf("after a success, failure %d: %s, want free tries again", i+1, got)
		}
	}

	// Forgotten 15 minutes after the last failure and its wait.
	c.advance(15 * time.Minute)
	if got, _ := attempt(th, a, false); got != "wrong" {
		t.Fatalf("15 minutes on: %s, want the failures forgotten", got)
	}
	if e := th.addrs[a]; e.failures != 1 {
		t.Fatalf("failures after forgetting: %d, want 1", e.failures)
	}
}

// TestThrottleParallel: guesses sent in parallel are not all tried
// before the first failure counts; past the free tries, one at a time.
func TestThrottleParallel(t *testing.T) {
	c := newClock()
	th := newThrottle(ThrottleOptions{}, c.now)
	const a = "198.51.100.7"
	began := 0
	for range 100 {
		if _, ok, _ := th.begin(a); ok {
			began++
		}
	}
	if began != 5 {
		t.Fatalf("%d of 100 parallel attempts tried, want the 5 free ones", began)
	}
	for range began {
		th.end(a, false)
	}
	if _, ok, _ := th.begin(a); ok {
		t.Fatal("an attempt right after five failures was tried")
	}
}

// TestThrottleBounded: the addresses tracked are capped; the oldest
// failure makes room.
func TestThrottleBounded(t *testing.T) {
	c := newClock()
	th := newThrottle(ThrottleOptions{MaxAddrs: 100}, c.now)
	for i := range 250 {
		c.advance(time.Millisecond)
		attempt(th, fmt.Sprintf("10.0.%d.%d", i/256, i%256), false)
	}
	if len(th.addrs) != 100 {
		t.Fatalf("%d addresses tracked, want 100", len(th.addrs))
	}
	if _, ok := th.addrs["10.0.0.249"]; !ok {
		t.Fatal("the newest address was dropped")
	}
	if _, ok := th.addrs["10.0.0.0"]; ok {
		t.Fatal("the oldest address was kept")
	}
	if len(th.from) > 100 {
		t.Fatalf("%d addresses noted for the report, want at most 100", len(th.from))
	}
}

func TestThrottleKey(t *testing.T) {
	for in, want := range map[string]string{
		"198.51.100.7":          "198.51.100.7",
		"::ffff:198.51.100.7":   "198.51.100.7",
		"2001:db8:1:2:3:4:5:6":  "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::1":  "2001:db8:1:2::/64",
		"2001:db8:1:3::1":       "2001:db8:1:3::/64",
		"":                      "",
		"not an address at all": "not an address at all",
	} {
		if got := throttleKey(in); got != want {
			t.Errorf("throttleKey(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestThrottleReport: the first failure after a quiet spell is logged at
// once, with its address; the rest are summed up by the first event a
// minute or more later, and before the next successful sign-in.
func TestThrottleReport(t *testing.T) {
	c := newClock()
	th := newThrottle(ThrottleOptions{}, c.now)
	var lines []logLine
	try := func(addr string, right bool) {
		_, ok, l := th.begin(addr)
		if l.msg != "" {
			lines = append(lines, l)
		}
		if !ok {
			return
		}
		if l := th.end(addr, right); l.msg != "" {
			lines = append(lines, l)
		}
	}
	try("198.51.100.7", false)
	if len(lines) != 1 || lines[0].msg != "admin page: sign-in failed" || fmt.Sprint(lines[0].attrs) != "[remote 198.51.100.7]" {
		t.Fatalf("first failure logged as %+v", lines)
	}
	// 300 tries in 3 seconds, then another address a minute later.
	for range 299 {
		c.advance(10 * time.Millisecond)
		try("198.51.100.7", false)
	}
	if len(lines) != 1 {
		t.Fatalf("%d lines for 300 tries in 3s, want the first only: %+v", len(lines), lines)
	}
	c.advance(time.Minute)
	try("203.0.113.9", false)
	if len(lines) != 2 || lines[1].msg != "admin page: failed sign-ins" ||
		fmt.Sprint(lines[1].attrs) != "[failed 6 throttled 294 addresses 2 since 1m3s last_remote 203.0.113.9]" {
		t.Fatalf("summary %+v", lines[1:])
	}
	// A success right after writes out what is pending.
	try("203.0.113.9", false)
	try("192.0.2.1", true)
	last := lines[len(lines)-1]
	if last.msg != "admin page: failed sign-ins" || fmt.Sprint(last.attrs[:2]) != "[failed 1]" {
		t.Fatalf("line before the success: %+v", last)
	}
	t.Logf("%d lines, e.g. %s %v", len(lines), last.msg, last.attrs)
}
