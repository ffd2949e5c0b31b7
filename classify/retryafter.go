package classify

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxRetryAfter caps any wait an upstream asks for.
const MaxRetryAfter = 24 * time.Hour

// ParseRetryAfter reads how long the upstream asked us to wait, from the
// first of these that holds a usable value:
//
//   - Retry-After: delta-seconds ("30", also a decimal like "1.5") or an
//     HTTP-date (http.ParseTime), relative to now; a date in the past is 0.
//   - retry-after-ms: milliseconds (OpenAI sends it).
//   - x-ratelimit-reset-requests and x-ratelimit-reset-tokens, in OpenAI's
//     duration form ("1s", "6m0s", "20ms", "1m30.5s", "0.5s"; bare seconds
//     are accepted too): the larger of the two present.
//
// A negative or unparseable value is ignored (the next header is tried); a
// wait above 24h is capped at 24h. ok is false when no header helped.
func ParseRetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	return parseRetryAfter(h, now, true)
}

func parseRetryAfter(h http.Header, now time.Time, resetHeaders bool) (time.Duration, bool) {
	if len(h) == 0 {
		return 0, false
	}
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if d, ok := parseDecimal(v, time.Second); ok {
			return d, true
		}
		if t, err := http.ParseTime(v); err == nil {
			return capWait(t.Sub(now)), true
		}
	}
	if d, ok := parseDecimal(strings.TrimSpace(h.Get("Retry-After-Ms")), time.Millisecond); ok {
		return d, true
	}
	if !resetHeaders {
		return 0, false
	}
	req, okReq := parseResetDuration(h.Get("X-Ratelimit-Reset-Requests"))
	tok, okTok := parseResetDuration(h.Get("X-Ratelimit-Reset-Tokens"))
	if !okReq && !okTok {
		return 0, false
	}
	return max(req, tok), true
}

// capWait clamps a wait to [0, MaxRetryAfter].
func capWait(d time.Duration) time.Duration {
	return min(max(d, 0), MaxRetryAfter)
}

// parseDecimal parses digits with an optional fraction ("30", "1.5", ".5",
// "2.") as a count of unit. Signs, exponents, hex, "Inf" and "NaN" — all of
// which strconv.ParseFloat would take — are refused.
func parseDecimal(s string, unit time.Duration) (time.Duration, bool) {
	digits, dots := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c == '.':
			dots++
		default:
			return 0, false
		}
	}
	if digits == 0 || dots > 1 {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && f == 0 {
		// Only a range error can get here, and an underflow rounds to 0.
		return 0, true
	}
	// An overflow gives +Inf with err set, which the cap handles too.
	w := f * float64(unit)
	if w >= float64(MaxRetryAfter) {
		return MaxRetryAfter, true
	}
	return time.Duration(w), true
}

// parseResetDuration parses an x-ratelimit-reset-* value.
func parseResetDuration(s string) (time.Duration, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, false
	}
	if d, ok := parseDecimal(s, time.Second); ok {
		return d, true
	}
	if s[0] == '-' || s[0] == '+' {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, false
	}
	return capWait(d), true
}
