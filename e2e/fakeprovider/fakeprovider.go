// Package fakeprovider is test support: a scripted fake provider for tests
// and the load tool; not part of the product.
//
// Its Server is an OpenAI-compatible upstream — the simulated provider of
// `gateway -demo` (package cmd/gateway/demo), which generates the answers
// of /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses
// (and the responses it stored) and /v1/models — that can be told,
// request by request, to fail in the ways real providers fail (error
// statuses, hangs, connection resets, truncated bodies, streams that stop,
// stall or end in an error event), and that records what it saw.
//
// It serves two callers: the e2e and gateway tests, which start it with
// httptest.NewServer, script it per test and assert on what it recorded;
// and the load tool, which uses Options.Latency, Options.ChunkDelay and
// Options.ContentBytes to shape its answers.
//
// Every wait (latency, chunk delay, hang, stall) selects on the request's
// context and on Close, so no handler outlives its client or the Server.
package fakeprovider

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/llmgate/llmgate/cmd/gateway/demo"
)

// maxPaths bounds how many distinct paths Calls counts separately.
const maxPaths = 1024

// Options shapes a Server's generated answers (each field as in
// demo.Options) and what it records. The zero value is a healthy, instant
// upstream that keeps every request it records.
type Options struct {
	// Models are listed by GET /v1/models. If nil, gpt-4o-mini, gpt-4o and
	// text-embedding-3-small are; with DemoModels, the demo models follow.
	// Completion and embedding requests are answered for any model name.
	Models []string

	// DemoModels makes the demo models (see demo.Demos: demo-flaky,
	// demo-ratelimited, demo-down, demo-filtered, demo-empty, demo-cut)
	// fail as their names say. A request for one of them is answered by its
	// script and consumes no Step; other models are answered as before. Off
	// by default, so that a test scripting the Server gets what it queued
	// whatever the model.
	DemoModels bool
	// DemoOutage is how long demo-down answers 503, counted from the first
	// request for it. If DemoOutage <= 0, demo.DefaultDemoOutage (30s)
	// is used.
	DemoOutage time.Duration

	// Latency is the delay before answering each request. A Step's Delay
	// overrides it. If Latency <= 0, there is none.
	Latency time.Duration

	// ChunkDelay is the delay between the events of a generated stream.
	// A Step's ChunkDelay overrides it. If ChunkDelay <= 0, there is none.
	ChunkDelay time.Duration

	// ContentBytes is the approximate size of a generated completion's
	// content: the canned sentence is padded with filler up to this many
	// bytes. If ContentBytes <= 0, the canned sentence alone is used.
	ContentBytes int

	// Chunks is how many content chunks a generated stream carries (besides
	// the role, finish and usage chunks). If Chunks <= 0, the content is
	// split into ~64-byte chunks when ContentBytes > 0, and into 5 otherwise.
	Chunks int

	// APIKey, if set, is required as "Authorization: Bearer <APIKey>";
	// other requests get 401 with code invalid_api_key and consume no Step.
	APIKey string

	// BackgroundPolls is how many GETs of a background response (a
	// Responses request with background: true, answered "queued") answer
	// in_progress before it is done. If BackgroundPolls <= 0, 1 is used:
	// the first GET sees in_progress, the second the done response.
	BackgroundPolls int

	// MaxModelLen, if > 0, makes the models look served by vLLM: GET
	// /v1/models and /v1/models/{id} give each one vLLM's extra fields,
	// root, parent (null) and max_model_len (this value), so tests can
	// check that a gateway relays vendor fields.
	MaxModelLen int

	// KeepRequests is how many of the most recent requests Requests returns.
	// If KeepRequests == 0, all are kept (what tests want); if it is
	// negative, none are (what the load tool wants, so memory stays
	// flat). Calls and WaitForCalls count every request regardless.
	KeepRequests int
}

// Step scripts the answer to one POST request. The zero Step is a normal
// generated answer. See demo.Step for its fields.
type Step = demo.Step

func cloneStep(st Step) Step {
	st.Header = maps.Clone(st.Header)
	return st
}

// Request is what the Server recorded about one request.
type Request = demo.Request

func cloneRequest(r Request) Request {
	r.Header = r.Header.Clone()
	r.Body = slices.Clone(r.Body)
	r.Step = cloneStep(r.Step)
	return r
}

// Server is the fake upstream. It is safe for concurrent use; create it
// with New.
type Server struct {
	opts   Options
	engine *demo.Server // generates the answers; s is its Script

	mu      sync.Mutex
	queue   []Step
	def     Step
	reqs    []Request
	total   int
	perPath map[string]int
	// arrived is created by a waiting WaitForCalls and closed (then
	// forgotten) by the next arrival, so waiters wake without polling and
	// nobody pays for it when nobody waits.
	arrived chan struct{}
}

// New returns a Server answering as o says.
func New(o Options) *Server {
	s := &Server{opts: o, perPath: make(map[string]int)}
	s.engine = demo.New(demo.Options{
		Models:          o.Models,
		DemoModels:      o.DemoModels,
		DemoOutage:      o.DemoOutage,
		Latency:         o.Latency,
		ChunkDelay:      o.ChunkDelay,
		ContentBytes:    o.ContentBytes,
		Chunks:          o.Chunks,
		APIKey:          o.APIKey,
		BackgroundPolls: o.BackgroundPolls,
		MaxModelLen:     o.MaxModelLen,
		Script:          (*script)(s),
	})
	return s
}

// ServeHTTP records the request, then answers it as its Step says.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.engine.ServeHTTP(w, r)
}

// Enqueue appends steps to the script: each scripted POST (chat
// completions, completions, embeddings, responses) consumes the next one,
// in order.
func (s *Server) Enqueue(steps ...Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range steps {
		s.queue = append(s.queue, cloneStep(st))
	}
}

// SetDefault sets the Step used when the queue is empty:
// SetDefault(Step{Status: 503}) takes the upstream down, SetDefault(Step{})
// makes it healthy again.
func (s *Server) SetDefault(st Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.def = cloneStep(st)
}

// ClearQueue drops the steps not yet consumed.
func (s *Server) ClearQueue() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = nil
}

// Reset forgets the recorded requests and counts (the demo models' too)
// and the stored Responses, drops the queue and makes the default Step
// healthy again.
func (s *Server) Reset() {
	s.engine.Reset()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = nil
	s.def = Step{}
	s.reqs = nil
	s.total = 0
	s.perPath = make(map[string]int)
}

// Requests returns copies of the recorded requests, in arrival order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.reqs
	if k := s.opts.KeepRequests; k > 0 && len(kept) > k {
		kept = kept[len(kept)-k:]
	}
	out := make([]Request, len(kept))
	for i, r := range kept {
		out[i] = cloneRequest(r)
	}
	return out
}

// Calls reports how many requests reached path, or all paths if path is "".
// Only the first 1024 distinct paths are counted separately.
func (s *Server) Calls(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if path == "" {
		return s.total
	}
	return s.perPath[path]
}

// WaitForCalls blocks until at least n requests have arrived since New or
// the last Reset (requests are counted on arrival, before any delay or
// hang), or until ctx is done.
func (s *Server) WaitForCalls(ctx context.Context, n int) error {
	for {
		s.mu.Lock()
		if s.total >= n {
			s.mu.Unlock()
			return nil
		}
		if s.arrived == nil {
			s.arrived = make(chan struct{})
		}
		arrived, seen := s.arrived, s.total
		s.mu.Unlock()

		select {
		case <-arrived:
		case <-ctx.Done():
			return fmt.Errorf("wait for %d calls, saw %d: %w", n, seen, context.Cause(ctx))
		}
	}
}

// Close releases every request that is delayed, hanging or stalled: its
// connection is dropped without (the rest of) a response. Later waits end
// at once the same way. Call it before closing the http.Server (or
// httptest.Server) so shutdown does not wait on a client that never gives
// up.
func (s *Server) Close() {
	s.engine.Close()
}

// script is the Server as the engine's demo.Script: its methods are the
// engine's to call, not the tests'.
type script Server

// Next returns the Step for a scripted request.
func (s *script) Next() Step {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		return s.def
	}
	st := s.queue[0]
	s.queue[0] = Step{}
	s.queue = s.queue[1:]
	return st
}

// Arrived records r.
func (s *script) Arrived(r Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total++
	// Bound the per-path counts: a fake serving a long load run must not
	// grow a map entry for every path it is sent.
	if _, ok := s.perPath[r.Path]; ok || len(s.perPath) < maxPaths {
		s.perPath[r.Path]++
	}
	if k := s.opts.KeepRequests; k >= 0 {
		s.reqs = append(s.reqs, r)
		// Trim by halves so keeping the last k costs O(1) per request.
		if k > 0 && len(s.reqs) >= 2*k {
			s.reqs = slices.Clone(s.reqs[len(s.reqs)-k:])
		}
	}
	if s.arrived != nil {
		close(s.arrived)
		s.arrived = nil
	}
}
