package gateway

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/cache"
)

// A full store is a state, not an outage: below its disk's free-space
// floor or over store.max_bytes, the store says so (Space), and the gateway
// refuses new keyed requests before their claim — with 503
// idempotency_store_full and Retry-After — while replays of committed keys
// and unkeyed requests are served as usual. /readyz stays 200 and says why
// (see readyz); a metric and an alert tell the operator. When space returns
// the store notices it within a second and keyed requests run again.

// spaceReporter is a store that knows its room for new records (the Badger
// store). A Redis at maxmemory says so through its errors (cache.ErrFull).
type spaceReporter interface {
	Space() cache.Space
}

// space is the store's room, or ok=false when the store cannot tell.
func (g *Gateway) space() (cache.Space, bool) {
	sr, ok := g.store.(spaceReporter)
	if !ok {
		return cache.Space{}, false
	}
	return sr.Space(), true
}

// spaceReady is what /readyz adds while the store is full ("" otherwise).
func (g *Gateway) spaceReady() string {
	sp, ok := g.space()
	if !ok || !sp.Full {
		return ""
	}
	return fmt.Sprintf("ready; store full (%s: %d bytes free, floor %d; %d bytes live, cap %d; read-only %v): "+
		"new keyed requests get 503 idempotency_store_full, replays and requests without a key are served\n",
		sp.Reason, sp.FreeBytes, sp.MinFreeBytes, sp.LiveBytes, sp.MaxBytes, sp.ReadOnly)
}

// registerSpace exports the store's room, for the alerts LlmgateStoreFull
// and LlmgateStoreNearCap (deploy/alerts.yaml). A store that cannot tell
// (Redis) exports none of these.
func (g *Gateway) registerSpace() {
	if _, ok := g.space(); !ok {
		return
	}
	gauge := func(opts prometheus.GaugeOpts, f func(cache.Space) float64) {
		g.registry.MustRegister(prometheus.NewGaugeFunc(opts, func() float64 {
			sp, _ := g.space()
			return f(sp)
		}))
	}
	gauge(prometheus.GaugeOpts{Name: "llmgate_store_full", Help: "1 while the store has no room for new records (below its disk's free-space floor, over store.max_bytes, or read-only): new keyed requests get 503."},
		func(sp cache.Space) float64 { return b2f(sp.Full) })
	gauge(prometheus.GaugeOpts{Name: "llmgate_store_read_only", Help: "1 while the store is open read-only (it started below its free-space floor)."},
		func(sp cache.Space) float64 { return b2f(sp.ReadOnly) })
	gauge(prometheus.GaugeOpts{Name: "llmgate_store_free_bytes", Help: "Free bytes on the store's filesystem (-1: unknown)."},
		func(sp cache.Space) float64 { return float64(sp.FreeBytes) })
	gauge(prometheus.GaugeOpts{Name: "llmgate_store_min_free_bytes", Help: "The store's free-space floor (store.min_free_bytes)."},
		func(sp cache.Space) float64 { return float64(sp.MinFreeBytes) })
	gauge(prometheus.GaugeOpts{Name: "llmgate_store_used_bytes", Help: "Bytes in the store's files (.sst and .vlog); deleted and expired entries stay in them until the store reclaims its disk."},
		func(sp cache.Space) float64 { return float64(sp.UsedBytes) })
	gauge(prometheus.GaugeOpts{Name: "llmgate_store_live_bytes", Help: "Bytes of the store's live entries (not expired or deleted), which store.max_bytes caps."},
		func(sp cache.Space) float64 { return float64(sp.LiveBytes) })
	gauge(prometheus.GaugeOpts{Name: "llmgate_store_max_bytes", Help: "The store's size cap, store.max_bytes (0: none)."},
		func(sp cache.Space) float64 { return float64(sp.MaxBytes) })
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
