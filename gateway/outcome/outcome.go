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
	"context"
	"errors"
	"net/http"
	"time"

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
	// Upstream is the upstream that answered last.
	Upstream string
	// Status is the upstream's status, 0 when no upstream answered.
	Status int
	// Err is the typed error (package apierror) when no upstream produced
	// an answer to relay.
	Err error
	// Unrecordable is an answer served whole but too large to record (over
	// the record limits): it is never committed.
	Unrecordable bool
	// End is what, other than the upstream, ended the request's context
	// (EndNone when nothing did).
	End End
	// Streamed: the answer was a stream whose first event had arrived.
	Streamed bool
	// Attempts and Tried describe the chain, for a dead letter.
	Attempts int
	Tried    []string
	// Delivery is what the client has received of the answer (NotSent
	// when it is settled before its end goes out).
	Delivery Delivery
	// Body and Header are the upstream's non-2xx answer (its relayed
	// headers): what the client's error is made of when the retries ran
	// out on it. Unset for a 2xx.
	Body   []byte
	Header http.Header
}

// Delivery is what the client received of an answer when it is settled.
type Delivery uint8

const (
	// NotSent: the answer's end has not gone out (a committable answer's
	// end waits for its commit).
	NotSent Delivery = iota
	// Whole: the client received the whole answer, before its deadline.
	Whole
	// Cut: the client did not receive it whole: it left, a write to it
	// failed, or its deadline ended the response first.
	Cut
)

// Action is what a keyed request does with its key once settled.
type Action uint8

const (
	// Release: the key is given up (and Verdict.DeadLetter recorded, when
	// set): the client's retry runs again.
	Release Action = iota
	// Commit: the answer is committed under the key before its end goes
	// out; retries replay it.
	Commit
	// Deliver: an answer too large to record goes out first; it is settled
	// again with the client's Delivery, to a Marker or a Release.
	Deliver
	// Marker: a not-stored marker is committed for an answer the client
	// received whole; retries get 410 idempotency_result_not_stored
	// instead of paying for a second, different answer.
	Marker
)

// Verdict is how a request ends.
type Verdict struct {
	// Class is what the log line and metrics say (classify's class).
	Class classify.Class
	// Action is what a keyed request does with its key: the one decision
	// between commit, not-stored marker and release; no caller re-decides
	// it.
	Action Action
	// Commit: a keyed request commits the answer under its key (Action
	// Commit). Otherwise the key is released, so the client's retry runs
	// again, or marked not stored.
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
	// Replace, when non-nil, is the error the client gets instead of an
	// upstream 2xx that is no usable answer (after the retries).
	Replace error
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
		return Verdict{Class: ErrorClass(r.Err), Breaker: breaker.Excluded, DeadLetter: errorFailure(r)}
	}
	o := r.Outcome
	v := Verdict{Class: o.Class, Breaker: Breaker(o, r.End, r.Streamed)}
	ok2xx := r.Status >= 200 && r.Status <= 299
	switch {
	case ok2xx && r.Unrecordable && (!r.Streamed || Committable(o)):
		// Served whole but too large to record (a body too large to buffer
		// is not classified from its content): never committed.
		v.Uncommitted = "over the record limit"
		v.Action = afterDelivery(r.Delivery)
	case ok2xx && Committable(o) && !r.Unrecordable:
		v.Commit, v.Action = true, Commit
	case o.Class == classify.Unauthorized || o.Class == classify.Auth:
		// The provider refused the gateway's credentials: the operator's
		// problem. The tenant never sees the provider's message.
		v.NoRetry = true
		v.Replace = &apierror.UpstreamAuth{Upstream: r.Upstream, Status: r.Status}
	case !ok2xx && r.Status != 0 && o.Class.Retryable() && r.End != EndGateway:
		// The retries ran out on a transient failure: the client gets the
		// upstream's status and error type, told that the gateway retried.
		v.NoRetry = true
		v.Replace = &apierror.RetriesExhausted{Upstream: r.Upstream, Status: r.Status, Class: string(o.Class), Reason: o.Reason,
			Attempts: r.Attempts, RetryAfter: retryAfter(o), Body: r.Body, Header: r.Header}
	case ok2xx && !r.Streamed:
		// A 2xx that is no answer (malformed, an error object): the
		// retries are spent, and a 200 would look like one.
		v.NoRetry = true
		v.Replace = &apierror.BadAnswer{Upstream: r.Upstream, Reason: o.Reason, Class: string(o.Class)}
	default:
		v.NoRetry = true
	}
	if r.End == EndGateway {
		// Cut by this replica's shutdown: another replica can serve the
		// retry.
		v.NoRetry = false
	}
	if r.Status == 0 {
		// No upstream answered the last attempt: the client gets the
		// failure itself.
		v.Replace = noAnswer(r)
	}
	if !v.Commit && (o.Class.BreakerFailure() || r.End == EndGateway) {
		class := string(o.Class)
		if r.End == EndGateway {
			class = "canceled_by_gateway"
		}
		v.DeadLetter = &Failure{Class: class, Message: o.Reason, Status: r.Status, Attempts: r.Attempts, Tried: r.Tried}
	}
	return v
}

// retryAfter is the wait the upstream's answer asked for, 0 for none.
func retryAfter(o classify.Outcome) time.Duration {
	if !o.HasRetryAfter {
		return 0
	}
	return o.RetryAfter
}

// Dropped is how a request ends whose answer the gateway itself dropped
// before settling it — the ids it hands out could not be recorded, or the
// call panicked: the key is released (no dead letter: the upstream did its
// part, and the client gets the gateway's error), and the breaker learns
// nothing.
func Dropped() Verdict {
	return Verdict{Class: GatewayError, Breaker: breaker.Excluded}
}

// afterDelivery is what becomes of the key of an answer served but too
// large to record: settled before it went out, it goes out first; received
// whole, a marker keeps its retries from paying for a second answer; not
// received whole, the key is released, so the retry runs again — a marker
// then would answer 410 for an answer nobody received.
func afterDelivery(d Delivery) Action {
	switch d {
	case Whole:
		return Marker
	case Cut:
		return Release
	}
	return Deliver
}

// noAnswer is the client's error when the last attempt got no response:
// its client left, or the transport failed.
func noAnswer(r Result) error {
	if r.Outcome.Class == classify.Canceled {
		return apierror.ClientGone
	}
	return &apierror.Transport{Upstream: r.Upstream, Reason: r.Outcome.Reason, Timeout: r.Outcome.Timeout}
}

// End is what ended a request's context, other than its upstream.
type End int

const (
	// EndNone: the context is live; the upstream ended the attempt.
	EndNone End = iota
	// EndClient: the client's own deadline (X-Llmgate-Deadline) or its
	// departure. It says nothing about the upstream.
	EndClient
	// EndOperator: the operator's retry.deadline.
	EndOperator
	// EndGateway: the gateway ended the call — it is shutting down and its
	// grace is spent, or the call passed the cap on detached calls.
	EndGateway
)

// The causes a request's contexts are ended with (context.WithDeadlineCause,
// context.WithCancelCause), so that EndOf can tell them apart.
var (
	ErrClientDeadline   = errors.New("the client's deadline (X-Llmgate-Deadline) passed")
	ErrOperatorDeadline = errors.New("the request's deadline (retry.deadline) passed")
	// ErrShutdown (or an error that Is it) ends a call the gateway gave up.
	ErrShutdown = errors.New("the gateway shut down before the call finished")
)

// EndOf says what ended ctx. A client's departure cancels its request's
// context with context.Canceled as the cause.
func EndOf(ctx context.Context) End {
	if ctx.Err() == nil {
		return EndNone
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, ErrOperatorDeadline):
		return EndOperator
	case errors.Is(cause, ErrShutdown):
		return EndGateway
	default: // ErrClientDeadline, context.Canceled by the client
		return EndClient
	}
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
// transiently, or the request says nothing about the provider. Only the
// client's own deadline or departure (and shutdown) is excluded: a client
// with a short X-Llmgate-Deadline must not be able to open the breaker for
// everyone, while the operator's retry.deadline ending an attempt that got
// no answer is the upstream's failure. A stream still progressing when the
// operator's deadline cut it is not a hang: excluded.
func Breaker(o classify.Outcome, end End, streamed bool) breaker.Result {
	switch {
	case end == EndClient || end == EndGateway || o.Class.Excluded():
		return breaker.Excluded
	case end == EndOperator && streamed:
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
