package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/llmgate/llmgate/gateway/apierror"
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

// followOverrides follows the shared overrides until ctx ends.
func (a *Admin) followOverrides(ctx context.Context, s SharedBreakerOverrides) {
	go s.WatchBreakerOverrides(ctx, a.applyOverride)
	go func() {
		t := time.NewTicker(overrideReconcile)
		defer t.Stop()
		for {
			a.reconcileOverrides(ctx, s)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// applyOverride makes this replica's breaker match an override.
func (a *Admin) applyOverride(upstream string, open bool) {
	st, ok := a.breakers.Status(upstream)
	if !ok {
		return // an upstream another replica has and this one does not
	}
	switch {
	case open && !st.Forced:
		_ = a.breakers.ForceOpen(upstream)
		a.log.Warn("breaker forced open by a shared override", "upstream", upstream)
	case !open && st.Forced:
		_ = a.breakers.ForceClose(upstream)
		a.log.Warn("breaker override cleared by a shared override", "upstream", upstream)
	}
}

func (a *Admin) reconcileOverrides(ctx context.Context, s SharedBreakerOverrides) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := s.BreakerOverrides(rctx)
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("reading shared breaker overrides failed", "err", err)
		}
		return
	}
	for _, name := range a.breakers.Names() {
		a.applyOverride(name, m[name])
	}
}

// setBreakerForced is an operator's force-open (open) or close: stored as
// a shared override when the store is shared, and applied here at once.
func (a *Admin) setBreakerForced(ctx context.Context, name string, open bool) error {
	if _, ok := a.breakers.Status(name); !ok {
		return apierror.NotFound("unknown_upstream", "", "No upstream is named "+quoteName(name)+".")
	}
	if a.shared != nil {
		if err := a.shared.SetBreakerOverride(ctx, name, open); err != nil {
			return &apierror.StoreUnavailable{Err: fmt.Errorf("set shared breaker override: %w", err)}
		}
	}
	var err error
	if open {
		err = a.breakers.ForceOpen(name)
	} else {
		err = a.breakers.ForceClose(name)
	}
	if err == nil {
		a.log.Warn("breaker forced by operator", "upstream", name, "open", open, "shared", a.shared != nil)
	}
	return err
}
