package admin

// Failed sign-ins are slowed per source address: a few are free, then each
// further failure makes the address wait longer before its next try. It is
// a delay, never a lock-out: once it has passed, the right token from that
// address is accepted, so an attacker who shares the operator's address
// can slow the operator's sign-in but not forbid it — and the JSON API,
// which takes the token as a Bearer header, is not throttled at all.

import (
	"log/slog"
	"net/netip"
	"sync"
	"time"
)

// ThrottleOptions tune the sign-in throttle. The zero value is the policy
// the gateway uses.
type ThrottleOptions struct {
	// Free is how many failures an address may have before it must wait.
	// If Free <= 0, 5.
	Free int
	// Delay is the wait after the Free-th failure; it doubles with each
	// further failure. If Delay <= 0, 1s.
	Delay time.Duration
	// MaxDelay caps the wait. If MaxDelay <= 0, 5m.
	MaxDelay time.Duration
	// Forget is how long after its last failure (and its wait) an
	// address's record is dropped. If Forget <= 0, 15m.
	Forget time.Duration
	// MaxAddrs bounds the addresses tracked; beyond it the one failed
	// longest ago is dropped. If MaxAddrs <= 0, 10000.
	MaxAddrs int
	// ReportEvery is how often failed sign-ins are logged: the first
	// after a quiet spell at once, then one summary line per period at
	// most. If ReportEvery <= 0, 1m.
	ReportEvery time.Duration
}

func (o ThrottleOptions) withDefaults() ThrottleOptions {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if o.Free <= 0 {
		o.Free = 5
	}
	def(&o.Delay, time.Second)
	def(&o.MaxDelay, 5*time.Minute)
	def(&o.Forget, 15*time.Minute)
	if o.MaxAddrs <= 0 {
		o.MaxAddrs = 10000
	}
	def(&o.ReportEvery, time.Minute)
	return o
}

// throttle is the sign-in throttle.
type throttle struct {
	o   ThrottleOptions
	now func() time.Time

	mu    sync.Mutex
	addrs map[string]*throttled

	// Since the last log line: failures and refusals, and from how many
	// addresses (counted up to MaxAddrs).
	lastLine time.Time
	failed   int
	refused  int
	from     map[string]struct{}
}

// throttled is what is known of one address.
type throttled struct {
	failures int       // since its last success, or since it was forgotten
	pending  int       // attempts begun and not yet ended
	last     time.Time // its last failure
	until    time.Time // it must wait until then
}

func newThrottle(o ThrottleOptions, now func() time.Time) *throttle {
	return &throttle{o: o.withDefaults(), now: now, addrs: map[string]*throttled{}, from: map[string]struct{}{}}
}

// throttleKey is the address a client is throttled as: its IP, or for
// IPv6 its /64, since one host commonly holds a whole /64.
func throttleKey(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	if a.Is6() && !a.Is4In6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.Unmap().String()
}

// logLine is a line for the log, decided under the lock, written outside.
type logLine struct {
	msg   string
	attrs []any
}

func (l logLine) write(log *slog.Logger) {
	if l.msg != "" {
		log.Warn(l.msg, l.attrs...)
	}
}

func (e *throttled) forgotten(now time.Time, forget time.Duration) bool {
	return e.pending == 0 && !now.Before(e.until) && now.Sub(e.last) >= forget
}

// entry returns addr's record, making one (and room for it) if need be.
func (t *throttle) entry(addr string, now time.Time) *throttled {
	if e, ok := t.addrs[addr]; ok {
		if !e.forgotten(now, t.o.Forget) {
			return e
		}
		delete(t.addrs, addr)
	}
	if len(t.addrs) >= t.o.MaxAddrs {
		var oldest string
		for k, e := range t.addrs {
			if e.forgotten(now, t.o.Forget) {
				delete(t.addrs, k)
				continue
			}
			if oldest == "" || e.last.Before(t.addrs[oldest].last) {
				oldest = k
			}
		}
		if len(t.addrs) >= t.o.MaxAddrs {
			delete(t.addrs, oldest)
		}
	}
	e := &throttled{}
	t.addrs[addr] = e
	return e
}

// begin reserves a sign-in attempt from addr, which end must settle; or,
// when addr must wait, says how long, and ok is false.
func (t *throttle) begin(addr string) (wait time.Duration, ok bool, line logLine) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(addr, now)
	switch {
	case now.Before(e.until):
		wait = e.until.Sub(now)
	case e.failures+e.pending >= t.o.Free && e.pending > 0:
		// Past the free tries, one attempt at a time: parallel guesses
		// would otherwise all be tried before the first failure counted.
		wait = t.o.Delay
	default:
		e.pending++
		return 0, true, logLine{}
	}
	t.refused++
	t.note(addr)
	return wait, false, t.report(now, addr, false)
}

// end settles an attempt begin allowed: right says whether the token was
// right. A right one forgets addr's failures; a wrong one may make addr
// wait.
func (t *throttle) end(addr string, right bool) logLine {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(addr, now) // dropped meanwhile to make room: start again
	e.pending = max(e.pending-1, 0)
	if right {
		if e.pending == 0 {
			delete(t.addrs, addr)
		} else {
			e.failures, e.until = 0, time.Time{}
		}
		return t.report(now, addr, true)
	}
	e.failures++
	e.last = now
	if n := e.failures - t.o.Free; n >= 0 {
		d := t.o.MaxDelay
		if n < 30 && t.o.Delay<<n > 0 && t.o.Delay<<n < d {
			d = t.o.Delay << n
		}
		e.until = now.Add(d)
	}
	t.failed++
	t.note(addr)
	return t.report(now, addr, false)
}

// note counts addr among the addresses reported next.
func (t *throttle) note(addr string) {
	if len(t.from) < t.o.MaxAddrs {
		t.from[addr] = struct{}{}
	}
}

// report decides the log line, if any, for an event from addr: the first
// failure after a quiet spell is logged at once; after that, the first
// event a ReportEvery or more after the last line sums up what happened
// since (there is no timer: an attack that stops is summed up by the next
// event). A success writes out what is pending, so a sign-in is never
// preceded by an unreported attack.
func (t *throttle) report(now time.Time, addr string, success bool) logLine {
	pending := t.failed + t.refused
	if pending == 0 {
		return logLine{}
	}
	quiet := t.lastLine.IsZero() || now.Sub(t.lastLine) >= t.o.ReportEvery
	if !quiet && !success {
		return logLine{}
	}
	var l logLine
	if pending == 1 && t.failed == 1 && !success {
		l = logLine{msg: "admin page: sign-in failed", attrs: []any{"remote", addr}}
	} else {
		attrs := []any{"failed", t.failed, "throttled", t.refused, "addresses", len(t.from)}
		if !t.lastLine.IsZero() {
			attrs = append(attrs, "since", now.Sub(t.lastLine).Round(time.Second).String())
		}
		if !success {
			attrs = append(attrs, "last_remote", addr)
		}
		l = logLine{msg: "admin page: failed sign-ins", attrs: attrs}
	}
	t.lastLine, t.failed, t.refused = now, 0, 0
	clear(t.from)
	return l
}
