package sim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/gateway"
)

// Store fault kinds.
const (
	// FaultFailBefore: the call fails before it reaches the store.
	FaultFailBefore = "fail_before"
	// FaultReplyLost: the call takes effect, then fails as if its reply
	// were lost on the way back — the ambiguous case.
	FaultReplyLost = "reply_lost"
	// FaultLate: the call is held until its caller's deadline has passed
	// (bounded), fails with the deadline, and then takes effect anyway.
	FaultLate = "late"
	// FaultStall: the call is held for a while, then runs normally — long
	// enough, sometimes, for a lease to run out meanwhile.
	FaultStall = "stall"
)

// StoreRates are the chances of each fault, per store call.
type StoreRates struct {
	FailBefore, ReplyLost, Late, Stall float64
}

// errInjected is the error of an injected store failure.
var errInjected = errors.New("sim: injected store failure")

// errReplyLost is the error of a call whose reply was lost.
var errReplyLost = errors.New("sim: injected store failure: reply lost after the call was applied")

// FaultyStore is the gateway's store behind injected faults: each call of
// Claim, Renew, Commit, Release and Wait draws its fault from the plan by
// key and how many times that key made that call, and every call is
// recorded in the history with what it did. The other methods pass
// through.
type FaultyStore struct {
	gateway.Store
	plan    plan
	rates   StoreRates
	hist    *History
	clock   *Clock
	on      atomic.Bool
	lateMax time.Duration
	stall   [2]time.Duration // the shortest and longest stall

	mu     sync.Mutex
	n      map[string]int // calls so far per method and key
	owners map[string]*holder
	faults map[string]int // injected faults by method/kind
	takes  map[string]int // takeovers by cause
}

// holder is who the store's records say holds a key, as seen by the
// wrapper, and what might have orphaned the claim.
type holder struct {
	owner    string
	advances int    // the clock's advances when last claimed or renewed
	orphan   string // why nobody may be running it
}

func newFaultyStore(inner gateway.Store, p plan, rates StoreRates, h *History, clk *Clock) *FaultyStore {
	s := &FaultyStore{Store: inner, plan: p, rates: rates, hist: h, clock: clk,
		lateMax: 400 * time.Millisecond, stall: [2]time.Duration{20 * time.Millisecond, 1200 * time.Millisecond},
		n: map[string]int{}, owners: map[string]*holder{}, faults: map[string]int{}, takes: map[string]int{}}
	s.on.Store(true)
	return s
}

// fault draws the fault of this call.
func (s *FaultyStore) fault(method string, k cache.Key) (string, time.Duration) {
	s.mu.Lock()
	s.n[method+k.ID]++
	n := s.n[method+k.ID]
	s.mu.Unlock()
	if !s.on.Load() {
		return "", 0
	}
	r := s.rates
	f := s.plan.choose("store/"+method, k.ID, n,
		[]string{FaultFailBefore, FaultReplyLost, FaultLate, FaultStall, ""},
		[]float64{r.FailBefore, r.ReplyLost, r.Late, r.Stall, 1 - r.FailBefore - r.ReplyLost - r.Late - r.Stall})
	if f == FaultReplyLost && method == "Wait" {
		f = FaultFailBefore // a wait has no effect to apply
	}
	var d time.Duration
	if f == FaultStall {
		span := int(s.stall[1] - s.stall[0])
		d = s.stall[0] + time.Duration(s.plan.intn("stall/"+method, k.ID, n, span/int(time.Millisecond)))*time.Millisecond
	}
	if f != "" {
		s.mu.Lock()
		s.faults[method+"/"+f]++
		s.mu.Unlock()
	}
	return f, d
}

// do runs apply under the drawn fault and reports the error the caller
// gets and whether the call took effect.
func (s *FaultyStore) do(ctx context.Context, fault string, stall time.Duration, apply func(context.Context) error) (err error, applied bool) {
	switch fault {
	case FaultFailBefore:
		return errInjected, false
	case FaultReplyLost:
		if err := apply(ctx); err != nil {
			return err, false
		}
		return errReplyLost, true
	case FaultLate:
		t := time.NewTimer(s.lateMax)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		err := apply(context.WithoutCancel(ctx))
		if ctx.Err() != nil {
			return ctx.Err(), err == nil
		}
		return err, err == nil
	case FaultStall:
		time.Sleep(stall) // the fault itself: a store that does not answer for a while
	}
	err = apply(ctx)
	return err, err == nil
}

func (s *FaultyStore) record(c *StoreCall, fault string, err error, applied bool) {
	c.Fault, c.Applied, c.At = fault, applied, s.hist.since()
	if err != nil {
		c.Err = err.Error()
		c.Maybe = !applied && fault != FaultFailBefore && !errors.Is(err, cache.ErrNotOwner)
	}
	s.hist.addCall(c)
}

// Claim is the store's Claim under a fault; it notes a takeover of a key
// another owner held.
func (s *FaultyStore) Claim(ctx context.Context, k cache.Key, fp string, lease time.Duration) (cache.Claim, error) {
	fault, stall := s.fault("Claim", k)
	var cl cache.Claim
	err, applied := s.do(ctx, fault, stall, func(ctx context.Context) error {
		var err error
		cl, err = s.Store.Claim(ctx, k, fp, lease)
		return err
	})
	c := &StoreCall{Method: "Claim", Key: k.ID}
	if applied {
		c.Status = cl.Status.String()
		if cl.Status == cache.Claimed {
			c.Owner = cl.Owner
			c.Takeover = s.claimed(k.ID, cl.Owner, err != nil)
		}
	}
	s.record(c, fault, err, applied)
	if err != nil {
		return cache.Claim{}, err
	}
	return cl, nil
}

// claimed notes a new owner of key, and returns why the previous one lost
// it, if there was one ("" for none).
func (s *FaultyStore) claimed(key, owner string, replyLost bool) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	adv := s.clock.Advances()
	cause := ""
	if prev := s.owners[key]; prev != nil {
		switch {
		case prev.orphan != "":
			cause = prev.orphan
		case adv > prev.advances:
			cause = "lease_expired_clock_jump"
		default:
			cause = "lease_expired_real_time"
		}
		s.takes[cause]++
	}
	h := &holder{owner: owner, advances: adv}
	if replyLost {
		h.orphan = "orphaned_claim_reply_lost"
	}
	s.owners[key] = h
	return cause
}

// ended notes that owner no longer holds key.
func (s *FaultyStore) ended(key, owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.owners[key]; h != nil && h.owner == owner {
		delete(s.owners, key)
	}
}

// orphaned notes why owner's claim on key may be left behind.
func (s *FaultyStore) orphaned(key, owner, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.owners[key]; h != nil && h.owner == owner {
		h.orphan = why
	}
}

// Renew is the store's Renew under a fault.
func (s *FaultyStore) Renew(ctx context.Context, k cache.Key, owner string, lease time.Duration) error {
	fault, stall := s.fault("Renew", k)
	err, applied := s.do(ctx, fault, stall, func(ctx context.Context) error { return s.Store.Renew(ctx, k, owner, lease) })
	if applied {
		s.mu.Lock()
		if h := s.owners[k.ID]; h != nil && h.owner == owner {
			h.advances = s.clock.Advances()
		}
		s.mu.Unlock()
	}
	s.record(&StoreCall{Method: "Renew", Key: k.ID, Owner: owner}, fault, err, applied)
	return err
}

// Commit is the store's Commit under a fault; the record's provider run
// and bytes are noted.
func (s *FaultyStore) Commit(ctx context.Context, k cache.Key, owner string, rec *cache.Record, ttl time.Duration) error {
	start := time.Now()
	fault, stall := s.fault("Commit", k)
	err, applied := s.do(ctx, fault, stall, func(ctx context.Context) error { return s.Store.Commit(ctx, k, owner, rec, ttl) })
	b := recordBytes(rec)
	c := &StoreCall{Method: "Commit", Key: k.ID, Owner: owner, Run: runOf(b), Hash: sha256.Sum256(b), Status: statusText(rec.Status), Took: time.Since(start)}
	if applied {
		s.ended(k.ID, owner)
	}
	s.record(c, fault, err, applied)
	return err
}

// Release is the store's Release under a fault.
func (s *FaultyStore) Release(ctx context.Context, k cache.Key, owner string) error {
	fault, stall := s.fault("Release", k)
	err, applied := s.do(ctx, fault, stall, func(ctx context.Context) error { return s.Store.Release(ctx, k, owner) })
	if applied {
		s.ended(k.ID, owner)
	} else if !errors.Is(err, cache.ErrNotOwner) {
		s.orphaned(k.ID, owner, "orphaned_release_failed")
	}
	s.record(&StoreCall{Method: "Release", Key: k.ID, Owner: owner}, fault, err, applied)
	return err
}

// Wait is the store's Wait under a fault.
func (s *FaultyStore) Wait(ctx context.Context, k cache.Key) error {
	fault, stall := s.fault("Wait", k)
	err, _ := s.do(ctx, fault, stall, func(ctx context.Context) error { return s.Store.Wait(ctx, k) })
	if fault != "" {
		s.record(&StoreCall{Method: "Wait", Key: k.ID}, fault, err, false)
	}
	return err
}

// recordBytes are a committed record's answer: its body, or its events.
func recordBytes(rec *cache.Record) []byte {
	if !rec.Stream {
		return rec.Body
	}
	return bytes.Join(rec.Events, nil)
}

func statusText(code int) string {
	if code == 0 {
		return ""
	}
	return "http_" + itoa(code)
}
