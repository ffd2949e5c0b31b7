// Package demo is the simulated OpenAI-compatible provider of `gateway
// -demo`: a real http.Handler that answers /v1/chat/completions,
// /v1/completions, /v1/embeddings, /v1/responses (and the responses it
// stored) and /v1/models with generated answers — structured outputs
// included — and whose demo models (demo.go) fail on purpose, so a
// newcomer without an API key sees a completion, a retry, an open breaker
// and a dead letter.
//
// Each answer follows a Step, which can also say how to fail the way real
// providers fail (error statuses, hangs, connection resets, truncated
// bodies, streams that stop, stall or end in an error event). The demo
// models pick their own Steps; a Script (Options.Script) gives the Steps of
// every other request. The scripted fake that tests and the load tool use,
// package e2e/fakeprovider, is such a Script; this package never imports
// it.
//
// Every wait (latency, chunk delay, hang, stall) selects on the request's
// context and on Close, so no handler outlives its client or the Server.
package demo

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

var defaultModels = []string{"gpt-4o-mini", "gpt-4o", "text-embedding-3-small"}

// Options shapes a Server's generated answers. The zero value is a healthy,
// instant upstream whose requests all get the zero Step.
type Options struct {
	// Models are listed by GET /v1/models. If nil, gpt-4o-mini, gpt-4o and
	// text-embedding-3-small are; with DemoModels, the demo models follow.
	// Completion and embedding requests are answered for any model name.
	Models []string

	// DemoModels makes the demo models (see Demos: demo-flaky,
	// demo-ratelimited, demo-down, demo-filtered, demo-empty, demo-cut)
	// fail as their names say. A request for one of them is answered by its
	// script and consumes no Step of the Script; other models are answered
	// as before. Off by default, so that a test scripting the Server gets
	// what it queued whatever the model.
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

	// Script, if set, gives the Step of each request that consumes one and
	// is told of every request. If nil, every request not for a demo model
	// gets the zero Step (a generated answer) and nothing is recorded,
	// which is what `gateway -demo` wants.
	Script Script
}

// A Script scripts a Server's answers and sees its requests: the scripted
// fake of package e2e/fakeprovider is one.
type Script interface {
	// Next returns the Step for an authorized POST to a generating
	// endpoint (chat completions, completions, embeddings, responses) that
	// is not for a demo model.
	Next() Step
	// Arrived is told of every request on arrival, before any delay or
	// hang, with the Step it got (zero for requests that consume none).
	// r.Header is a copy and r.Body is never written to: it may keep both.
	Arrived(r Request)
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

// Request is what a Server tells its Script about one request.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte    // exactly as received
	At     time.Time // arrival, before any delay
	Step   Step      // the Step it consumed; zero for requests that consume none
}

// Server is the simulated upstream. It is safe for concurrent use; create
// it with New.
type Server struct {
	opts   Options
	models []string
	seq    atomic.Uint64 // numbers ids, so two answers never share one
	// calls numbers the requests since New or the last Reset, for the
	// rate-limit headers.
	calls atomic.Int64

	done      chan struct{} // closed by Close
	closeOnce sync.Once

	mu   sync.Mutex
	demo demoState
	// stored holds the Responses kept for GET /v1/responses/{id}, at most
	// maxStoredResponses; storedOrder is their creation order, for
	// eviction (it may name ids already deleted).
	stored      map[string]*storedResponse
	storedOrder []string
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
		opts:   o,
		models: models,
		done:   make(chan struct{}),
	}
}

// Reset forgets the demo models' counts, the stored Responses and the
// request count of the rate-limit headers. A Script's own state is the
// Script's to reset.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.demo = demoState{}
	s.stored, s.storedOrder = nil, nil
	s.calls.Store(0)
}

// Close releases every request that is delayed, hanging or stalled: its
// connection is dropped without (the rest of) a response. Later waits end
// at once the same way. Call it before closing the http.Server (or
// httptest.Server) so shutdown does not wait on a client that never gives
// up.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.done) })
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
var errAbort = errors.New("demo: abort connection")

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
