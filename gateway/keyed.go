package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/admission"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/deadletter"
	"github.com/llmgate/llmgate/gateway/idempotency"
	"github.com/llmgate/llmgate/gateway/limits"
	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/proxy"
	"github.com/llmgate/llmgate/gateway/sse"
)

// keyFor decides whether a request is keyed, and by what: the client's
// Idempotency-Key, or a key derived from the body when content-keyed
// caching is on for the upstream (or the request says X-Llmgate-Cache: on).
func (g *Gateway) keyFor(r *http.Request, ep endpoint, u *proxy.Upstream, body []byte) (*idempotency.Request, error) {
	scope := clientOf(r)
	if hv, ok := r.Header["Idempotency-Key"]; ok {
		if len(hv) != 1 {
			return nil, apierror.Invalid("", "Send exactly one Idempotency-Key header.")
		}
		key, err := idempotency.ParseKey(hv[0])
		if err != nil {
			return nil, apierror.InvalidCode("invalid_idempotency_key", "", err.Error()+".", err)
		}
		return &idempotency.Request{
			Key: cache.Key{Scope: scope, Endpoint: ep.path, ID: key},
			Raw: key, Fingerprint: idempotency.Fingerprint(body), TTL: g.cfg.Idempotency.TTL.D(),
		}, nil
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
	fp := idempotency.Fingerprint(body)
	return &idempotency.Request{
		Key:         cache.Key{Scope: scope, Endpoint: ep.path, ID: "cache:" + fp},
		Fingerprint: fp,
		TTL:         g.cfg.Idempotency.CacheTTL.D(),
		Cache:       true,
		NoStore:     strings.Contains(cc, "no-store"),
	}, nil
}

// serveKeyed runs a keyed request: replay a committed response, wait for
// an in-flight duplicate, or claim the key and run the call.
func (g *Gateway) serveKeyed(w http.ResponseWriter, r *http.Request, cl *proxy.Call, u *proxy.Upstream, kr *idempotency.Request, dl deadlines, s *summary, hd hold) error {
	s.idemKey = idempotency.HashKey(kr.Key.ID)
	kr.Model = cl.Model
	if kr.Cache {
		s.cache = "miss"
		w.Header().Set(idempotency.CacheHeader, "miss")
	}
	// Over its storage quota a client's keyed request is refused before
	// its claim, unless it replays a committed answer; a content-cached one
	// is looked up and otherwise served without being stored.
	// The same holds while the store is full (space.go).
	if err := g.spaceCheck(kr); err != nil {
		if ev, ok := g.keeper.Lookup(w, r, kr); ok {
			s.replay(ev, kr)
			return nil
		}
		return err
	}
	if err := g.storageCheck(kr); err != nil {
		if ev, ok := g.keeper.Lookup(w, r, kr); ok {
			s.replay(ev, kr)
			return nil
		}
		s.class = "client_limited"
		return err
	}
	if kr.NoStore {
		if ev, ok := g.keeper.Lookup(w, r, kr); ok {
			s.replay(ev, kr)
			return nil
		}
		return g.serveUnkeyed(w, r, cl, u, dl, s)
	}
	lease, ev, err := g.keeper.Claim(w, r, kr, dl.client)
	if ev.Class != "" {
		s.replay(ev, kr)
	}
	var su *apierror.StoreUnavailable
	if kr.Cache && errors.As(err, &su) {
		// Content-keyed caching saves calls; it is not a guarantee a client
		// asked for, so with the store down it is skipped, not required.
		s.cache = "unavailable"
		w.Header().Del(idempotency.CacheHeader)
		return g.serveUnkeyed(w, r, cl, u, dl, s)
	}
	if err != nil || lease == nil {
		return err
	}
	return g.runClaimed(w, r, cl, u, kr, lease, dl, s, hd)
}

// storageCheck is the client's storage quota for a request that would
// store: over it, a content-cached request becomes no-store (caching saves
// calls; it is no guarantee a client asked for) and passes.
func (g *Gateway) storageCheck(kr *idempotency.Request) error {
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
// runs on its own goroutine, detached from the client's context and bounded
// by the operator's deadline, so that when the client leaves or its own
// deadline passes (often shorter than the model's latency) the call still
// finishes and commits, and the client's retry gets this answer instead of
// paying for a second, different one. The handler waits for it, or for the
// client's deadline.
func (g *Gateway) runClaimed(w http.ResponseWriter, r *http.Request, cl *proxy.Call, u *proxy.Upstream, kr *idempotency.Request, lease *idempotency.Lease, dl deadlines, s *summary, hd hold) error {
	work, it, done := g.work.start(r.Context(), dl.operator)
	// The call holds its client's concurrency slot and its body's bytes
	// until it ends, also after the handler has returned.
	held := hd.take()
	if kr.Raw != "" {
		cl.IdemKey = idempotency.ForwardKey(g.forwardSecret, kr.Key)
	}
	k := &keyedCall{g: g, h: newHandoff(w), cl: cl, kr: kr, lease: lease, work: work, start: g.now(), s: *s}
	ended := make(chan workEnd, 1)
	cl.Source.Hold() // a spooled body outlives the handler while the call runs on
	go func() {
		defer cl.Source.Close()
		defer done()
		defer held()
		stopRenew := lease.Renew(work)
		defer stopRenew()
		ended <- k.run(u)
	}()
	var deadline <-chan time.Time
	if !dl.client.IsZero() {
		t := time.NewTimer(dl.client.Sub(g.now()))
		defer t.Stop()
		deadline = t.C
	}
	gone := r.Context().Done()
	finish := func(e workEnd) error {
		*s = k.s
		if e.panic != nil {
			panic(e.panic)
		}
		return e.err
	}
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
			goesOn := g.detach(it, s)
			abort := k.h.end(func(w http.ResponseWriter, wrote bool) bool { return endAtClientDeadline(w, wrote, goesOn, cl.Kind) })
			k.cut.Store(true)
			s.class = "client_deadline"
			s.idemEvent = "detached" // the call runs on, to be committed
			if abort {
				panic(http.ErrAbortHandler)
			}
			return nil
		case <-gone:
			// The client left: the call goes on (the handler waits for it,
			// so the log line says how it ended), counted as detached.
			gone = nil
			g.detach(it, s)
		}
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
func (g *Gateway) detach(it *workItem, s *summary) bool {
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
func endAtClientDeadline(w http.ResponseWriter, wrote, goesOn bool, kind proxy.Kind) (abort bool) {
	err := &apierror.ClientDeadline{Keyed: goesOn}
	if !wrote {
		apierror.Write(w, err)
		return false
	}
	if !strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
		return true
	}
	e := apierror.Wire(err)
	_, _ = w.Write(kind.StreamEvent(e.Message, e.Code))
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	return false
}

// workEnd is how a keyed call's goroutine ended: an error for the handler
// to write, or a panic for the handler to re-raise (http.ErrAbortHandler
// aborts the response).
type workEnd struct {
	err   error
	panic any
}

// keyedCall is a claimed keyed request from its upstream call to its end:
// it commits or releases as the settled outcome says. Only its goroutine
// touches it until that ends.
type keyedCall struct {
	g     *Gateway
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
}

func (k *keyedCall) run(u *proxy.Upstream) (e workEnd) {
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				k.g.log.Error("panic in keyed call", "panic", fmt.Sprint(p), "idempotency_key", k.s.idemKey)
			}
			// Nothing was committed (a commit ends without panicking):
			// release the key, and let a breaker waiting on this call go on.
			k.lease.Release(k.work)
			if k.resp != nil {
				k.resp.Report(outcome.Verdict{Breaker: breaker.Excluded})
			}
			e = workEnd{panic: p}
		}
		if k.cut.Load() {
			k.g.log.Info("detached call ended", "idempotency_key", k.s.idemKey, "upstream", k.s.upstream,
				"class", k.s.class, "attempts", k.s.attempts, "committed", k.s.committed, "err", e.err)
		}
	}()
	failpoint("before-upstream")
	resp, err := k.g.proxy.Execute(k.work, k.cl, u)
	if err != nil {
		// It never reached an upstream (or none answered): released at once.
		k.release(outcome.Settle(outcome.Result{Err: err, Tried: k.cl.Tried}))
		return workEnd{err: err}
	}
	k.resp = resp
	k.s.note(resp)
	if err := k.g.recordOrDrop(k.work, k.kr.Key.Scope, k.cl, resp); err != nil {
		// Not committed: the ids it would hand out are not recorded.
		k.release(outcome.Verdict{})
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
	v := outcome.Settle(resp.Result(k.cl.Tried))
	resp.Report(v)
	k.g.countUsage(k.s.endpoint, k.cl, resp)
	k.s.class = v.Class
	switch {
	case v.Commit:
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
	case v.Uncommitted != "":
		k.lease.Uncommitted()
		k.s.committed = "marker: response over the record limit"
		k.s.idemEvent = "not_stored"
		err := proxy.WriteJSON(k.h, resp, v, func(size int64) error {
			return k.lease.CommitNotStored(k.work, resp.Upstream.Cfg.Name, size, k.g.now())
		})
		if errors.Is(err, proxy.ErrClientWrite) {
			// The client did not get it whole: no marker, the key is
			// released, and its retry runs the request again.
			k.s.committed = "false: the client did not receive it whole"
			k.s.idemEvent = "release"
			k.lease.Release(k.work)
			return apierror.ClientGone
		}
		return err
	default:
		k.release(v)
	}
	return proxy.WriteJSON(k.h, resp, v, nil)
}

// stream relays a keyed stream while recording it and holding back its
// ending (from the first finish_reason on), settles it, and commits or
// releases; only then does the held-back tail go out — or, if the stream
// failed or its commit did, one error event in its place. Whether it was
// committed is also sent as a trailer.
func (k *keyedCall) stream(resp *proxy.Response) {
	g := k.g
	rec := &sse.Recorder{MaxBytes: g.cfg.Idempotency.MaxRecordBytes, MaxEvents: g.cfg.Idempotency.MaxRecordEvents}
	committed := false
	defer func() { k.h.trailer(idempotency.CommittedTrailer, strconv.FormatBool(committed)) }()
	tail := g.proxy.RelayStream(k.h, resp, rec, k.start, idempotency.CommittedTrailer, true)
	res := resp.Result(k.cl.Tried)
	res.Unrecordable = rec.Over()
	v := outcome.Settle(res)
	resp.Report(v)
	g.countUsage(k.s.endpoint, k.cl, resp)
	k.s.class = v.Class
	var err error
	switch {
	case v.Commit:
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
	case v.Uncommitted != "" && (tail.ClientGone() || k.cut.Load()):
		// Nobody received it whole: no marker; the retry runs again.
		k.lease.Uncommitted()
		k.s.committed = "false: the client did not receive it whole"
		k.s.idemEvent = "release"
		k.lease.Release(k.work)
		tail.Fail(nil)
		return
	case v.Uncommitted != "":
		k.lease.Uncommitted()
		k.s.committed = "marker: stream over the record limit"
		k.s.idemEvent = "not_stored"
		g.log.Warn("stream too large to store; served once, a marker committed", "idempotency_key", k.s.idemKey,
			"bytes", rec.Seen(), "limit_bytes", rec.MaxBytes, "limit_events", rec.MaxEvents)
		err = k.lease.CommitNotStored(k.work, resp.Upstream.Cfg.Name, rec.Seen(), g.now())
	default:
		k.release(v)
		tail.Fail(nil)
		return
	}
	if err != nil {
		tail.Fail(storeFailedEvent(k.cl.Kind))
		return
	}
	tail.Release()
}

// storeFailedEvent ends a keyed stream whose commit failed, in place of its
// held-back tail: the client's SDK raises, and its retry runs again.
func storeFailedEvent(kind proxy.Kind) []byte {
	return kind.StreamEvent("The answer could not be stored, so this stream did not complete. Retry with the same Idempotency-Key.",
		"idempotency_store_unavailable")
}

// opCtx bounds a store operation after the call: detached from the work's
// end (its deadline may have passed), bounded by store.op_timeout.
func (k *keyedCall) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(k.work), k.g.cfg.Store.OpTimeout.D())
}

// resolved removes the dead letter of a key that has now succeeded.
// Content-keyed cache entries have none.
func (k *keyedCall) resolved() {
	if !k.kr.Cache {
		ctx, cancel := k.opCtx()
		defer cancel()
		k.g.dlq.Resolve(ctx, k.kr.Key)
	}
}

// release releases the key of a request that did not produce a committable
// answer (so the client's retry runs again) and records its dead letter
// when the verdict says so. Content-keyed cache entries are not dead
// letters: no client is waiting to retry them.
func (k *keyedCall) release(v outcome.Verdict) {
	k.s.idemEvent = "release"
	k.lease.Release(k.work)
	if v.DeadLetter != nil && !k.kr.Cache {
		ctx, cancel := k.opCtx()
		defer cancel()
		k.g.dlq.Record(ctx, k.kr.Key, deadletter.Request{Model: k.cl.Model, Body: k.cl.Body, First: k.start}, v.DeadLetter)
	}
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
