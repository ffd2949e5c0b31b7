package breaker

import "time"

// Status is one breaker as the admin API and page show it. Every count
// says from when it counts.
type Status struct {
	// Name is the upstream's name.
	Name string `json:"name"`
	// Model is the model the breaker is for; "" for an upstream's own
	// breaker (see Covers).
	Model string `json:"model"`
	// Covers says what the breaker counts and refuses: "model" (one
	// model's requests), "connection" (ScopeModel's upstream-wide breaker:
	// the connection-level failures of every model, and every outcome of
	// requests that name no model; open, it refuses every model of the
	// upstream) or "upstream" (ScopeUpstream's one breaker: everything).
	Covers string `json:"covers"`
	State  State  `json:"state"`
	// Forced reports that an operator forced the breaker open.
	Forced bool `json:"forced"`
	// StateSince is when the breaker entered State (when it was made, if
	// it never changed). An open breaker turns half-open at ProbeAt on a
	// timer, whether or not a request or a look comes.
	StateSince time.Time `json:"state_since"`
	// CountsSince is when Requests, TotalSuccesses and TotalFailures
	// start counting: the last state change or the start of the current
	// Interval, whichever is later.
	CountsSince time.Time `json:"counts_since"`
	// Requests, TotalSuccesses and TotalFailures count the requests that
	// completed since CountsSince. Requests is their sum: excluded requests
	// and requests in flight are not counted.
	Requests       uint32 `json:"requests"`
	TotalSuccesses uint32 `json:"total_successes"`
	TotalFailures  uint32 `json:"total_failures"`
	// Rejected counts the requests the breaker refused since StateSince.
	Rejected uint32 `json:"rejected"`
	// ConsecutiveSuccesses and ConsecutiveFailures are the current runs
	// since StateSince; they are zero while open.
	ConsecutiveSuccesses uint32 `json:"consecutive_successes"`
	ConsecutiveFailures  uint32 `json:"consecutive_failures"`
	// LastFailureClass and LastFailureAt describe the latest Failure
	// reported. They survive ForceClose: they are history, not counts.
	LastFailureClass string     `json:"last_failure_class,omitempty"`
	LastFailureAt    *time.Time `json:"last_failure_at,omitempty"`
	// OpenedBy is what last opened the breaker. It is history: kept across
	// the state changes that follow and across ForceClose, until the next
	// opening replaces it.
	OpenedBy *Trip `json:"opened_by,omitempty"`
	// OpenedAt is when the breaker last opened (or was forced open); set
	// while open or half-open.
	OpenedAt *time.Time `json:"opened_at,omitempty"`
	// ProbeAt is when an open breaker turns half-open and lets a probe
	// through; unset when the breaker is not open or is forced open.
	ProbeAt *time.Time `json:"probe_at,omitempty"`
	// LastProbe is the outcome of the last request a half-open breaker let
	// through; history, like OpenedBy.
	LastProbe *Probe `json:"last_probe,omitempty"`
}

// Trip is what opened a breaker.
type Trip struct {
	// Reason is "consecutive_failures", "failure_ratio", "probe_failed"
	// (a half-open probe failed) or "forced" (an operator).
	Reason string `json:"reason"`
	// Failures is how many failures tripped it: the consecutive run, the
	// failures of the interval (out of Requests) for failure_ratio, 1 for
	// a failed probe, 0 when forced.
	Failures uint32 `json:"failures"`
	// Requests is the interval's completed requests, for failure_ratio.
	Requests uint32 `json:"requests,omitempty"`
	// Class is the class of the failure that tripped it.
	Class string `json:"class,omitempty"`
	// At is when it opened.
	At time.Time `json:"at"`
}

// Probe is the outcome of a request a half-open breaker let through.
type Probe struct {
	At time.Time `json:"at"`
	// Result is "success" or "failure".
	Result string `json:"result"`
	// Class is the failure's class; empty for a success.
	Class string `json:"class,omitempty"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
