package request

import (
	"context"
	"errors"
	"net/http"

	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/budget"
	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/proxy"
)

// Budgets (package budget) are charged by provider run, where the
// request path runs the call: serveUnkeyed, and a claimed key's call
// (keyedCall.run). What answers without a run — a replay of a committed
// key, a duplicate coalesced onto the call in flight (it waits for its
// commit), a client's retry answered from the store — never reaches
// either, and is never charged (its tokens count as saved). A call that
// takes over a key whose lease expired runs, and is charged: the
// provider bills it too.
//
// A run is charged by the usage its provider reported, or by its
// reservation when it reported none (a stream without
// stream_options.include_usage, a 2xx cut before its usage): the gateway
// does not rewrite the request to ask for usage, so such a charge is an
// estimate, counted as one (llmgate_budget_charged_total{estimated="true"}).
// Each billed run counts — the runs a gateway retry replaced too
// (proxy.Call.Runs). A stream running when its budget runs out completes;
// the next request is refused.

// budgetClass is the log line's class of a request its budget refused.
const budgetClass = outcome.BudgetExceeded

// unmeteredClass is the log line's class of a budgeted client's
// passthrough call refused as unmetered (budget.Ledger.Unmetered), or
// background response (UnmeteredLater).
const unmeteredClass = outcome.BudgetUnmetered

// refusedClass is the log line's class of a call reserve refused.
func refusedClass(err error) classify.Class {
	if errors.As(err, new(*apierror.UnmeteredRefused)) {
		return unmeteredClass
	}
	if re := (*reserveEnded)(nil); errors.As(err, &re) {
		if re.byClient {
			return "client_deadline"
		}
		return outcome.GatewayError
	}
	return budgetClass
}

// reserve reserves a call's budget before it runs: nil when its client
// has no budget that applies. The refusal (apierror.BudgetExceeded,
// BudgetUnavailable, UnmeteredRefused for a background response, or a
// reserveEnded when the request's own end came first) is the client's
// answer, and nothing was sent.
func (g *Handler) reserve(ctx context.Context, cl *proxy.Call, out budget.Output) (*budget.Hold, error) {
	client := ClientOf(cl.In)
	if cl.Passthrough || !cl.API.Billed() || !g.budgets.Budgeted(client) {
		return nil, nil
	}
	if out.Later {
		if err := g.budgets.UnmeteredLater(client, cl.Model, http.MethodPost, cl.In.URL.Path+" with background: true"); err != nil {
			return nil, err
		}
	}
	ups := make([]string, len(cl.Hops))
	for i, h := range cl.Hops {
		ups[i] = h.Upstream.Cfg.Name
	}
	// The request's own end (its deadline, its client leaving, the
	// operator's deadline, shutdown) before or during the reservation is
	// no failure of the store's: the store is not asked, or its answer is
	// not counted as one (budget.RequestEnded).
	if ctx.Err() != nil {
		return nil, ended(ctx)
	}
	opCtx, cancel := context.WithTimeout(ctx, g.cfg.Store.OpTimeout.D())
	defer cancel()
	hold, err := g.budgets.Reserve(opCtx, budget.Request{Client: client, Model: cl.Model, Upstreams: ups,
		Estimate: budget.Estimate(g.cfg.Budgets, len(cl.Body), out)})
	if errors.As(err, new(*budget.RequestEnded)) {
		return nil, ended(ctx)
	}
	return hold, err
}

// reserveEnded is reserve's answer when the request ended first: a 504
// deadline_exceeded to the client (if it still waits), logged as the
// client's deadline or departure when that is what ended it.
type reserveEnded struct{ byClient bool }

func (e *reserveEnded) Error() string { return "the request ended before its budget was reserved" }
func (e *reserveEnded) Unwrap() error { return &apierror.DeadlineSpent{} }

func ended(ctx context.Context) error {
	return &reserveEnded{byClient: outcome.EndOf(ctx) == outcome.EndClient}
}

// settleBudget charges a call's billed runs to its hold: the ones a
// retry replaced, and resp's (nil when no upstream answered) with the
// usage it reported. Called once the answer has been relayed, so a
// stream's usage is in.
func (g *Handler) settleBudget(ctx context.Context, h *budget.Hold, cl *proxy.Call, resp *proxy.Response) {
	if h == nil {
		return
	}
	runs := make([]budget.Run, 0, len(cl.Runs)+1)
	for _, r := range cl.Runs {
		runs = append(runs, budget.Run{Upstream: r.Upstream, Usage: r.Usage})
	}
	if resp.Billed() {
		u := resp.Outcome.Usage
		if resp.Status >= 200 && resp.Status <= 299 {
			u = cl.Usage(resp)
		}
		runs = append(runs, budget.Run{Upstream: resp.Upstream.Cfg.Name, Usage: u})
	}
	h.Settle(ctx, g.cfg.Store.OpTimeout.D(), runs)
}
