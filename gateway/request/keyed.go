package request

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/admission"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/budget"
	"github.com/llmgate/llmgate/gateway/deadletter"
	"github.com/llmgate/llmgate/gateway/idempotency"
	"github.com/llmgate/llmgate/gateway/limits"
	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/proxy"
	"github.com/llmgate/llmgate/gateway/sse"
)

// keyFor decides whether a request is keyed, and by what: the client's
// Idempotency-Key; else a key derived from its session header when its
// client derives one (derivedKey); else a key derived from the body when
// content-keyed caching is on for the upstream (or the request says
// X-Llmgate-Cache: on).
func (g *Handler) keyFor(r *http.Request, ep endpoint, u *proxy.Upstream, body []byte) (*idempotency.Request, error) {
	scope := ClientOf(r)
	if hv, ok := r.Header["Idempotency-Key"]; ok {
		if len(hv) != 1 {
			return nil, apierror.Invalid("", "Send exactly one Idempotency-Key header.")
		}
		key, err := idempotency.ParseKey(hv[0])
		if err != nil {
			return nil, apierror.InvalidCode("invalid_idempotency_key", "", err.Error()+".", err)
		}
		fp, err := fingerprint(r, ep, body)
		if err != nil {
			return nil, err
		}
		return &idempotency.Request{
			Key: cache.Key{Scope: scope, Endpoint: ep.path, ID: key},
			Raw: key, Fingerprint: fp, TTL: g.cfg.Idempotency.TTL.D(), ErrorBody: ep.api.ErrorBody, StreamUsage: ep.api.RecordedUsage(),
		}, nil
	}
	// A derived key stands for the key the agent would send if it could:
	// the operator opted this client in, so it also meets require_key.
	if kr, err := g.derivedKey(r, ep, body); kr != nil || err != nil {
		return kr, err
	}
	if g.cfg.Idempotency.RequireKey {
		return nil, apierror.InvalidCode("idempotency_key_required", "",
			"This gateway requires an Idempotency-Key header on every POST. Name the business operation, e.g. order-4711/summarize.", nil)
	}
	on := u.Cfg.Cache
	switch strings.ToLower(r.Header.Get(idempotency.CacheHeader)) {
	case "on":
		on = true
	case "off":
		on = false
	}
	if !on {
		return nil, nil
	}
	cc := strings.ToLower(r.Header.Get("Cache-Control"))
	if strings.Contains(cc, "no-cache") {
		return nil, nil
	}
	fp, err := fingerprint(r, ep, body)
	if err != nil {
		return nil, nil // not cached: caching saves calls, it is no guarantee a client asked for
	}
	return &idempotency.Request{
		Key:         cache.Key{Scope: scope, Endpoint: ep.path, ID: contentCacheID(r, fp)},
		Fingerprint: fp,
		TTL:         g.cfg.Idempotency.CacheTTL.D(),
		Cache:       true,
		NoStore:     strings.Contains(cc, "no-store"),
		ErrorBody:   ep.api.ErrorBody,
		StreamUsage: ep.api.RecordedUsage(),
	}, nil
}

// derivedKey is the key of a request without an Idempotency-Key whose
// client derives one from a session header (clients[].derive_idempotency_key):
// idempotency.DerivedKey of the header's values and the request's
// fingerprint, in the client's scope, narrowed to a forwarded tenant so
// that two tenants of a chained gateway never share one. nil when the
// client derives none, or the request has no such header or only an
// empty one. Headers that change on an SDK's own retry
// (x-stainless-retry-count) are in neither: the fingerprint covers only
// the body, the headers its API names and the query.
func (g *Handler) derivedKey(r *http.Request, ep endpoint, body []byte) (*idempotency.Request, error) {
	scope := ClientOf(r)
	name := g.derive[scope]
	if name == "" {
		return nil, nil
	}
	session := r.Header.Values(name)
	if len(session) == 0 || len(session) == 1 && strings.TrimSpace(session[0]) == "" {
		return nil, nil
	}
	fp, err := fingerprint(r, ep, body)
	if err != nil {
		return nil, err
	}
	id := idempotency.DerivedKey(forwardedTenant(r), session, fp)
	return &idempotency.Request{
		Key: cache.Key{Scope: scope, Endpoint: ep.path, ID: id}, Raw: id, Fingerprint: fp, Derived: true,
		TTL: g.cfg.Idempotency.TTL.D(), ErrorBody: ep.api.ErrorBody, StreamUsage: ep.api.RecordedUsage(),
	}, nil
}

// fingerprint is what a key's request is compared by: its body, the
// headers its API says change the answer (anthropic-version,
// anthropic-beta), and the query when it is forwarded. A body it cannot
// fingerprint within its bound is a 400 (fingerprintError).
func fingerprint(r *http.Request, ep endpoint, body []byte) (string, error) {
	fp, err := idempotency.Fingerprint(body)
	if err != nil {
		return "", fingerprintError(err)
	}
	fp = idempotency.WithHeaders(fp, r.Header, ep.api.Fingerprinted())
	if ep.query {
		fp = idempotency.WithQuery(fp, r.URL.RawQuery)
	}
	return fp, nil
}

// fingerprintError is the 400 of a keyed request whose body has more
// object members at once than its fingerprint takes
// (idempotency.MaxMembers).
func fingerprintError(err error) error {
	return apierror.InvalidCode("too_many_members", "", fmt.Sprintf("This request is keyed (by its Idempotency-Key, or by one "+
		"derived from its session), and its body cannot be compared with a retry's: %v. Send fewer members, or send it unkeyed.", err), err)
}

// serveKeyed runs a keyed request: replay a committed response, wait for
// an in-flight duplicate, or claim the key and run the call.
func (g *Handler) serveKeyed(x *exchange, kr *idempotency.Request) error {
	w, r, cl, dl, s := x.w, x.req, x.call, x.dl, x.sum
	s.idemKey = idempotency.HashKey(kr.Key)
	kr.Model = cl.Model
	if kr.Derived {
		s.keySource = "derived"
		w.Header().Set(idempotency.DerivedHeader, "derived")
	}
	// A duplicate of a stream running here joins it (live.go); it stores
	// nothing, so the store's space and the client's quota do not apply.
	if l := g.live.get(kr.Key); l != nil && l.joinable(kr.Fingerprint) {
		if joined, err := g.join(x, kr, l); joined {
			return err
		}
	}
	if kr.Cache {
		s.cache = "miss"
		w.Header().Set(idempotency.CacheHeader, "miss")
	}
	// Over its storage quota a client's keyed request is refused before
	// its claim, unless it replays a committed answer or waits for the
	// same key in flight (which stores nothing new); a content-cached one
	// is looked up and otherwise served without being stored.
	// The same holds while the store is full (space.go).
	if err := g.spaceCheck(kr); err != nil {
		if done, lerr := g.refusedUnlessStored(x, kr, err); done {
			return lerr
		}
	} else if err := g.storageCheck(kr); err != nil {
		if done, lerr := g.refusedUnlessStored(x, kr, err); done {
			return lerr // a refusal's class is client_limited (outcome.ErrorClass)
		}
	}
	if kr.NoStore {
		if ok, _, lerr := g.lookup(x, kr); ok || lerr != nil {
			return lerr
		}
		return g.serveUnkeyed(x)
	}
	x.live, x.unlive = g.goLive(cl, kr)
	claimed := false
	defer func() {
		if !claimed {
			x.unlive() // the call is not this request's to run (or Claim panicked)
		}
	}()
	lease, ev, err := g.keeper.Claim(w, r, kr, dl.client)
	claimed = lease != nil && err == nil
	if ev.Class != "" {
		s.replay(ev, kr)
	}
	var su *apierror.StoreUnavailable
	if kr.Cache && errors.As(err, &su) {
		return g.serveUncached(x)
	}
	if err != nil || lease == nil {
		return err
	}
	return g.runClaimed(x, kr, lease)
}

// lookup replays the committed answer of a keyed request that claims
// nothing (Keeper.Lookup): true once replayed; inFlight when the same key
// and body are in flight; an error, the store's, for the caller to return.
func (g *Handler) lookup(x *exchange, kr *idempotency.Request) (ok, inFlight bool, err error) {
	ev, ok, err := g.keeper.Lookup(x.w, x.req, kr)
	if ok {
		x.sum.replay(ev, kr)
	}
	return ok, ev.InFlight, err
}

// refusedUnlessStored answers a keyed request that may store nothing new
// (refusal: the store is full, its client over its quota) from the store
// when it can: a committed answer is replayed (done, nil), and a store
// error is returned (done). The same key and body in flight is no new
// storage: the request goes on to claim it with kr.Refused set, so that
// it waits for that call's answer, as any duplicate does, instead of
// giving up on an answer already paid for (done false). Otherwise it is
// refused (done, refusal).
func (g *Handler) refusedUnlessStored(x *exchange, kr *idempotency.Request, refusal error) (done bool, err error) {
	ok, inFlight, err := g.lookup(x, kr)
	switch {
	case ok || err != nil:
		return true, err
	case inFlight && !kr.NoStore:
		kr.Refused = refusal
		return false, nil
	}
	return true, refusal
}

// serveUncached serves a content-cached request whose claim found the
// store down: content-keyed caching saves calls; it is not a guarantee a
// client asked for, so with the store down it is skipped, not required.
// Served unkeyed, it records nothing: a duplicate must not join it (it
// would wait for a status that never comes).
func (g *Handler) serveUncached(x *exchange) error {
	x.sum.cache = "unavailable"
	x.w.Header().Del(idempotency.CacheHeader)
	x.unlive()
	x.live, x.unlive = nil, func() {}
	return g.serveUnkeyed(x)
}

// storageCheck is the client's storage quota for a request that would
// store: over it, a content-cached request becomes no-store (caching saves
// calls; it is no guarantee a client asked for) and passes.
func (g *Handler) storageCheck(kr *idempotency.Request) error {
	if kr.NoStore {
		return nil
	}
	err := g.limits.CheckStorage(kr.Key.Scope)
	if err != nil && kr.Cache {
		kr.NoStore = true
		return nil
	}
	return err
}

// runClaimed runs a claimed key's call. The call outlives the client: it
// runs detached from the client's context and bounded by the operator's
// deadline, so that when the client leaves or its own deadline passes
// (often shorter than the model's latency) the call still finishes and
// commits, and the client's retry gets this answer instead of paying for a
// second, different one. The handler waits for it, or for the client's
// deadline: with a deadline of the client's the call runs on a goroutine
// of its own (the handler returns at the deadline); without one, on the
// handler's (runHere).
func (g *Handler) runClaimed(x *exchange, kr *idempotency.Request, lease *idempotency.Lease) error {
	w, r, cl, dl, s, hd := x.w, x.req, x.call, x.dl, x.sum, x.held
	work, it, done := g.work.start(r.Context(), dl.operator)
	// The call holds its client's concurrency slot and its body's bytes
	// until it ends, also after the handler has returned.
	held := hd.take()
	g.keyCall(cl, kr, lease)
	hk := hooksOf(r.Context())
	live, unlive := x.live, x.unlive
	k := &keyedCall{g: g, h: newHandoff(w, r, live, g.cfg.Server.WriteStallTimeout.D()), cl: cl, kr: kr, lease: lease, work: work, start: g.now(), s: *s, hooks: hk,
		out: x.out}
	cl.Source.Hold() // a spooled body outlives the handler while the call runs on
	call := func() workEnd { return k.runHeld(live, unlive, done, held) }
	finish := func(e workEnd) error {
		*s = k.s
		if e.panic != nil {
			panic(e.panic)
		}
		return e.err
	}
	deadline, stop := g.clientDeadline(dl, hk)
	defer stop()
	if deadline == nil {
		// No deadline of the client's to answer at: the handler waits for
		// the call whatever happens, so it runs the call itself.
		return finish(g.runHere(r, it, k, s, call))
	}
	ended := make(chan workEnd, 1)
	g.callers.run(func() { ended <- call() })
	gone := r.Context().Done()
	for {
		select {
		case e := <-ended:
			return finish(e)
		case <-deadline:
			select {
			case e := <-ended: // it finished as the deadline passed
				return finish(e)
			default:
			}
			hk.call(hk.Cutting)
			// Detached only if the answer is not out whole (see clientLeft).
			abort, delivered := k.h.end(func(w http.ResponseWriter, wrote bool) bool {
				return endAtClientDeadline(w, wrote, g.detach(it, s), cl)
			})
			hk.call(hk.Cut)
			if delivered {
				// The whole answer went out first; only its settling was
				// left, and that is done.
				return finish(<-ended)
			}
			k.cut.Store(true)
			s.class = "client_deadline"
			s.idemEvent = "detached" // the call runs on, to be committed
			if abort {
				panic(http.ErrAbortHandler)
			}
			return nil
		case <-gone:
			// The handler waits for the call, so the log line says how it
			// ended.
			gone = nil
			g.clientLeft(it, k, s)
		}
	}
}

// runHeld runs the call, then gives back what it held: its lease's
// renewal, its client's slot and body bytes (held), its registration as a
// live stream (unlive) and in the work set (done), and its spooled body.
func (k *keyedCall) runHeld(live *liveStream, unlive, done, held func()) workEnd {
	defer k.cl.Source.Close()
	defer done()
	defer unlive()
	defer held()
	k.lease.Renew(k.work)
	defer k.lease.StopRenewing()
	e := k.run()
	k.h.over()
	if e.panic != nil && live != nil {
		live.abort()
	}
	// Unregistered before the handler can answer: the client's next
	// request with the key must not join a stream that has ended.
	unlive()
	return e
}

// keyCall readies cl for its key: the key forwarded upstream (a derived
// one of the client's, not a content-cache entry's), and the lease whose
// loss stops the call's retries — not a content-cache entry's, which is no
// guarantee a client asked for: its call retries as any.
func (g *Handler) keyCall(cl *proxy.Call, kr *idempotency.Request, lease *idempotency.Lease) {
	if kr.Raw != "" {
		cl.IdemKey = g.forwardMAC.ForwardKey(kr.Key)
	}
	if !kr.Cache {
		cl.Lease = lease
	}
}

// clientLeft is what a keyed call's client leaving does: the call goes on,
// counted as detached, and its writes go nowhere from now on, so nothing
// it writes later can pass for an answer the client received. A client
// that left once its whole answer was out leaves a call that is only
// settling: it is not detached (it takes no slot, evicts no other
// client's call at the cap). end calls detach under the handoff's lock;
// detach takes only the work set's, and cancels.
func (g *Handler) clientLeft(it *workItem, k *keyedCall, s *summary) {
	k.h.end(func(http.ResponseWriter, bool) bool {
		g.detach(it, s)
		return false
	})
	k.hooks.call(k.hooks.Left)
}

// runHere runs a keyed call on the handler's goroutine, for a client
// with no deadline of its own: nothing can make the handler return before
// the call ends, so the call needs no goroutine of its own. Should the
// client leave, clientLeft runs, as in runClaimed's loop, and is done
// before runHere returns, so the handoff is never touched after the
// handler has.
func (g *Handler) runHere(r *http.Request, it *workItem, k *keyedCall, s *summary, call func() workEnd) workEnd {
	left := make(chan struct{})
	stop := context.AfterFunc(r.Context(), func() {
		defer close(left)
		g.clientLeft(it, k, s)
	})
	defer func() {
		if !stop() {
			<-left
		}
	}()
	return call()
}

// clientDeadline is the timer of the client's X-Llmgate-Deadline (nil when
// it sent none), or a test's channel in its place.
func (g *Handler) clientDeadline(dl deadlines, hk *CallHooks) (<-chan time.Time, func()) {
	if hk.Deadline != nil {
		return hk.Deadline, func() {}
	}
	if dl.client.IsZero() {
		return nil, func() {}
	}
	t := time.NewTimer(dl.client.Sub(g.now()))
	return t.C, func() { t.Stop() }
}

// CallHooks let a test stop a keyed call at each point of its settlement
// and pass the client's deadline there, without sleeping. A request
// carries them in its context (WithCallHooks); without them every field
// is nil and nothing happens.
type CallHooks struct {
	// Deadline replaces the timer of X-Llmgate-Deadline.
	Deadline <-chan time.Time
	// At is called by the call at each SettlePoint.
	At func(SettlePoint)
	// Cutting is called by the handler when the deadline has passed,
	// before it ends the handoff (a joiner's, before it acts on it); Cut
	// once it has ended it.
	Cutting, Cut func()
	// Left is called once the handler has acted on its client leaving.
	Left func()
}

// SettlePoint names a moment of a keyed call's settlement.
type SettlePoint string

const (
	// PointSettled: the outcome is settled; nothing is committed or sent.
	PointSettled SettlePoint = "settled"
	// PointSent: the whole answer, its held-back tail included, is written.
	PointSent SettlePoint = "sent"
	// PointCommitted: the answer (or its not-stored marker) is committed.
	PointCommitted SettlePoint = "committed"
)

type hooksKey struct{}

// WithCallHooks returns ctx carrying hk, for a test's request.
func WithCallHooks(ctx context.Context, hk *CallHooks) context.Context {
	return context.WithValue(ctx, hooksKey{}, hk)
}

var noHooks = &CallHooks{}

func hooksOf(ctx context.Context) *CallHooks {
	if hk, ok := ctx.Value(hooksKey{}).(*CallHooks); ok {
		return hk
	}
	return noHooks
}

func (hk *CallHooks) call(f func()) {
	if f != nil {
		f()
	}
}

func (hk *CallHooks) point(p SettlePoint) {
	if hk.At != nil {
		hk.At(p)
	}
}

// hold is what a request holds while it runs: its client's concurrency
// slot and the reservation of its body's bytes (limits.max_inflight_bytes).
type hold struct {
	slot *limits.Slot
	body *admission.Reservation
}

// take moves both to a keyed call that may outlive its handler (see
// limits.Slot.Take, admission.Reservation.Take); the call gives them back
// when it ends, with the function returned.
func (h hold) take() (release func()) {
	slot, body := h.slot.Take(), h.body.Take()
	return func() {
		body.Release()
		slot.Release()
	}
}

// detach counts a keyed call as running on without its client; past
// idempotency.max_detached it is cancelled instead (false).
func (g *Handler) detach(it *workItem, s *summary) bool {
	if g.work.detach(it) {
		return true
	}
	g.log.Warn("keyed call cancelled: too many detached calls (idempotency.max_detached)", "idempotency_key", s.idemKey)
	return false
}

// endAtClientDeadline is what the client gets when its X-Llmgate-Deadline
// passes first: a 504 it may retry with the same key, or — when a stream's
// headers are out — one error event in the same words. A JSON answer whose
// headers are out (one too large to buffer, being copied) is aborted: the
// client must not see it end as if whole. goesOn says whether the call runs
// on to be committed.
func endAtClientDeadline(w http.ResponseWriter, wrote, goesOn bool, cl *proxy.Call) (abort bool) {
	err := &apierror.ClientDeadline{Keyed: goesOn}
	if !wrote {
		cl.WriteError(w, err)
		return false
	}
	if !strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
		return true
	}
	e := apierror.Wire(err)
	_, _ = w.Write(cl.StreamEvent(e.Message, e.Code))
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	return false
}

// workEnd is how a keyed call ended: an error for the handler to write,
// or a panic for the handler to re-raise (http.ErrAbortHandler aborts the
// response).
type workEnd struct {
	err   error
	panic any
}

// keyedCall is a claimed keyed request from its upstream call to its end:
// it commits or releases as the settled outcome says. Only its goroutine
// touches it until that ends.
type keyedCall struct {
	g     *Handler
	h     *handoff
	cl    *proxy.Call
	kr    *idempotency.Request
	lease *idempotency.Lease
	work  context.Context
	start time.Time
	s     summary
	// cut: the handler stopped waiting (the client's deadline passed); the
	// call logs its own line when it ends.
	cut atomic.Bool
	// resp is the upstream's answer once there is one.
	resp *proxy.Response
	// hooks are a test's (CallHooks); none otherwise.
	hooks *CallHooks
	// out sizes the call's budget reservation.
	out budget.Output
}

func (k *keyedCall) run() (e workEnd) {
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				k.g.log.Error("panic in keyed call", "panic", fmt.Sprint(p), "idempotency_key", k.s.idemKey)
			}
			// The client never saw the answer end: release the key, and
			// let a breaker waiting on this call go on. A commit whose
			// write panicked (a store's, or its group's leader's) may
			// still have reached the store: the key's retry then replays
			// that answer rather than running again, which the client,
			// having seen no end, cannot tell from a first answer.
			k.lease.Release(k.work)
			if k.resp != nil {
				k.resp.Report(outcome.Dropped())
			}
			e = workEnd{panic: p}
		}
		if k.cut.Load() {
			k.g.log.Info("detached call ended", "idempotency_key", k.s.idemKey, "upstream", k.s.upstream,
				"class", k.s.class, "attempts", k.s.attempts, "committed", k.s.committed, "err", e.err)
		}
	}()
	failpoint("before-upstream")
	hold, err := k.g.reserve(k.work, k.cl, k.out)
	if err != nil {
		// Refused before any upstream call: the key is released, with no
		// dead letter (a replay would be refused the same way).
		k.s.class, k.s.idemEvent = refusedClass(err), "release"
		k.lease.Release(k.work)
		return workEnd{err: err}
	}
	defer func() {
		if hold != nil && isStream(k.h.header) {
			// A stream's held tail went out unflushed, to leave with the
			// response's end; the settlement (a store round trip) comes
			// first, so the stream's end is flushed before it.
			k.h.Flush()
		}
		k.g.settleBudget(k.work, hold, k.cl, k.resp)
	}()
	resp, err := k.g.proxy.Execute(k.work, k.cl)
	if err != nil {
		// It never reached an upstream (or none answered): released at once.
		k.release(outcome.Settle(outcome.Result{Err: err, Tried: k.cl.Tried}))
		return workEnd{err: err}
	}
	k.resp = resp
	k.s.note(resp)
	if err := k.g.handOut(k.work, k.kr.Key.Scope, k.cl, resp); err != nil {
		// Not committed: the ids it would hand out are not recorded.
		k.release(outcome.Dropped())
		return workEnd{err: err}
	}
	if resp.Stream != nil {
		k.stream(resp)
		return workEnd{}
	}
	return workEnd{err: k.json(resp)}
}

// json settles a buffered answer, commits it if it is the model's answer,
// and relays it. A failed commit answers 503 instead: a retry must never
// contradict what the client was given. A body too large to record is
// relayed, and a marker is committed before its response ends.
func (k *keyedCall) json(resp *proxy.Response) error {
	res := resp.Result(k.cl.Tried)
	v := k.settle(resp, res)
	switch v.Action {
	case outcome.Commit:
		failpoint("before-commit")
		rec := &cache.Record{Status: resp.Status, Header: idempotency.RecordHeader(resp.Header, resp.Outcome),
			Body: resp.Body, Upstream: resp.Upstream.Cfg.Name}
		if err := simCommitUnderClient(k); err != nil {
			return err
		}
		if err := k.lease.Commit(k.work, rec); err != nil {
			return err
		}
		k.s.idemEvent = "commit"
		k.g.limits.Committed(k.kr.Key.Scope, rec.StoredSize(), k.kr.TTL)
		k.resolved()
		failpoint("after-commit")
		k.hooks.point(PointCommitted)
	case outcome.Deliver:
		return k.deliverJSON(resp, res, v)
	default:
		k.release(v)
		if resp.Abandoned {
			// It stopped retrying for the takeover: the client is told
			// to retry with the key, not that retries were used up.
			resp.Discard()
			k.s.idemEvent = "taken_over"
			return &apierror.KeyTakenOver{RetryAfter: resp.Outcome.RetryAfter,
				Err: fmt.Errorf("upstream %s: status %d, %s", resp.Upstream.Cfg.Name, resp.Status, resp.Outcome.Class)}
		}
	}
	err := proxy.WriteJSON(k.h, resp, v, nil)
	k.hooks.point(PointSent)
	return err
}

// settle settles resp (the chain's result res): its breaker learns the
// verdict, its usage is counted, its class noted.
func (k *keyedCall) settle(resp *proxy.Response, res outcome.Result) outcome.Verdict {
	v := outcome.Settle(res)
	resp.Report(v)
	k.g.countUsage(k.s.endpoint, k.cl, resp)
	k.s.class = v.Class
	k.hooks.point(PointSettled)
	return v
}

// deliverJSON relays a JSON answer too large to record, then settles it
// with what its client received (settleDelivered) before the response
// ends: a marker, or — the client did not get it whole — the response is
// cut and the key released (run's recover), so its retry runs again.
func (k *keyedCall) deliverJSON(resp *proxy.Response, res outcome.Result, v outcome.Verdict) error {
	k.lease.Uncommitted()
	// The log line says what the call is about to do; a cut or a refused
	// delivery below says otherwise.
	k.s.committed = "marker: response over the record limit"
	k.s.idemEvent = "not_stored"
	err := proxy.WriteJSON(k.h, resp, v, func(size int64) error {
		k.h.finish() // all of it is written: only its delivery is left to settle
		k.hooks.point(PointSent)
		act, err := k.settleDelivered(res, resp.Upstream.Cfg.Name, size)
		if act != outcome.Marker {
			return errNotDelivered
		}
		k.hooks.point(PointCommitted)
		return err
	})
	if errors.Is(err, proxy.ErrClientWrite) {
		res.Delivery = outcome.Cut
		k.s.committed = "false: the client did not receive it whole"
		k.release(outcome.Settle(res))
		return apierror.ClientGone
	}
	return err
}

// settleDelivered settles an answer too large to record once all of it
// has been written, with what its client received. The handoff decides,
// under the lock the client's deadline takes, whether it all reached the
// client first; only then is the marker Settle gives for a Whole delivery
// committed, so the deadline cannot pass between the check and the
// commit. Not delivered, it is Cut, which Settle releases. A marker
// committed resolves the key's dead letter, as a commit does.
//
// A content-cache entry gets no marker: nobody retries it, and a marker
// would answer every identical request 410 until it expired. Its key is
// released once the answer is out, so the next one is a miss that runs.
func (k *keyedCall) settleDelivered(res outcome.Result, upstream string, size int64) (outcome.Action, error) {
	act := outcome.Release
	delivered, err := k.h.deliver(func() error {
		res.Delivery = outcome.Whole
		if act = outcome.Settle(res).Action; act != outcome.Marker || k.kr.Cache {
			return nil
		}
		return k.lease.CommitNotStored(k.work, upstream, size, k.g.now())
	})
	if !delivered {
		res.Delivery = outcome.Cut
		act = outcome.Settle(res).Action
		k.s.committed = "false: the client did not receive it whole"
		k.s.idemEvent = "release"
	}
	if act == outcome.Marker && k.kr.Cache {
		k.s.committed = "false: too large to cache"
		k.s.idemEvent = "release"
		k.lease.Release(k.work)
		return act, nil
	}
	if act == outcome.Marker && err == nil {
		// The key has its answer (served once): a dead letter of an
		// earlier failure is settled, and its replay would only get 410.
		k.resolved()
	}
	return act, err
}

// stream relays a keyed stream while recording it and holding back its
// ending (from the first finish_reason on), settles it, and commits or
// releases; only then does the held-back tail go out — or, if the stream
// failed or its commit did, one error event in its place. A stream too
// large to record is the exception (notStored): its tail goes out before
// its marker is committed. Whether it was committed is also sent as a
// trailer.
func (k *keyedCall) stream(resp *proxy.Response) {
	g := k.g
	rec := &sse.Recorder{MaxBytes: g.cfg.Idempotency.MaxRecordBytes, MaxEvents: g.cfg.Idempotency.MaxRecordEvents}
	committed := false
	defer func() { k.h.trailer(idempotency.CommittedTrailer, strconv.FormatBool(committed)) }()
	if k.h.live != nil {
		k.h.live.watch(rec.Over) // an unrecordable stream is not committed: joiners are cut
	}
	tail := g.proxy.RelayStream(k.h, resp, proxy.Relay{Recorder: rec, Start: k.start, Trailer: idempotency.CommittedTrailer, Hold: true})
	if k.h.live != nil {
		k.h.live.seal() // a duplicate from now on gets the settled answer from the store
	}
	res := resp.Result(k.cl.Tried)
	res.Unrecordable = rec.Over()
	v := k.settle(resp, res)
	var err error
	switch v.Action {
	case outcome.Commit:
		failpoint("before-commit")
		stored := &cache.Record{Status: resp.Status, Header: idempotency.RecordHeader(resp.Header, resp.Outcome),
			Stream: true, Events: rec.Events(), Upstream: resp.Upstream.Cfg.Name}
		if simDefect(defectEndBeforeCommit) {
			tail.Release()
		}
		if err = simCommitUnderClient(k); err == nil {
			err = k.lease.Commit(k.work, stored)
		}
		if err == nil {
			g.limits.Committed(k.kr.Key.Scope, stored.StoredSize(), k.kr.TTL)
			committed = true
			k.s.idemEvent = "commit"
			k.resolved()
			failpoint("after-commit")
		}
	case outcome.Deliver:
		k.notStored(res, rec, tail)
		return
	default:
		k.release(v)
		tail.Fail(nil)
		return
	}
	if err != nil {
		tail.Fail(storeFailedEvent(k.cl, err))
		return
	}
	k.hooks.point(PointCommitted)
	k.h.finish()
	tail.Release()
	k.hooks.point(PointSent)
}

// errNotDelivered: the client did not receive a JSON answer whole, so no
// marker was committed for it.
var errNotDelivered = errors.New("the client did not receive the answer whole")

// notStored settles a stream too large to record. A not-stored marker
// answers the key's retries with 410, so it is committed only for a stream
// the client received whole: the tail goes out first, and the handoff
// decides, under the lock the client's deadline takes, whether all of it
// reached the client before the deadline; only then is the marker
// committed. A stream nobody received whole leaves no marker: the key is
// released and the retry runs again. If the marker's commit fails, the
// client still has the answer; the key is released (Lease.Commit).
func (k *keyedCall) notStored(res outcome.Result, rec *sse.Recorder, tail *proxy.Tail) {
	k.lease.Uncommitted()
	k.h.finish()
	tail.Release()
	k.hooks.point(PointSent)
	act, err := k.settleDelivered(res, res.Upstream, rec.Seen())
	switch {
	case act != outcome.Marker:
		k.lease.Release(k.work)
		return
	case k.kr.Cache:
		return // released: a cache entry gets no marker
	case err != nil:
		k.s.committed = "false: the marker could not be stored"
		k.s.idemEvent = "release"
		return
	}
	k.s.committed = "marker: stream over the record limit"
	k.s.idemEvent = "not_stored"
	k.g.log.Warn("stream too large to store; served once, a marker committed", "idempotency_key", k.s.idemKey,
		"bytes", rec.Seen(), "limit_bytes", rec.MaxBytes, "limit_events", rec.MaxEvents)
	k.hooks.point(PointCommitted)
}

// storeFailedEvent ends a keyed stream whose commit failed (err, a
// CommitFailed), in place of its held-back tail, in the words of the 503 a
// JSON answer gets: the client's SDK raises, and its retry runs again.
func storeFailedEvent(cl *proxy.Call, err error) []byte {
	e := apierror.Wire(err)
	return cl.StreamEvent(e.Message, e.Code)
}

// opCtx bounds a store operation after the call: detached from the work's
// end (its deadline may have passed), bounded by store.op_timeout.
func (k *keyedCall) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(k.work), k.g.cfg.Store.OpTimeout.D())
}

// resolved removes the dead letter of a key that has now succeeded.
// Content-keyed cache entries have none.
func (k *keyedCall) resolved() {
	if !k.kr.Cache && k.g.dlq.MayHold(k.kr.Key) {
		ctx, cancel := k.opCtx()
		defer cancel()
		k.g.dlq.Resolve(ctx, k.kr.Key)
	}
}

// release records the dead letter of a request that did not produce a
// committable answer, when the verdict says so, then releases its key (so
// the client's retry runs again). In that order: a retry that succeeds
// the moment the key is free finds the letter and resolves it; the other
// way round, the letter was written after that success and stayed. A
// retry meanwhile waits as for any key in flight. Content-keyed cache
// entries are not dead letters: no client is waiting to retry them. Nor
// is a key another owner took over: that owner's outcome is the key's.
func (k *keyedCall) release(v outcome.Verdict) {
	k.s.idemEvent = "release"
	if v.DeadLetter != nil && !k.kr.Cache && !k.lease.TakenOver() {
		ctx, cancel := k.opCtx()
		k.g.dlq.Record(ctx, k.kr.Key, deadletter.RequestOf(k.cl, k.start), v.DeadLetter)
		cancel()
	}
	k.lease.Release(k.work)
}

// replay notes a claim that answered the client itself.
func (s *summary) replay(ev idempotency.Event, kr *idempotency.Request) {
	s.class = classify.Class(ev.Class)
	switch {
	case ev.Waited:
		s.idemEvent = "wait"
	case ev.Replayed:
		s.idemEvent = "replay"
	case ev.Class == "idempotency_mismatch":
		s.idemEvent = "mismatch"
	case ev.Class == "idempotency_in_flight":
		s.idemEvent = "conflict"
	}
	if ev.Replayed {
		s.replayed = true
		s.upstream = ev.Upstream
		if kr.Cache {
			s.cache = "hit"
		}
	}
}
