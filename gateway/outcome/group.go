package outcome

import (
	"errors"

	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/apierror"
)

// The classes a request's log line and llmgate_requests_total's outcome
// label carry besides classify's: the gateway's own endings.
const (
	// Replayed: a committed answer served again under its key, or a stream
	// in flight joined under it.
	Replayed classify.Class = "replayed"
	// BreakerOpen: an open circuit breaker refused the request, and no
	// fallback answered (503 upstream_unavailable).
	BreakerOpen classify.Class = "breaker_open"
	// GatewayError: the gateway failed the request itself.
	GatewayError classify.Class = "gateway_error"
	// BudgetExceeded: the client's budget refused the request before any
	// upstream call (429 budget_exceeded, or 400 budget_request_too_large).
	BudgetExceeded classify.Class = "budget_exceeded"
	// BudgetUnmetered: a budgeted client's passthrough call that spends
	// where no budget sees it was refused (403 budget_unmetered_endpoint).
	BudgetUnmetered classify.Class = "budget_unmetered_endpoint"
)

// Group is how the operator's page charts a request: one of a few groups
// of its outcome class. Every class belongs to exactly one group; a class
// not listed (none is, today) counts as GroupGatewayError.
type Group string

const (
	GroupSuccess     Group = "success"
	GroupReplay      Group = "replay"
	GroupNotRetried  Group = "not_retried"
	GroupClientError Group = "client_error"
	GroupRefused     Group = "refused"
	GroupTransient   Group = "transient"
	GroupBreakerOpen Group = "breaker_open"
	GroupClientLeft  Group = "client_left"
	GroupGateway     Group = "gateway_error"
)

// GroupInfo is one chart group: its name, what the page's legend says of
// it, and the outcome classes it holds.
type GroupInfo struct {
	Group   Group
	Label   string
	Classes []classify.Class
}

// groups is the one table of chart groups, in the order the page stacks
// and lists them. TestGroupsCoverEveryClass holds it to the classes the
// gateway can log.
var groups = []GroupInfo{
	{GroupSuccess, "answered", []classify.Class{classify.Success}},
	{GroupReplay, "served again from the store, or joined in flight: no upstream call", []classify.Class{Replayed}},
	{GroupNotRetried, "answered, but filtered or empty: committed, not retried",
		[]classify.Class{classify.ContentFilter, classify.Empty}},
	{GroupClientError, "the request was wrong: 4xx, a key reused with another body or still in flight",
		[]classify.Class{classify.ClientError, "idempotency_mismatch", "idempotency_in_flight"}},
	{GroupRefused, "refused by the provider (quota, credentials) or by the client's budget or limits",
		[]classify.Class{classify.Quota, classify.Auth, classify.Unauthorized, BudgetExceeded, BudgetUnmetered, "client_limited"}},
	{GroupTransient, "the upstream failed transiently and the retries ran out (503, 429, 5xx, timeouts, cut streams)",
		[]classify.Class{classify.Transient, classify.RateLimited, classify.ServerError}},
	{GroupBreakerOpen, "refused at once by an open circuit breaker", []classify.Class{BreakerOpen}},
	{GroupClientLeft, "the client left, or its own deadline passed", []classify.Class{classify.Canceled, "client_deadline"}},
	{GroupGateway, "the gateway failed it (store errors, a panic)", []classify.Class{GatewayError}},
}

var groupOf = func() map[classify.Class]Group {
	m := map[classify.Class]Group{}
	for _, g := range groups {
		for _, c := range g.Classes {
			m[c] = g.Group
		}
	}
	return m
}()

// Groups returns the chart groups in the page's order (a copy).
func Groups() []GroupInfo {
	out := make([]GroupInfo, len(groups))
	for i, g := range groups {
		g.Classes = append([]classify.Class(nil), g.Classes...)
		out[i] = g
	}
	return out
}

// GroupOf is the chart group of an outcome class; an unknown class is
// GroupGateway.
func GroupOf(class classify.Class) Group {
	if g, ok := groupOf[class]; ok {
		return g
	}
	return GroupGateway
}

// Classes returns every outcome class a request can end with, group by
// group in the page's order.
func Classes() []classify.Class {
	var out []classify.Class
	for _, g := range groups {
		out = append(out, g.Classes...)
	}
	return out
}

// ErrorClass is the class of a request that ended with err and no upstream
// answer: breaker_open when an open breaker refused it, client_limited
// when one of its client's limits did, else gateway_error.
func ErrorClass(err error) classify.Class {
	if errors.As(err, new(*apierror.BreakerOpen)) {
		return BreakerOpen
	}
	if errors.As(err, new(*apierror.ClientLimited)) {
		return "client_limited" // a client's own limit (some callers say so themselves)
	}
	return GatewayError
}
