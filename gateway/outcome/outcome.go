// Package outcome is the one place that settles how a request ends. Given
// what the attempt chain produced (a classified upstream answer, or a typed
// error when none came), Settle decides once: whether the answer is
// committed under its key, what the upstream's breaker learns, whether it is
// a dead letter, whether the client is told not to retry, and the class the
// log line and metrics carry. The proxy and idempotency rooms both use it;
// neither decides any of these itself.
//
// It knows nothing of HTTP, echo or the store.
package outcome

import (
	"errors"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/apierror"
)

// Result is what an attempt chain produced, once it is over (for a stream:
// after its last event).
type Result struct {
	// Outcome is the classified answer of the last attempt. Zero when Err
	// is set.
	Outcome classify.Outcome
	// Status is the upstream's status, 0 when no upstream answered.
	Status int
	// Err is the typed error (package apierror) when no upstream produced
	// an answer to relay.
	Err error
	// Unrecordable is an answer served whole but too large to record (over
	// the record limits): it is never committed.
	Unrecordable bool
	// CtxEnded is true when the request's own context — its deadline or its
	// client — ended the last attempt, rather than the upstream.
	CtxEnded bool
	// Attempts and Tried describe the chain, for a dead letter.
	Attempts int
	Tried    []string
}

// Verdict is how a request ends.
type Verdict struct {
	// Class is what the log line and metrics say (classify's class).
	Class classify.Class
	// Commit: a keyed request commits the answer under its key. Otherwise
	// the key is released, so the client's retry runs again.
	Commit bool
	// Uncommitted is why an answer that was served is not committed ("" when
	// it was, or when it failed).
	Uncommitted string
	// Breaker is what the upstream's breaker learns.
	Breaker breaker.Result
	// NoRetry sets x-should-retry: false on a relayed answer: the gateway
	// already retried what was worth retrying.
	NoRetry bool
	// DeadLetter, when non-nil, is the failure a keyed request records.
	DeadLetter *Failure
}

// Failure is what a keyed request's final failure says, for its dead letter.
type Failure struct {
	Class    string
	Message  string
	Status   int
	Attempts int
	Tried    []string
}

// Settle decides how the request that produced r ends.
func Settle(r Result) Verdict {
	if r.Err != nil {
		return Verdict{Class: classify.Class("gateway_error"), Breaker: breaker.Excluded, DeadLetter: errorFailure(r)}
	}
	o := r.Outcome
	v := Verdict{Class: o.Class, Breaker: Breaker(o, r.CtxEnded)}
	ok2xx := r.Status >= 200 && r.Status <= 299
	switch {
	case r.Unrecordable:
		v.Uncommitted = "over the record limit"
	case ok2xx && Committable(o):
		v.Commit = true
	default:
		v.NoRetry = true
	}
	if !ok2xx {
		v.NoRetry = true
	}
	if !v.Commit && o.Class.BreakerFailure() {
		v.DeadLetter = &Failure{Class: string(o.Class), Message: o.Reason, Status: r.Status, Attempts: r.Attempts, Tried: r.Tried}
	}
	return v
}

// errorFailure is the dead letter of a request no upstream answered: an
// open breaker with no fallback, or the deadline spent. Other errors (a
// transport failure has a classified outcome instead) are not recorded.
func errorFailure(r Result) *Failure {
	var bo *apierror.BreakerOpen
	class := ""
	switch {
	case errors.As(r.Err, &bo):
		class = "breaker_open"
	case errors.As(r.Err, new(*apierror.DeadlineSpent)):
		class = "deadline"
	default:
		return nil
	}
	w := apierror.Wire(r.Err)
	return &Failure{Class: class, Message: w.Message, Status: w.Status, Tried: r.Tried}
}

// Breaker maps an upstream's outcome to what its breaker learns: the
// provider answered (success, permanent, filtered, empty), it failed
// transiently, or the request's own context ended it and it says nothing
// about the provider — a client with a short X-Llmgate-Deadline must not be
// able to open the breaker for everyone.
func Breaker(o classify.Outcome, ctxEnded bool) breaker.Result {
	switch {
	case ctxEnded || o.Class.Excluded():
		return breaker.Excluded
	case o.Class.BreakerFailure():
		return breaker.Failure
	default:
		return breaker.Success
	}
}

// Committable says whether an outcome is the model's answer (committed) or
// a failure (released for the client to retry).
func Committable(o classify.Outcome) bool {
	switch o.Class {
	case classify.Success, classify.ContentFilter, classify.Empty:
		return true
	}
	return false
}
