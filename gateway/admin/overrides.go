package admin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/apierror"
)

// SharedBreakerOverrides is implemented by a store that several replicas
// share (cache.Redis): an operator's force-open/close is stored there and
// published, so it applies to every replica. Its upstream argument is a
// breaker's field (overrideField): an upstream, or an upstream and model. Each replica still keeps its
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

// overrideField is k's field among the shared overrides: the upstream's
// name for its own breaker (as before breakers had models, so replicas of
// either version agree on it), else the upstream and the model joined by
// an ASCII unit separator, which no name in a YAML config contains.
func overrideField(k breaker.Key) string {
	if k.Model == "" {
		return k.Upstream
	}
	return k.Upstream + modelSep + k.Model
}

const modelSep = "\x1f"

func overrideKey(field string) breaker.Key {
	up, model, _ := strings.Cut(field, modelSep)
	return breaker.Key{Upstream: up, Model: model}
}

// applyOverride makes this replica's breaker match an override. A model
// this replica has not seen gets its breaker now (breaker.Registry's
// bound applies).
func (a *Admin) applyOverride(field string, open bool) {
	k := overrideKey(field)
	st, ok := a.breakers.Status(k)
	switch {
	case !slices.Contains(a.breakers.Names(), k.Upstream):
		return // an upstream another replica has and this one does not
	case open && (!ok || !st.Forced):
		if err := a.breakers.ForceOpen(k); err != nil {
			a.log.Warn("shared breaker override not applied", "upstream", k.Upstream, "model", k.Model, "err", err)
			return
		}
		a.log.Warn("breaker forced open by a shared override", "upstream", k.Upstream, "model", k.Model)
	case !open && ok && st.Forced:
		_ = a.breakers.ForceClose(k)
		a.log.Warn("breaker override cleared by a shared override", "upstream", k.Upstream, "model", k.Model)
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
	seen := map[string]bool{}
	for _, k := range a.breakers.Keys() {
		f := overrideField(k)
		seen[f] = true
		a.applyOverride(f, m[f])
	}
	for f, open := range m {
		if !seen[f] {
			a.applyOverride(f, open) // a model this replica has not seen yet
		}
	}
}

// setBreakerForced is an operator's force-open (open) or close of k's
// breaker: stored as a shared override when the store is shared, and
// applied here at once.
func (a *Admin) setBreakerForced(ctx context.Context, k breaker.Key, open bool) error {
	if !slices.Contains(a.breakers.Names(), k.Upstream) {
		return apierror.NotFound("unknown_upstream", "", "No upstream is named "+quoteName(k.Upstream)+".")
	}
	if k.Model != "" && a.cfg.Breaker.Scope == config.BreakerScopeUpstream {
		return apierror.Invalid("model", "breaker.scope is upstream: one breaker per upstream serves every model; leave out ?model.")
	}
	if a.shared != nil {
		if err := a.shared.SetBreakerOverride(ctx, overrideField(k), open); err != nil {
			return &apierror.StoreUnavailable{Err: fmt.Errorf("set shared breaker override: %w", err)}
		}
	}
	var err error
	if open {
		err = a.breakers.ForceOpen(k)
	} else {
		err = a.breakers.ForceClose(k)
	}
	if err == nil {
		a.log.Warn("breaker forced by operator", "upstream", k.Upstream, "model", k.Model, "open", open, "shared", a.shared != nil)
	}
	return err
}
