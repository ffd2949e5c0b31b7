package sim

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/llmgate/llmgate/gateway"
)

// The simulation's parts for gateways that run elsewhere: the multi-process
// soak (e2e) starts gateway processes itself, sends them this workload,
// records what its clients and this provider saw in a History, adds the
// store calls it can observe from outside, and holds it all to Check.

// NewHistory starts an empty history; its times are measured from now.
func NewHistory() *History { return newHistory() }

// NewProvider is the simulation's provider, drawing its behaviours from
// the seed's plan. Each gateway may be given its own base URL,
// <provider>/<name>/v1: the runs it makes are then recorded with Via name.
func NewProvider(seed int64, rates ProviderRates, h *History) http.Handler {
	return newProvider(plan{seed: seed}, rates, h, bigChunks)
}

// MaxRecordEvents is the idempotency.max_record_events the provider's
// "big" answers exceed: a gateway must be configured with it for them to
// be served and not kept.
const MaxRecordEvents = maxEvents

// Workload is Simulate's seeded workload of n requests, for gateways
// elsewhere. Its clock-advancing steps do nothing (the gateways keep real
// time).
type Workload struct {
	w   *workload
	clk *Clock
}

// NewWorkload draws n requests from the seed.
func NewWorkload(seed int64, n int) *Workload {
	return &Workload{w: newWorkload(plan{seed: seed}, n), clk: NewClock()}
}

// Len is the number of steps.
func (w *Workload) Len() int { return len(w.w.steps) }

// Do sends step i; a duplicate's copies go to urls in turn, so that they
// meet on different gateways.
func (w *Workload) Do(i int, hc *http.Client, urls []string, h *History) {
	s := w.w.steps[i]
	var wg sync.WaitGroup
	for c := range s.copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(hc, urls[(i+c)%len(urls)], s.req, h)
		}()
	}
	wg.Wait()
}

// Modes counts the first n steps by client mode.
func (w *Workload) Modes(n int) map[string]int {
	out := map[string]int{}
	for _, s := range w.w.steps[:n] {
		out[s.req.mode]++
	}
	return out
}

// upTo is the workload of the keys the first n steps sent.
func (w *Workload) upTo(n int) *workload {
	seen := map[string]bool{}
	sub := &workload{}
	for _, s := range w.w.steps[:n] {
		if !seen[s.req.key.id] {
			seen[s.req.key.id] = true
			sub.keys = append(sub.keys, s.req.key)
		}
	}
	return sub
}

// Settle reads, at quiescence and after the lease, every key the first n
// steps sent, and tries to claim (then releases) each one still in
// flight: the state Check's P4 reads.
func (w *Workload) Settle(n int, st gateway.Store) map[string]*Final {
	return settle(&FaultyStore{Store: st}, w.upTo(n), w.clk)
}

// Final retries every key the first n steps sent, once, across urls in
// turn, with the body its committed record holds if there is one: the
// clients' retries at quiescence.
func (w *Workload) Final(n int, hc *http.Client, urls []string, st gateway.Store, h *History) {
	keys := w.upTo(n).keys
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			rq := request{key: k, mode: ModeFinal}
			rec, err := st.Get(context.Background(), storeKey(k.id))
			if err == nil && rec.Fingerprint == fingerprint(k.body(1)) {
				rq.variant = 1
			}
			send(hc, urls[i%len(urls)], rq, h)
		}()
	}
	wg.Wait()
}

// SetFinal reads every key the first n steps sent into the history as its
// final state.
func (w *Workload) SetFinal(n int, st gateway.Store, h *History) {
	final := finalState(&FaultyStore{Store: st}, w.upTo(n), w.clk)
	h.mu.Lock()
	h.final = final
	h.mu.Unlock()
}

// Since is how long ago the history started.
func (h *History) Since() time.Duration { return h.since() }

// At is when t was on the history's clock (how long after its start).
func (h *History) At(t time.Time) time.Duration { return t.Sub(h.start) }

// AddCall records a store call observed from outside the gateway.
func (h *History) AddCall(c *StoreCall) { h.addCall(c) }

// Ops is a copy of every operation recorded so far.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Op, len(h.ops))
	for i, o := range h.ops {
		out[i] = *o
	}
	return out
}

// Runs is a copy of every provider run recorded so far, by id.
func (h *History) Runs() []Run {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Run, 0, len(h.runs))
	for id := 1; id <= len(h.runs); id++ {
		out = append(out, *h.runs[id])
	}
	return out
}

// Finals is a copy of the final states SetFinal read.
func (h *History) Finals() map[string]Final {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]Final{}
	for k, f := range h.final {
		out[k] = *f
	}
	return out
}
