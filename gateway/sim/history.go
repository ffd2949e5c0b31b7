package sim

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// History is everything a run recorded: what each client sent and saw,
// every attempt the provider served, and every store call with the fault
// it got. The checker reads only this (and the store's final state).
type History struct {
	mu    sync.Mutex
	ops   []*Op
	runs  map[int]*Run
	calls []*StoreCall
	final map[string]*Final
	start time.Time
}

func newHistory() *History {
	return &History{runs: map[int]*Run{}, final: map[string]*Final{}, start: time.Now()}
}

// Op is one client request and what the client saw.
type Op struct {
	ID      int
	Key     string
	Variant int    // 0: the key's body; 1: another body under the same key
	Stream  bool   // the body asks for a stream
	Big     bool   // the answer is over the record limits
	Mode    string // normal, leave, deadline, dup, final
	Start   time.Duration
	End     time.Duration
	Status  int
	// Body is every byte the client read, kept only for a stream that did
	// not complete (the checker compares prefixes); Hash and Size are of
	// every answer.
	Body []byte
	Hash [32]byte
	Size int
	// Complete: a 2xx JSON body read whole, or a stream that ended with
	// [DONE] and no error event.
	Complete   bool
	ErrorEvent bool   // the stream carried an error event
	ClientCut  bool   // the client itself left (Mode leave) before the end
	Code       string // the error code, for an error response
	ReadErr    string // the connection ended early (not by the client)
	Run        int    // the provider run whose bytes the client saw (0: none)
	Replayed   bool
	Trailer    string // X-Llmgate-Committed
}

// Run is one attempt the provider served.
type Run struct {
	ID       int
	Key      string
	Attempt  int // of this key, from 1
	Behavior string
	// Completed: the provider wrote its whole answer.
	Completed bool
	Hash      [32]byte // of the answer's bytes, when Completed
	Start     time.Duration
	End       time.Duration
	// Via is the first segment of the request's path when it is not "v1":
	// which of several gateways made the call, each given its own base URL.
	Via string
}

// StoreCall is one call of the gateway to its store.
type StoreCall struct {
	Seq     int
	Method  string
	Key     string
	Owner   string
	Fault   string // "" when none
	Err     string
	Applied bool // the call took effect in the store
	// Maybe: the call reached the store and failed there in a way that
	// leaves it unknown whether it took effect (a timeout waiting for the
	// reply).
	Maybe  bool
	Status string // Claim: its status
	Run    int    // Commit: the run its record came from (0: none, a marker)
	Hash   [32]byte
	At     time.Duration
	Took   time.Duration // Commit: how long the call took, fault included
	// Takeover names why a Claim took a key another owner still held.
	Takeover string
}

// Final is a key's state at quiescence, read from the store.
type Final struct {
	State  string // committed, free, in_flight
	Status int
	Run    int
	Hash   [32]byte
	// Expired: an in-flight record whose lease had run out.
	Expired bool
	// Claimable: an in-flight record another request could claim.
	Claimable   bool
	Body        []byte
	Fingerprint string
}

func (h *History) since() time.Duration { return time.Since(h.start) }

func (h *History) addOp(o *Op) {
	h.mu.Lock()
	o.ID = len(h.ops) + 1
	h.ops = append(h.ops, o)
	h.mu.Unlock()
}

func (h *History) addRun(r *Run) {
	h.mu.Lock()
	r.ID = len(h.runs) + 1
	h.runs[r.ID] = r
	h.mu.Unlock()
}

func (h *History) finishRun(r *Run, completed bool, answer []byte) {
	h.mu.Lock()
	r.Completed = completed
	r.End = h.since()
	if completed {
		r.Hash = sha256.Sum256(answer)
	}
	h.mu.Unlock()
}

func (h *History) addCall(c *StoreCall) {
	h.mu.Lock()
	c.Seq = len(h.calls) + 1
	h.calls = append(h.calls, c)
	h.mu.Unlock()
}

// runOf finds the provider run id in bytes a client or the store saw: every
// answer carries "chatcmpl-sim-<run>" in its id.
func runOf(b []byte) int {
	const tag = `"id":"chatcmpl-sim-`
	i := bytes.Index(b, []byte(tag))
	if i < 0 {
		return 0
	}
	b = b[i+len(tag):]
	j := bytes.IndexByte(b, '"')
	if j < 0 {
		return 0
	}
	n, _ := strconv.Atoi(string(b[:j]))
	return n
}

// Describe prints the histories of keys, in time order: what a failure
// report needs to replay the story of each failing key.
func (h *History) Describe(keys []string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "key %s:\n", k)
		type line struct {
			at time.Duration
			s  string
		}
		var lines []line
		for _, o := range h.ops {
			if o.Key == k {
				lines = append(lines, line{o.Start, describeOp(o)})
			}
		}
		for _, r := range h.runs {
			if r.Key == k {
				lines = append(lines, line{r.Start, fmt.Sprintf("provider run %d (attempt %d%s): %s, completed=%v hash=%x, ended %.3fms",
					r.ID, r.Attempt, viaNote(r.Via), r.Behavior, r.Completed, r.Hash[:4], float64(r.End.Microseconds())/1000)})
			}
		}
		for _, c := range h.calls {
			if c.Key == k {
				lines = append(lines, line{c.At, describeCall(c)})
			}
		}
		sort.SliceStable(lines, func(i, j int) bool { return lines[i].at < lines[j].at })
		for _, l := range lines {
			fmt.Fprintf(&b, "  %9.3fms %s\n", float64(l.at.Microseconds())/1000, l.s)
		}
		if f := h.final[k]; f != nil {
			fmt.Fprintf(&b, "  final: %s status=%d run=%d hash=%x expired=%v\n", f.State, f.Status, f.Run, f.Hash[:4], f.Expired)
		}
	}
	return b.String()
}

func describeOp(o *Op) string {
	s := fmt.Sprintf("op %d %s variant=%d stream=%v: status=%d complete=%v run=%d replayed=%v",
		o.ID, o.Mode, o.Variant, o.Stream, o.Status, o.Complete, o.Run, o.Replayed)
	if o.Code != "" {
		s += " code=" + o.Code
	}
	if o.ErrorEvent {
		s += " error-event"
	}
	if o.ClientCut {
		s += " client-left"
	}
	if o.ReadErr != "" {
		s += " read-error=" + o.ReadErr
	}
	if o.Trailer != "" {
		s += " committed-trailer=" + o.Trailer
	}
	return s + fmt.Sprintf(" bytes=%d hash=%x (ended %.3fms)", o.Size, o.Hash[:4], float64(o.End.Microseconds())/1000)
}

func describeCall(c *StoreCall) string {
	s := fmt.Sprintf("store %s owner=%.8s", c.Method, c.Owner)
	if c.Fault != "" {
		s += " FAULT=" + c.Fault
	}
	if c.Status != "" {
		s += " status=" + c.Status
	}
	if c.Run != 0 || c.Method == "Commit" {
		s += fmt.Sprintf(" run=%d hash=%x", c.Run, c.Hash[:4])
	}
	if c.Takeover != "" {
		s += " takeover=" + c.Takeover
	}
	s += fmt.Sprintf(" applied=%v", c.Applied)
	if c.Maybe {
		s += " (maybe)"
	}
	if c.Err != "" {
		s += " err=" + c.Err
	}
	return s
}

// viaNote names the replica a run came through, when the provider knows.
func viaNote(via string) string {
	if via == "" {
		return ""
	}
	return ", via " + via
}
