// Package simupstream is a scriptable, OpenAI-compatible upstream: a real
// http.Handler that answers /v1/chat/completions, /v1/completions,
// /v1/embeddings, /v1/responses (and the responses it stored) and
// /v1/models with generated answers, and can be told, request by request,
// to fail in the ways real providers fail (error statuses, hangs,
// connection resets, truncated bodies, streams that stop, stall or end in
// an error event).
//
// It serves three callers: the e2e tests, which start it with
// httptest.NewServer, script it per test and assert on what it recorded;
// `gateway -demo`, which serves it in-process so a newcomer without an API
// key sees a completion, and with Options.DemoModels a retry, an open
// breaker and a dead letter (demo.go); and the load tool, which uses
// Options.Latency, Options.ChunkDelay and Options.ContentBytes to shape its
// answers.
//
// Every wait (latency, chunk delay, hang, stall) selects on the request's
// context and on Close, so no handler outlives its client or the Server.
package fakeprovider

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxPaths bounds how many distinct paths Calls counts separately.
const maxPaths = 1024

var defaultModels = []string{"gpt-4o-mini", "gpt-4o", "text-embedding-3-small"}

// Options shapes a Server's generated answers. The zero value is a healthy,
// instant upstream that keeps every request it records.
type Options struct {
	// Models are listed by GET /v1/models. If nil, gpt-4o-mini, gpt-4o and
	// text-embedding-3-small are; with DemoModels, the demo models follow.
	// Completion and embedding requests are answered for any model name.
	Models []string

	// DemoModels makes the demo models (see Demos: demo-flaky,
	// demo-ratelimited, demo-down, demo-filtered, demo-empty, demo-cut)
	// fail as their names say. A request for one of them is answered by its
	// script and consumes no Step; other models are answered as before. Off
	// by default, so that a test scripting the Server gets what it queued
	// whatever the model.
	DemoModels bool
	// DemoOutage is how long demo-down answers 503, counted from the first
	// request for it. If DemoOutage <= 0, DefaultDemoOutage (30s) is used.
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
	// negative, none are (what the demo and the load tool want, so memory
	// stays flat). Calls and WaitForCalls count every request regardless.
	KeepRequests int
}

// Step scripts the answer to one POST request. The zero Step is a normal
// generated answer.
type Step struct {
	// Status 0 or 200 gives a generated successful answer; any other status
	// gives an error response (or Body, if set).
	Status int
	// Header holds extra response headers, e.g. "Retry-After": "1". They
	// are set last, so they override the Server's own.
	Header map[string]string
	// Body is sent verbatim instead of a generated body. If Body is empty and
	// Status >= 400, an OpenAI error object is generated from ErrType and
	// ErrCode. Its Content-Type is application/json, or text/event-stream
	// when the request asked to stream and Status < 400, unless Header says
	// otherwise.
	Body    string
	ErrType string // error.type of a generated error; if empty, derived from Status
	ErrCode string // error.code of a generated error; if empty, derived from Status

	// Delay is the wait before writing headers. If Delay <= 0,
	// Options.Latency is used.
	Delay time.Duration
	// Hang never answers: the request blocks until the client goes away
	// (or Close is called).
	Hang bool
	// Reset closes the TCP connection abruptly after Delay, with no
	// response: the client sees ECONNRESET or EOF.
	Reset bool
	// ResetAfter, if > 0, writes the headers and this many body bytes
	// (Content-Length announces the whole body), then resets the
	// connection, so the client reads a truncated body.
	ResetAfter int

	// FinishReason is the finish_reason of a generated answer. If empty,
	// "stop". "tool_calls" makes a chat answer a call of the request's first
	// tool (or of "lookup") instead of content.
	FinishReason string
	// Empty makes a generated answer's content "" (and no tool calls).
	Empty bool

	// ChunkDelay is the wait between stream events. If ChunkDelay <= 0,
	// Options.ChunkDelay is used.
	ChunkDelay time.Duration
	// StopAfter, if > 0, ends a stream cleanly after this many events (the
	// first being the role chunk), with no [DONE] and Connection: close.
	StopAfter int
	// StallAfter, if > 0, stops sending after this many events and blocks
	// until the client goes away. If both are set, the smaller wins.
	StallAfter int
	// ErrorInStream ends a stream, after its content chunks, with an event
	// carrying an OpenAI error object (from ErrType and ErrCode, default
	// server_error) instead of the finish chunk and [DONE]. A Responses
	// stream ends with an "error" typed event instead of its done events.
	ErrorInStream bool
	// Failed makes a Responses answer a failed response (status "failed",
	// error.code from ErrCode, default server_error), sent with HTTP 200;
	// streamed, it ends with response.failed after the text deltas. Other
	// endpoints ignore it.
	Failed bool
}

func (st Step) clone() Step {
	st.Header = maps.Clone(st.Header)
	return st
}

// Request is what the Server recorded about one request.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte    // exactly as received
	At     time.Time // arrival, before any delay
	Step   Step      // the Step it consumed; zero for requests that consume none
}

func (r Request) clone() Request {
	r.Header = r.Header.Clone()
	r.Body = slices.Clone(r.Body)
	r.Step = r.Step.clone()
	return r
}

// Server is the fake upstream. It is safe for concurrent use; create it
// with New.
type Server struct {
	opts   Options
	models []string
	seq    atomic.Uint64 // numbers ids, so two answers never share one

	done      chan struct{} // closed by Close
	closeOnce sync.Once

	mu      sync.Mutex
	queue   []Step
	def     Step
	reqs    []Request
	total   int
	perPath map[string]int
	demo    demoState
	// stored holds the Responses kept for GET /v1/responses/{id}, at most
	// maxStoredResponses; storedOrder is their creation order, for
	// eviction (it may name ids already deleted).
	stored      map[string]*storedResponse
	storedOrder []string
	// arrived is created by a waiting WaitForCalls and closed (then
	// forgotten) by the next arrival, so waiters wake without polling and
	// nobody pays for it when nobody waits.
	arrived chan struct{}
}

// New returns a Server answering as o says.
func New(o Options) *Server {
	models := slices.Clone(o.Models)
	if o.Models == nil {
		models = slices.Clone(defaultModels)
	}
	if o.DemoModels {
		models = append(models, demoModelNames()...)
	}
	return &Server{
		opts:    o,
		models:  models,
		done:    make(chan struct{}),
		perPath: make(map[string]int),
	}
}

// Enqueue appends steps to the script: each scripted POST (chat
// completions, completions, embeddings, responses) consumes the next one,
// in order.
func (s *Server) Enqueue(steps ...Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range steps {
		s.queue = append(s.queue, st.clone())
	}
}

// SetDefault sets the Step used when the queue is empty:
// SetDefault(Step{Status: 503}) takes the upstream down, SetDefault(Step{})
// makes it healthy again.
func (s *Server) SetDefault(st Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.def = st.clone()
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
	s.mu.Lock()
	defer s.mu.Unlock()
	s.demo = demoState{}
	s.stored, s.storedOrder = nil, nil
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
		out[i] = r.clone()
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
	s.closeOnce.Do(func() { close(s.done) })
}

// next returns the Step for a scripted request.
func (s *Server) next() Step {
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

// record stores r and returns its arrival number since the last Reset.
func (s *Server) record(r Request) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total++
	// Bound the per-path counts: a demo server on an open port must not
	// grow a map entry for every path a scanner tries.
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
	return s.total
}

func (s *Server) authorized(r *http.Request) bool {
	if s.opts.APIKey == "" {
		return true
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(token), []byte(s.opts.APIKey)) == 1
}

// errAbort means the connection must be dropped without (the rest of) a
// response; ServeHTTP turns it into panic(http.ErrAbortHandler).
var errAbort = errors.New("simupstream: abort connection")

// pause waits d, or until the client goes away or the Server is closed.
func (s *Server) pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return errAbort
	}
}

// hang blocks until the client goes away or the Server is closed.
func (s *Server) hang(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return errAbort
	}
}
