package demo

// The demo models. With Options.DemoModels a request for one of them is
// answered by its own script below, not by Options.Script, so that
// `gateway -demo` shows a retry, an open breaker and a dead letter with
// nobody scripting the Server. They answer the same way to whoever asks: the state they
// keep (a count per request body, the outage's start) is the Server's.

import (
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"time"
)

// The demo models' names.
const (
	DemoFlaky       = "demo-flaky"
	DemoRateLimited = "demo-ratelimited"
	DemoDown        = "demo-down"
	DemoFiltered    = "demo-filtered"
	DemoEmpty       = "demo-empty"
	DemoCut         = "demo-cut"
)

// DefaultDemoOutage is how long demo-down is down when Options.DemoOutage
// is not set.
const DefaultDemoOutage = 30 * time.Second

// Demo describes one demo model, for a banner or a help text.
type Demo struct {
	Model string
	// Does says what the model does, in a few words.
	Does string
	// Stream: the model shows its failure on a streamed request.
	Stream bool
}

// Demos lists the demo models in the order a tour would visit them.
// outage is how long demo-down is down (Options.DemoOutage).
func Demos(outage time.Duration) []Demo {
	return []Demo{
		{Model: DemoFlaky, Does: "503 twice, then an answer (counted per request body)"},
		{Model: DemoRateLimited, Does: "429 with Retry-After: 1, then an answer"},
		{Model: DemoDown, Does: "503 for " + demoOutage(outage).String() + " from its first request, then up for good"},
		{Model: DemoFiltered, Does: "an answer with finish_reason content_filter"},
		{Model: DemoEmpty, Does: "an answer with empty content"},
		{Model: DemoCut, Does: "a stream cut midway, with no [DONE]", Stream: true},
	}
}

func demoOutage(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultDemoOutage
	}
	return d
}

// maxDemoBodies bounds the per-body counts of demo-flaky and
// demo-ratelimited. When it is reached the counts start over, which at
// worst lets one request fail once more or once less than its script says.
const maxDemoBodies = 4096

// demoState is what the demo scripts remember, under Server.mu.
type demoState struct {
	// calls counts the requests per body (its SHA-256) of the models whose
	// script cycles: the gateway retries a request with the same body, so
	// one client request walks through the whole cycle, and a new prompt
	// starts a cycle of its own whatever else is in flight.
	calls map[[32]byte]int
	// downFrom is demo-down's first request; zero until it comes.
	downFrom time.Time
}

// demoStep returns the Step of a request for a demo model, and false for
// any other request.
func (s *Server) demoStep(body []byte) (Step, bool) {
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	if !s.opts.DemoModels || json.Unmarshal(body, &req) != nil {
		return Step{}, false
	}
	switch req.Model {
	case DemoFlaky:
		// The gateway's three attempts (retry.max_attempts' default) meet
		// 503, 503, then an answer.
		if s.demoCall(body)%3 != 0 {
			return Step{Status: http.StatusServiceUnavailable}, true
		}
		return Step{}, true
	case DemoRateLimited:
		if s.demoCall(body)%2 != 0 {
			return Step{Status: http.StatusTooManyRequests, Header: map[string]string{"Retry-After": "1"}}, true
		}
		return Step{}, true
	case DemoDown:
		if s.demoDown() {
			return Step{Status: http.StatusServiceUnavailable}, true
		}
		return Step{}, true
	case DemoFiltered:
		return Step{FinishReason: "content_filter"}, true
	case DemoEmpty:
		return Step{Empty: true}, true
	case DemoCut:
		if req.Stream {
			// The role chunk and two content chunks, then the end.
			return Step{StopAfter: 3}, true
		}
		// Not streamed: the JSON body is cut off after its first bytes.
		return Step{ResetAfter: 40}, true
	}
	return Step{}, false
}

// demoCall counts a request with body and returns its number, from 1.
func (s *Server) demoCall(body []byte) int {
	sum := sha256.Sum256(body)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.demo.calls == nil || (len(s.demo.calls) >= maxDemoBodies && s.demo.calls[sum] == 0) {
		s.demo.calls = make(map[[32]byte]int)
	}
	s.demo.calls[sum]++
	return s.demo.calls[sum]
}

// demoDown reports whether demo-down is down: for Options.DemoOutage from
// its first request. It comes back once and for all, so that the breaker
// that opened can close again and a replay succeed; a new outage needs a
// new Server.
func (s *Server) demoDown() bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.demo.downFrom.IsZero() {
		s.demo.downFrom = now
	}
	return now.Sub(s.demo.downFrom) < demoOutage(s.opts.DemoOutage)
}

// demoModelNames are the names GET /v1/models adds with Options.DemoModels.
func demoModelNames() []string {
	var names []string
	for _, d := range Demos(0) {
		names = append(names, d.Model)
	}
	return names
}
