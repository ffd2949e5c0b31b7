package gateway

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// A duplicate that arrives while the first request is still taking its
// claim joins the stream too: it gets each event live, the same bytes as
// the first client, with one upstream call (before, it found no stream to
// join and waited for the commit).
func TestDuplicateDuringClaimJoins(t *testing.T) {
	up := newPacedUpstream(2, 0)
	url := newTestServer(t, up)
	gate := &claimGate{claimed: make(chan struct{}), proceed: make(chan struct{})}
	gate.armed.Store(true)
	h := newHarnessStore(t, func(c *config.Config) { c.Upstreams[0].BaseURL = url + "/v1" },
		func(s Store) Store { gate.Store = s; return gate }, fakeprovider.Options{})
	first := openStream(t, h, "claim-join")
	<-gate.claimed // the first request is inside its claim
	joiner := openStream(t, h, "claim-join")
	// The joiner must have found the stream before the claim returns; it
	// cannot be observed from outside, so wait for its wait to be counted.
	deadline := time.Now().Add(requestLimit / 3)
	for !strings.Contains(string(h.admin("GET", "/metrics").body), `llmgate_idempotency_events_total{event="wait"} 1`) {
		if time.Now().After(deadline) {
			t.Fatal("the duplicate never waited")
		}
		time.Sleep(time.Millisecond) // polling a counter, not synchronising on time
	}
	close(gate.proceed)
	up.step <- struct{}{}
	a0 := first.event()
	if b0 := joiner.event(); b0 != a0 { // before the upstream sends event 1
		t.Fatalf("joiner's first event %q, first client's %q", b0, a0)
	}
	for range up.events[1:] {
		up.step <- struct{}{}
	}
	a, b := first.rest(), joiner.rest()
	if !bytes.Equal(a, b) || !bytes.Equal(a, []byte(strings.Join(up.events, ""))) {
		t.Fatalf("streams differ:\nfirst:  %q\njoiner: %q", a, b)
	}
	if joiner.response().Header.Get("X-Llmgate-Joined") != "true" {
		t.Errorf("joiner's headers: %v", joiner.res.Header)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls: %d, want 1", n)
	}
}

// panicClaim panics in the next Claim once armed, as a store driver's bug
// would.
type panicClaim struct {
	Store
	armed atomic.Bool
}

func (p *panicClaim) Claim(ctx context.Context, k cache.Key, fp string, lease time.Duration) (cache.Claim, error) {
	if p.armed.CompareAndSwap(true, false) {
		panic("claim failed")
	}
	return p.Store.Claim(ctx, k, fp, lease)
}

// A keyed stream whose claim panics leaves no registration for joiners
// behind: the next request with the key runs (before, it found the dead
// registration, waited for a status line that never came and got 409).
func TestClaimPanicLeavesNoLiveStream(t *testing.T) {
	pc := &panicClaim{}
	h := newHarnessStore(t, func(c *config.Config) { c.Idempotency.WaitTimeout = config.Duration(300 * time.Millisecond) },
		func(s Store) Store { pc.Store = s; return pc }, fakeprovider.Options{})
	pc.armed.Store(true)
	if r := h.chat(streamBody, map[string]string{"Idempotency-Key": "claim-panic"}); r.status != http.StatusInternalServerError {
		t.Fatalf("the panicking claim: %d %s", r.status, r.body)
	}
	r := h.chat(streamBody, map[string]string{"Idempotency-Key": "claim-panic"})
	if r.status != http.StatusOK || !strings.Contains(string(r.body), "[DONE]") {
		t.Fatalf("the next request with the key: %d %s", r.status, r.body)
	}
}
