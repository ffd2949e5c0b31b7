// Package apierror holds the typed errors of the request path and the one
// function that turns any of them into what a client sees: a status, an
// OpenAI error object ({"error":{"message","type","param","code"}}),
// Retry-After and x-should-retry.
//
// The core (proxy, idempotency, relay) returns these types and never
// decides a status or a wire code; readers such as dead letters inspect the
// type with errors.As, not the wire code. It knows nothing of echo, of
// upstreams' configuration or of the store.
package apierror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/llmgate/llmgate/breaker"
)

// Error is an error whose wire form is fixed where it arises: request
// validation, authentication, unknown routes. The client sees Message (and
// Type, Code, Param); the log sees Err. Model: tailscale's tsweb.HTTPError.
type Error struct {
	Status  int
	Type    string // OpenAI error.type: invalid_request_error, server_error, ...
	Code    string // OpenAI error.code, may be empty
	Param   string
	Message string
	// RetryAfter, when > 0, is sent as Retry-After (whole seconds, rounded up).
	RetryAfter time.Duration
	// ShouldRetry sets x-should-retry: true. The gateway is the retry layer,
	// so it is false everywhere except where a later retry can succeed
	// without another upstream call.
	ShouldRetry bool
	// ProviderType: Type is the upstream's own error.type, in the
	// vocabulary of the route's API (an Anthropic route's upstream speaks
	// Anthropic's), so every shape sends it as it is instead of choosing
	// one by status.
	ProviderType bool
	// Header holds headers sent with the error besides the gateway's own:
	// an upstream's relayed ones (its request id, rate-limit state), a
	// budget's reset time.
	// Content-Type, Retry-After and x-should-retry in it are not sent:
	// the error's own are.
	Header http.Header
	Err    error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Invalid is a 400 invalid_request_error about param.
func Invalid(param, msg string) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: msg}
}

// InvalidCode is Invalid with an error code.
func InvalidCode(code, param, msg string, err error) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Param: param, Message: msg, Err: err}
}

// NotFound is a 404 invalid_request_error.
func NotFound(code, param, msg string) *Error {
	return &Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: code, Param: param, Message: msg}
}

// The typed errors of the core. Each says what happened; Wire says what the
// client gets for it.

// BreakerOpen: a circuit breaker refused the request: Model's on Upstream,
// or Upstream's own (Model "") for every model of it.
type BreakerOpen struct {
	Upstream   string
	Model      string
	RetryAfter time.Duration
	Err        error
}

func (e *BreakerOpen) Error() string {
	if e.Model != "" {
		return "upstream " + e.Upstream + " model " + e.Model + ": circuit breaker open"
	}
	return "upstream " + e.Upstream + ": circuit breaker open"
}

// what names what the breaker refused, for the client.
func (e *BreakerOpen) what() string {
	if family, ok := breaker.LaneFamily(e.Model); ok {
		// A lane: the requests of a route family that name no model.
		return fmt.Sprintf("Requests to %s on upstream %s", family, e.Upstream)
	}
	if e.Model != "" {
		return fmt.Sprintf("Model %s on upstream %s", e.Model, e.Upstream)
	}
	return "Upstream " + e.Upstream
}
func (e *BreakerOpen) Unwrap() error { return e.Err }

// DeadlineSpent: the request's deadline passed before an upstream could be
// tried.
type DeadlineSpent struct{}

func (e *DeadlineSpent) Error() string { return "deadline passed before an upstream could be tried" }

// StoreUnavailable: the idempotency store failed before a keyed request
// was run (at its claim), so it was not run. A failure at the commit, after
// the call ran, is a CommitFailed.
type StoreUnavailable struct{ Err error }

func (e *StoreUnavailable) Error() string {
	return "idempotency store unavailable: " + errString(e.Err)
}
func (e *StoreUnavailable) Unwrap() error { return e.Err }

// CommitFailed: a keyed request's call ran — the provider answered, and may
// have billed it — but the store failed as its answer was committed, so the
// answer was not kept and the key was released. A retry with the same key
// runs the request again (unless the commit reached the store after all, as
// a lost reply does: then the retry replays it). Err is the store's error;
// one that says the store is full (cache.ErrFull) maps to
// idempotency_store_full, any other to idempotency_store_unavailable.
type CommitFailed struct{ Err error }

func (e *CommitFailed) Error() string {
	return "idempotency store failed at the commit: " + errString(e.Err)
}
func (e *CommitFailed) Unwrap() error { return e.Err }

// StoreFull: the idempotency store has no room for new records (its disk
// is below the free-space floor, it is over store.max_bytes, or Redis is at
// maxmemory), so a new keyed request was not run. Replays still work.
type StoreFull struct {
	Reason     string // cache.FullDiskLow, ...; for the log
	RetryAfter time.Duration
	Err        error
}

func (e *StoreFull) Error() string {
	return "idempotency store full (" + e.Reason + "): " + errString(e.Err)
}
func (e *StoreFull) Unwrap() error { return e.Err }

// storeFuller is what a store's own "full" error (cache.ErrFull) reports,
// so that it maps here without apierror importing the store.
type storeFuller interface{ StoreFull() bool }

// Transport: no upstream answered; Reason is classify's, Timeout whether it
// was a timeout.
type Transport struct {
	Upstream string
	Reason   string
	Timeout  bool
}

func (e *Transport) Error() string { return "upstream " + e.Upstream + ": " + e.Reason }

// BadAnswer: an upstream's 2xx that is no usable answer (malformed, cut,
// an error object), still so after the retries.
type BadAnswer struct {
	Upstream string
	Class    string
	Reason   string
}

func (e *BadAnswer) Error() string {
	return "upstream " + e.Upstream + ": unusable 2xx answer: " + e.Reason
}

// UpstreamAuth: an upstream refused the gateway's own credentials (401) or
// the request (403). It is the operator's problem, not the tenant's: the
// client never sees the provider's message, which may describe its key.
type UpstreamAuth struct {
	Upstream string
	Status   int
}

func (e *UpstreamAuth) Error() string {
	return fmt.Sprintf("upstream %s refused the gateway's credentials (status %d)", e.Upstream, e.Status)
}

// RetriesExhausted: an upstream answered every attempt with a transient
// failure (a 503, a 529, a 429, a 500) until the retries ran out — their
// attempts, the deadline or the retry budget. The client gets the
// upstream's status and error.type, which the SDKs raise their error
// types on, with a message that says what the gateway did.
type RetriesExhausted struct {
	Upstream string
	// Status is the upstream's last answer's; Class and Reason its
	// classification (classify's).
	Status   int
	Class    string
	Reason   string
	Attempts int
	// RetryAfter is the wait the upstream asked for in its last answer
	// (0: none).
	RetryAfter time.Duration
	// Body is the upstream's last error body: its error.type, error.code,
	// error.param and error.message are kept (OpenAI's
	// {"error":{...}}, Anthropic's {"type":"error","error":{...}}); any
	// other body (HTML from a proxy) keeps none.
	Body []byte
	// Header is the upstream's relayed headers, sent on.
	Header http.Header
}

func (e *RetriesExhausted) Error() string {
	return fmt.Sprintf("upstream %s: %s after %d attempts", e.Upstream, e.Reason, e.Attempts)
}

// ClientDeadline: the client's own deadline (X-Llmgate-Deadline) passed
// before its answer; a keyed call goes on and is committed, so a retry with
// the same key gets it.
type ClientDeadline struct{ Keyed bool }

func (e *ClientDeadline) Error() string { return "the client's deadline passed" }

// NotStored is what a retry gets for a key whose answer was served but was
// too large to store: never a second, different answer.
type NotStored struct {
	Size int64
	At   time.Time
}

func (*NotStored) Error() string { return "idempotency result not stored" }

// ClientLimited: the request's client is over one of its own limits
// (clients[].limits, client_limits); it never reached an upstream.
type ClientLimited struct {
	Client     string
	Limit      Limit
	RetryAfter time.Duration
}

// Limit names one of a client's limits.
type Limit string

// The per-client limits.
const (
	LimitRate        Limit = "rate"        // requests_per_second, burst
	LimitConcurrency Limit = "concurrency" // max_concurrent
	LimitStorage     Limit = "storage"     // max_stored_bytes
)

func (e *ClientLimited) Error() string {
	return fmt.Sprintf("client %q over its %s limit", e.Client, e.Limit)
}

// BudgetExceeded: the request's client has spent one of its budgets
// (clients[].budgets, tokens_per_minute) until Reset, when its window
// starts again; the request never reached an upstream.
type BudgetExceeded struct {
	Client string
	// Budget is its id (window.unit.count[.model]); What says it in words;
	// Window is its kind (minute, day, month).
	Budget, What, Window string
	Reset                time.Time
	RetryAfter           time.Duration
	// Figures, when the counter could be read after the refusal, are why
	// the request did not fit; nil when it could not.
	Figures *BudgetFigures
	// Never: the request's reservation (Figures.Needs) is over the
	// budget's whole limit, so no reset makes room for it.
	Never bool
}

// BudgetFigures are a refused budget's counter in its window: tokens, or
// micro-units of money when Cost.
type BudgetFigures struct {
	Spent, Held, Limit int64
	// Needs is the refused request's reservation.
	Needs int64
	Cost  bool
}

// amount writes v as the message shows it: tokens as an integer, money
// in currency units with six decimals.
func (f *BudgetFigures) amount(v int64) string {
	if !f.Cost {
		return strconv.FormatInt(v, 10)
	}
	sign := ""
	if v < 0 {
		sign, v = "-", -v
	}
	return fmt.Sprintf("%s%d.%06d", sign, v/1_000_000, v%1_000_000)
}

func (e *BudgetExceeded) Error() string {
	return fmt.Sprintf("client %q: budget %s spent until %s", e.Client, e.Budget, e.Reset.UTC().Format(time.RFC3339))
}

// UnmeteredRefused: a budgeted client's passthrough call that the
// provider bills without usage the gateway can charge as it runs
// (config.SpendsUnmetered); the operator has not allowed such calls
// (budgets.allow_unmetered, clients[].allow_unmetered). It never reached
// an upstream.
type UnmeteredRefused struct {
	Client, Method, Path string
}

func (e *UnmeteredRefused) Error() string {
	return fmt.Sprintf("client %q: %s %s spends unmetered", e.Client, e.Method, e.Path)
}

// BudgetUnavailable: the budget store could not be reached, and a
// budgeted client's request is refused (budgets.on_store_error: refuse).
type BudgetUnavailable struct{ Err error }

func (e *BudgetUnavailable) Error() string { return "budget store unavailable: " + errString(e.Err) }
func (e *BudgetUnavailable) Unwrap() error { return e.Err }

// BudgetResetHeader carries a budget_exceeded refusal's reset time
// (RFC 3339, UTC).
const BudgetResetHeader = "X-Llmgate-Budget-Reset"

// ClientGone: the client left before the gateway answered (nginx's 499).
var ClientGone = &clientGone{}

type clientGone struct{}

func (*clientGone) Error() string { return "client closed the request" }
func (*clientGone) Unwrap() error { return context.Canceled }

// TooLarge: a request body over the limit.
type TooLarge struct{ Limit int64 }

func (e *TooLarge) Error() string { return fmt.Sprintf("request body over %d bytes", e.Limit) }

// KeyReused: the Idempotency-Key was used with another body (422).
type KeyReused struct{}

func (*KeyReused) Error() string { return "idempotency key reused with a different body" }

// KeyInFlight: the key's first request is still running and the wait for
// it ended (409, retry later).
type KeyInFlight struct{}

func (*KeyInFlight) Error() string { return "idempotency key in flight" }

// KeyTakenOver: the key's lease was found held by another owner, or gone,
// while its call was failing, so it made no further attempt and nothing
// of it can be committed (503, retry with the same key). RetryAfter is
// the last attempt's upstream's (the client waits at least 1 s); Err is
// its failure, for the log.
type KeyTakenOver struct {
	RetryAfter time.Duration
	Err        error
}

func (e *KeyTakenOver) Error() string {
	return "idempotency key taken over while retrying: " + errString(e.Err)
}
func (e *KeyTakenOver) Unwrap() error { return e.Err }

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// Wire maps any error to what the client gets. It is the one place a
// status, an error type/code, Retry-After and x-should-retry are chosen for
// a typed error; an *Error passes through; anything unknown is a 500 whose
// detail stays in the log. The vocabulary reads in three switches: the
// upstream's failures, the idempotency store's, and the client's own.
func Wire(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	for _, wire := range []func(error) *Error{upstreamWire, storeWire, clientWire} {
		if e := wire(err); e != nil {
			return e
		}
	}
	return &Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error",
		Message: "The gateway failed to handle the request; see its log for details.", Err: err}
}

// upstreamWire maps the errors of a call no upstream answered usefully;
// nil for any other.
func upstreamWire(err error) *Error {
	var (
		bo *BreakerOpen
		tr *Transport
		ba *BadAnswer
		ua *UpstreamAuth
		re *RetriesExhausted
	)
	switch {
	case errors.As(err, &re):
		return retriesExhausted(re)
	case errors.As(err, &bo):
		return &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "upstream_unavailable",
			Message:    bo.what() + " is unavailable: its circuit breaker is open. Retry after the Retry-After interval.",
			RetryAfter: bo.RetryAfter, Err: bo.Err}
	case errors.As(err, new(*DeadlineSpent)):
		return &Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "deadline_exceeded",
			Message: "The request's deadline passed before an upstream could be tried."}
	case errors.As(err, &tr):
		if tr.Timeout {
			return &Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "upstream_timeout",
				Message: fmt.Sprintf("Upstream %s timed out.", tr.Upstream), Err: errors.New(tr.Reason)}
		}
		return &Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unreachable",
			Message: fmt.Sprintf("Upstream %s could not be reached (%s).", tr.Upstream, tr.Reason), Err: errors.New(tr.Reason)}
	case errors.As(err, &ba):
		return &Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_bad_response",
			Message: fmt.Sprintf("Upstream %s answered 2xx with no usable answer (%s), also after the retries.", ba.Upstream, ba.Reason), Err: err}
	case errors.As(err, &ua):
		return &Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_auth_failed",
			Message: fmt.Sprintf("Upstream %s refused the gateway's credentials. This is the gateway operator's to fix, not your API key; retrying will not help.", ua.Upstream),
			Err:     err}
	}
	return nil
}

// storeWire maps the idempotency store's errors and a key's states; nil
// for any other.
func storeWire(err error) *Error {
	var (
		su *StoreUnavailable
		ns *NotStored
		kt *KeyTakenOver
	)
	switch {
	case errors.As(err, new(*CommitFailed)):
		return commitFailed(err)
	case errors.As(err, new(*StoreFull)) || isStoreFull(err):
		return storeFull(err)
	case errors.As(err, &su):
		return &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "idempotency_store_unavailable",
			Message:    "The idempotency store is unavailable, so this keyed request was not run (it would not be protected against duplicates). Retry later.",
			RetryAfter: time.Second, Err: su.Err}
	case errors.As(err, &ns):
		return &Error{Status: http.StatusGone, Type: "invalid_request_error", Code: "idempotency_result_not_stored", Param: "Idempotency-Key",
			Message: fmt.Sprintf("The answer to this Idempotency-Key was served once (%d bytes, at %s) but was too large for the gateway to store, "+
				"so it cannot be replayed; it is not run again either. Use a new key to run the request again.", ns.Size, ns.At.UTC().Format(time.RFC3339))}
	case errors.As(err, new(*KeyReused)):
		return &Error{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Code: "idempotency_key_reused", Param: "Idempotency-Key",
			Message: "This Idempotency-Key was already used for a different request body. Use a new key for a new request, or resend the original body."}
	case errors.As(err, &kt):
		return &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "idempotency_key_taken_over", Param: "Idempotency-Key",
			Message: "This request's idempotency key (sent, or derived from its session) was taken over while the gateway was retrying it " +
				"(its lease ran out or the store lost it), so no answer of this call could be committed. " +
				"Retry with the same key: you get the answer of the call that now holds it, or it runs again.",
			RetryAfter: max(time.Second, kt.RetryAfter), ShouldRetry: true, Err: err}
	case errors.As(err, new(*KeyInFlight)):
		return &Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "idempotency_key_in_flight", Param: "Idempotency-Key",
			Message:    "A request with this Idempotency-Key is still in progress. Retry after the Retry-After interval to get its result.",
			RetryAfter: time.Second, ShouldRetry: true}
	}
	return nil
}

// clientWire maps what the client itself caused: its deadline, its
// limits, its departure, its body's size; nil for any other.
func clientWire(err error) *Error {
	var (
		cd *ClientDeadline
		cl *ClientLimited
		tl *TooLarge
	)
	switch {
	case errors.As(err, &cd):
		msg := "The request's " + "X-Llmgate-Deadline passed before the answer."
		if cd.Keyed {
			msg += " The call goes on and is committed under its Idempotency-Key: retry with the same key to get it."
		} else {
			msg += " Retry it."
		}
		return &Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "client_deadline_exceeded",
			Message: msg, ShouldRetry: true, Err: err}
	case errors.As(err, &cl):
		return clientLimited(cl)
	case errors.As(err, new(*BudgetExceeded)) || errors.As(err, new(*BudgetUnavailable)):
		return budgetRefused(err)
	case errors.As(err, new(*UnmeteredRefused)):
		return unmeteredRefused(err)
	case errors.Is(err, ClientGone):
		return &Error{Status: 499, Type: "invalid_request_error", Code: "client_closed_request",
			Message: "The client closed the request.", Err: context.Canceled}
	case errors.As(err, &tl):
		return &Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
			Message: fmt.Sprintf("Request body exceeds the gateway's limit of %d bytes.", tl.Limit)}
	}
	return nil
}

func isStoreFull(err error) bool {
	var f storeFuller
	return errors.As(err, &f) && f.StoreFull()
}

// storeFull is a 503 that says the store is full, not broken: replays of
// committed keys and requests without a key still work, so the client can
// tell "retry later" from "the gateway is down".
func storeFull(err error) *Error {
	retry := 30 * time.Second
	var sf *StoreFull
	if errors.As(err, &sf) && sf.RetryAfter > 0 {
		retry = sf.RetryAfter
	}
	return &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "idempotency_store_full",
		Message: "The gateway's idempotency store is full, so this keyed request was not run (its answer could not be stored). " +
			"Retry after the Retry-After interval. Replays of committed keys, and requests without an Idempotency-Key, still work.",
		RetryAfter: retry, Err: err}
}

// commitFailed says what happened to a keyed request whose answer could not
// be stored: unlike a failure at the claim, the call did run, and its retry
// may run (and be billed) again. The code is the one a failure at the claim
// gets (full or unavailable), so a client's handling of it is unchanged.
func commitFailed(err error) *Error {
	const ran = "This keyed request was run (the provider may have billed it), but its answer could not be stored: "
	const retry = " A retry with the same Idempotency-Key runs it again and may be billed again."
	if isStoreFull(err) {
		e := storeFull(err)
		e.Message = ran + "the gateway's idempotency store is full." + retry + " Retry after the Retry-After interval."
		return e
	}
	return &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "idempotency_store_unavailable",
		Message:    ran + "the idempotency store failed." + retry + " Retry later.",
		RetryAfter: time.Second, Err: err}
}

// clientLimited is a 429 in OpenAI's rate-limit shape: error.type names
// what is limited ("requests", as OpenAI's own, or "storage"). A later
// retry of a rate or concurrency 429 succeeds without the gateway having
// retried anything, so x-should-retry is true; a storage quota frees
// itself only as records expire (Retry-After, often hours), so it is false.
func clientLimited(cl *ClientLimited) *Error {
	e := &Error{Status: http.StatusTooManyRequests, Type: "requests", RetryAfter: cl.RetryAfter, ShouldRetry: true, Err: cl}
	switch cl.Limit {
	case LimitRate:
		e.Code = "client_rate_limited"
		e.Message = "Rate limit reached for this API key's requests per second at the gateway. Retry after the Retry-After interval."
	case LimitConcurrency:
		e.Code = "client_concurrency_limited"
		e.Message = "This API key has as many requests in flight at the gateway as it may (keyed calls still finishing after their client stopped waiting count too). Retry when one has finished."
	default:
		e.Type, e.Code, e.ShouldRetry = "storage", "client_storage_quota_exceeded", false
		e.Message = "This API key's stored answers and objects have reached its storage quota at the gateway, so new requests with an Idempotency-Key, " +
			"and requests that create objects at the provider under the gateway's shared key (uploads, stored responses, batches…), are refused until older ones expire (Retry-After) " +
			"or the operator raises the quota. Replays of committed keys, and other requests without an Idempotency-Key, still work."
	}
	return e
}

// budgetRefused is a spent budget's 429, or the 503 of a budget store
// that cannot be reached. A spent budget frees itself only when its
// window resets (Retry-After, often hours): x-should-retry is false, so
// no SDK retries it, and the gateway never does; X-Llmgate-Outcome says
// quota, so a chained llmgate does not either.
func budgetRefused(err error) *Error {
	var be *BudgetExceeded
	if errors.As(err, &be) && be.Never {
		f := be.Figures
		needs := f.amount(f.Needs)
		if !f.Cost {
			needs += " tokens"
		}
		return &Error{Status: http.StatusBadRequest, Type: "budget", Code: "budget_request_too_large", Param: "max_tokens", Err: err,
			Header: http.Header{OutcomeHeader: {OutcomeQuota}},
			Message: fmt.Sprintf("This request needs %s of this API key's budget at the gateway (%s), more than the whole budget, so it can never fit, "+
				"in this window or the next. Lower max_tokens (or n), or send a shorter prompt. The request was not sent to any provider.",
				needs, be.What)}
	}
	if errors.As(err, &be) {
		reset := be.Reset.UTC().Format(time.RFC3339)
		return &Error{Status: http.StatusTooManyRequests, Type: "budget", Code: "budget_exceeded", RetryAfter: be.RetryAfter, Err: err,
			Header:  http.Header{BudgetResetHeader: {reset}, OutcomeHeader: {OutcomeQuota}},
			Message: budgetMessage(be, reset)}
	}
	return &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "budget_store_unavailable", RetryAfter: time.Second, Err: err,
		Message: "The gateway's budget store is unavailable, so this API key's spend cannot be checked against its budget and the request was not run. Retry later."}
}

// unmeteredRefused is the 403 of a budgeted client's call that would
// spend where no budget sees it. Only the operator's config changes
// that: x-should-retry false, X-Llmgate-Outcome quota.
func unmeteredRefused(err error) *Error {
	var ur *UnmeteredRefused
	errors.As(err, &ur)
	return &Error{Status: http.StatusForbidden, Type: "budget", Code: "budget_unmetered_endpoint", Err: err,
		Header: http.Header{OutcomeHeader: {OutcomeQuota}},
		Message: fmt.Sprintf("%s %s makes the provider spend without usage the gateway can charge to a budget as the call runs "+
			"(it reports it later, or not at all), and this API key has a budget at the gateway, so the request was not sent to any provider. "+
			"The gateway's operator can allow such calls with budgets.allow_unmetered: true (every budgeted key) or "+
			"clients[].allow_unmetered: true (this key); they then run uncharged.", ur.Method, ur.Path)}
}

// budgetMessage says why be's request did not fit (its figures, when
// known) and when the budget resets, in words.
func budgetMessage(be *BudgetExceeded, reset string) string {
	why := "is spent"
	if f := be.Figures; f != nil {
		why = fmt.Sprintf("has no room for this request: %s spent and %s held by requests in flight, of a limit of %s; this request needs %s",
			f.amount(f.Spent), f.amount(f.Held), f.amount(f.Limit), f.amount(f.Needs))
	}
	in := be.RetryAfter.Round(time.Second)
	if in < be.RetryAfter {
		in += time.Second
	}
	msg := fmt.Sprintf("This API key's budget at the gateway (%s) %s. It resets at %s (in %s), when the next UTC %s starts. "+
		"The request was not sent to any provider", be.What, why, reset, in, be.Window)
	if be.Figures != nil && be.Figures.Held > 0 {
		return msg + "; unless the requests in flight settle below what they hold, retrying before then will not help."
	}
	return msg + "; retrying before then will not help."
}

// OutcomeHeader says how the gateway classified the answer it sends
// (classify.Outcome.Header); on the gateway's own refusals that no retry
// fixes it is OutcomeQuota, which a chained llmgate reads as a quota
// error whatever the status.
const (
	OutcomeHeader = "X-Llmgate-Outcome"
	OutcomeQuota  = "quota"
)

// Body renders e in OpenAI's error shape.
func Body(e *Error) []byte {
	b, _ := json.Marshal(wireError{Error: wireBody{
		Message: e.Message, Type: e.Type, Param: nullable(e.Param), Code: nullable(e.Code),
	}})
	return b
}

type wireError struct {
	Error wireBody `json:"error"`
}

type wireBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Write maps err and writes it to w: the one place a gateway error becomes
// an HTTP response.
func Write(w http.ResponseWriter, err error) *Error {
	e := Wire(err)
	SetHeader(w.Header(), e)
	w.WriteHeader(e.Status)
	_, _ = w.Write(Body(e))
	return e
}

// SetRetry writes what a client's SDK reads to decide on a retry of its
// own: x-should-retry (the gateway is the retry layer, so SDKs that honour
// it do not multiply its retries) and, when retryAfter > 0, Retry-After.
// It is the one place the gateway writes either header; a relayed
// answer's own Retry-After (headers.Response) is the provider's.
func SetRetry(h http.Header, shouldRetry bool, retryAfter time.Duration) {
	if retryAfter > 0 {
		h.Set("Retry-After", RetryAfterSeconds(retryAfter))
	}
	h.Set("X-Should-Retry", strconv.FormatBool(shouldRetry))
}

// StreamEvent is the SSE event that ends a stream which broke after its
// first byte reached the client: OpenAI's error shape, so SDKs raise an
// error instead of seeing a clean-looking end.
func StreamEvent(msg, code string) []byte {
	b := Body(&Error{Type: "server_error", Code: code, Message: msg})
	out := make([]byte, 0, len(b)+8)
	out = append(out, "data: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// TypedStreamEvent is StreamEvent for a stream of typed events (the
// Responses API): an "error" event, `event: error` with OpenAI's
// {"type":"error","code","message","param"} as its data. The data also
// carries the error object under "error", because that is what the
// official SDKs (openai-python, openai-go, openai-node) raise on; without
// it they would yield the event and take the stream as cleanly ended.
func TypedStreamEvent(msg, code string) []byte {
	e := wireBody{Message: msg, Type: "server_error", Code: nullable(code)}
	b, _ := json.Marshal(struct {
		Type    string   `json:"type"`
		Code    *string  `json:"code"`
		Message string   `json:"message"`
		Param   *string  `json:"param"`
		Error   wireBody `json:"error"`
	}{"error", e.Code, msg, nil, e})
	out := make([]byte, 0, len(b)+22)
	out = append(out, "event: error\ndata: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// RetryAfterSeconds renders d as whole seconds, rounded up, at least 1.
func RetryAfterSeconds(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}
