package sim

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

// workload is the seeded sequence of client requests.
type workload struct {
	keys  []keySpec
	steps []step
	modes map[string]int
}

// step is one entry of the workload: a request (or two or three identical
// ones at once), after moving the stores' clock past the lease if advance.
type step struct {
	req     request
	copies  int
	advance bool
}

// Workload shape: how often a request starts a new key, how far back a
// retry reaches, the client modes' weights.
const (
	newKeyChance  = 0.3
	hotKeys       = 40
	otherBody     = 0.04
	streamChance  = 0.5
	bigChance     = 0.03
	advanceChance = 0.004
)

var (
	modeNames   = []string{ModeNormal, ModeLeave, ModeDeadline, ModeDup}
	modeWeights = []float64{0.58, 0.14, 0.14, 0.14}
)

func newWorkload(p plan, n int) *workload {
	w := &workload{modes: map[string]int{}}
	for i := 0; i < n; i++ {
		if len(w.keys) == 0 || p.roll("newkey", "", i) < newKeyChance {
			id := fmt.Sprintf("k%06d", len(w.keys))
			w.keys = append(w.keys, keySpec{id: id, stream: p.roll("stream", id, 0) < streamChance, big: p.roll("big", id, 0) < bigChance})
		}
		back := p.intn("pick", "", i, min(hotKeys, len(w.keys)))
		k := w.keys[len(w.keys)-1-back]
		rq := request{key: k, mode: p.choose("mode", "", i, modeNames, modeWeights)}
		if p.roll("variant", "", i) < otherBody {
			rq.variant = 1
		}
		rq.leaveAt = 1 + p.intn("leaveAt", "", i, 8)
		rq.leaveDur = time.Duration(p.intn("leaveDur", "", i, 30)) * time.Millisecond
		rq.deadline = time.Duration(1+p.intn("deadline", "", i, 60)) * time.Millisecond
		s := step{req: rq, copies: 1, advance: p.roll("advance", "", i) < advanceChance}
		if rq.mode == ModeDup {
			s.copies = 2 + p.intn("copies", "", i, 2)
		}
		w.modes[rq.mode]++
		w.steps = append(w.steps, s)
	}
	return w
}

// do runs step i.
func (w *workload) do(i int, hc *http.Client, url string, clk *Clock, h *History) {
	s := w.steps[i]
	if s.advance {
		clk.Advance(lease + 50*time.Millisecond)
	}
	if s.copies == 1 {
		send(hc, url, s.req, h)
		return
	}
	var wg sync.WaitGroup
	for range s.copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(hc, url, s.req, h)
		}()
	}
	wg.Wait()
}

func storeKey(id string) cache.Key { return cache.Key{Endpoint: "/v1/chat/completions", ID: id} }

// settle reads every key at quiescence, after the clock has passed the
// lease: committed, free, or in flight — and then it must be claimable.
func settle(fs *FaultyStore, w *workload, clk *Clock) map[string]*Final {
	ctx := context.Background()
	out := map[string]*Final{}
	for _, k := range w.keys {
		out[k.id] = readFinal(ctx, fs.Store, k.id, clk)
		if f := out[k.id]; f.State == "in_flight" {
			rec, err := fs.Store.Get(ctx, storeKey(k.id))
			if err != nil {
				continue
			}
			cl, err := fs.Store.Claim(ctx, storeKey(k.id), rec.Fingerprint, lease)
			f.Claimable = err == nil && cl.Status == cache.Claimed
			if f.Claimable {
				_ = fs.Store.Release(ctx, storeKey(k.id), cl.Owner)
			}
		}
	}
	return out
}

// readFinal is one key's state in the store.
func readFinal(ctx context.Context, st gateway.Store, id string, clk *Clock) *Final {
	rec, err := st.Get(ctx, storeKey(id))
	switch {
	case errors.Is(err, cache.ErrNotFound):
		return &Final{State: "free"}
	case err != nil:
		return &Final{State: "unreadable: " + err.Error()}
	case rec.State == cache.InFlight:
		return &Final{State: "in_flight", Expired: !rec.LeaseUntil.After(clk.Now())}
	}
	b := recordBytes(rec)
	return &Final{State: "committed", Status: rec.Status, Run: runOf(b), Hash: sha256.Sum256(b), Body: b, Fingerprint: rec.Fingerprint}
}

// finalState reads every key after the final retries.
func finalState(fs *FaultyStore, w *workload, clk *Clock) map[string]*Final {
	out := map[string]*Final{}
	for _, k := range w.keys {
		out[k.id] = readFinal(context.Background(), fs.Store, k.id, clk)
	}
	return out
}

// serveFinal retries every key once, faults off, through a fresh gateway
// on the same store — the client's retry at quiescence — with the body the
// committed record holds, if there is one.
func serveFinal(cfg config.Config, fs *FaultyStore, o Options, w *workload, h *History) error {
	return through(gateway.Options{Config: cfg, Store: fs, Logger: o.Logger}, o.Workers, func(jobs chan<- job) {
		for _, k := range w.keys {
			jobs <- func(hc *http.Client, url string) {
				rq := request{key: k, mode: ModeFinal}
				rec, err := fs.Store.Get(context.Background(), storeKey(k.id))
				if err == nil && rec.Fingerprint == fingerprint(k.body(1)) {
					rq.variant = 1
				}
				send(hc, url, rq, h)
			}
		}
	})
}

// fingerprint is the idempotency fingerprint of a workload body (small:
// never over the fingerprint's bound).
func fingerprint(body string) string {
	fp, _ := idempotency.Fingerprint([]byte(body))
	return fp
}
