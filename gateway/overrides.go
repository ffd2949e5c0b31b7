package gateway

import (
	"context"
	"fmt"
	"time"
)

// SharedBreakerOverrides is implemented by a store that several replicas
// share (cache.Redis): an operator's force-open/close is stored there and
// published, so it applies to every replica. Each replica still keeps its
// own breakers — gobreaker's DistributedCircuitBreaker would hold a shared
// lock for the whole upstream call, serialising multi-second LLM calls
// across the fleet.
type SharedBreakerOverrides interface {
	SetBreakerOverride(ctx context.Context, upstream string, open bool) error
	BreakerOverrides(ctx context.Context) (map[string]bool, error)
	WatchBreakerOverrides(ctx context.Context, fn func(upstream string, open bool))
}

// overrideReconcile is how often a replica re-reads the shared overrides,
// so it converges even if it missed a published change.
const overrideReconcile = 10 * time.Second

// startOverrides follows the shared overrides until ctx ends.
func (g *Gateway) startOverrides(ctx context.Context, s SharedBreakerOverrides) {
	go s.WatchBreakerOverrides(ctx, g.applyOverride)
	go func() {
		t := time.NewTicker(overrideReconcile)
		defer t.Stop()
		for {
			g.reconcileOverrides(ctx, s)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// applyOverride makes this replica's breaker match an override.
func (g *Gateway) applyOverride(upstream string, open bool) {
	st, ok := g.breakers.Status(upstream)
	if !ok {
		return // an upstream another replica has and this one does not
	}
	switch {
	case open && !st.Forced:
		_ = g.breakers.ForceOpen(upstream)
		g.log.Warn("breaker forced open by a shared override", "upstream", upstream)
	case !open && st.Forced:
		_ = g.breakers.ForceClose(upstream)
		g.log.Warn("breaker override cleared by a shared override", "upstream", upstream)
	}
}

func (g *Gateway) reconcileOverrides(ctx context.Context, s SharedBreakerOverrides) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := s.BreakerOverrides(rctx)
	if err != nil {
		if ctx.Err() == nil {
			g.log.Warn("reading shared breaker overrides failed", "err", err)
		}
		return
	}
	for _, name := range g.breakers.Names() {
		g.applyOverride(name, m[name])
	}
}

// setBreakerForced is an operator's force-open (open) or close: stored as
// a shared override when the store is shared, and applied here at once.
func (g *Gateway) setBreakerForced(ctx context.Context, name string, open bool) error {
	if _, ok := g.breakers.Status(name); !ok {
		return &apiError{Status: 404, Type: "invalid_request_error", Code: "unknown_upstream",
			Message: "No upstream is named " + quoteName(name) + "."}
	}
	if g.shared != nil {
		if err := g.shared.SetBreakerOverride(ctx, name, open); err != nil {
			return errStore(fmt.Errorf("set shared breaker override: %w", err))
		}
	}
	var err error
	if open {
		err = g.breakers.ForceOpen(name)
	} else {
		err = g.breakers.ForceClose(name)
	}
	if err == nil {
		g.log.Warn("breaker forced by operator", "upstream", name, "open", open, "shared", g.shared != nil)
	}
	return err
}
