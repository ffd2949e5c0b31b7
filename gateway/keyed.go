package gateway

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/deadletter"
	"github.com/llmgate/llmgate/gateway/idempotency"
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
		key, err := parseIdempotencyKey(hv[0])
		if err != nil {
			return nil, apierror.InvalidCode("invalid_idempotency_key", "", err.Error()+".", err)
		}
		return &idempotency.Request{
			Key: cache.Key{Scope: scope, Endpoint: ep.path, ID: key},
			Raw: key, Fingerprint: fingerprint(body), TTL: g.cfg.Idempotency.TTL.D(),
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
	fp := fingerprint(body)
	return &idempotency.Request{
		Key:         cache.Key{Scope: scope, Endpoint: ep.path, ID: "cache:" + fp},
		Fingerprint: fp,
		TTL:         g.cfg.Idempotency.CacheTTL.D(),
		Cache:       true,
		NoStore:     strings.Contains(cc, "no-store"),
	}, nil
}

// serveKeyed runs a keyed request: replay a committed response, wait for
// an in-flight duplicate, or claim the key, call upstream and commit.
func (g *Gateway) serveKeyed(w http.ResponseWriter, r *http.Request, cl *proxy.Call, u *proxy.Upstream, kr *idempotency.Request, s *summary) error {
	s.idemKey = idempotency.HashKey(kr.Key.ID)
	if kr.Cache {
		s.cache = "miss"
		w.Header().Set(idempotency.CacheHeader, "miss")
	}
	if kr.NoStore {
		if ev, ok := g.keeper.Lookup(w, r, kr); ok {
			s.replay(ev, kr)
			return nil
		}
		return g.serveUnkeyed(w, r, cl, u, s)
	}
	lease, ev, err := g.keeper.Claim(w, r, kr)
	if ev.Class != "" {
		s.replay(ev, kr)
	}
	if err != nil || lease == nil {
		return err
	}

	// From here the upstream call outlives the client: if the client goes
	// away (its timeout is often shorter than the model's), the call still
	// finishes and commits, so the client's retry gets this result instead
	// of paying for a second, different one. The request's deadline still
	// bounds it.
	work := context.WithoutCancel(r.Context())
	var cancel context.CancelFunc
	if !cl.Deadline.IsZero() {
		work, cancel = context.WithDeadline(work, cl.Deadline)
	} else {
		work, cancel = context.WithCancel(work)
	}
	defer cancel()
	defer lease.Renew(work)()

	cl.IdemKey = kr.Raw
	k := keyedCall{g: g, w: w, r: r, cl: cl, kr: kr, lease: lease, work: work, start: g.now()}
	failpoint("before-upstream")
	resp, err := g.proxy.Execute(work, cl, u)
	if err != nil {
		k.release(outcome.Settle(outcome.Result{Err: err, Tried: cl.Tried}))
		return err
	}
	s.note(resp)
	if resp.Stream != nil {
		k.stream(resp, s)
		return nil
	}
	return k.json(resp, s)
}

// replay notes a claim that answered the client itself.
func (s *summary) replay(ev idempotency.Event, kr *idempotency.Request) {
	s.class = classify.Class(ev.Class)
	if ev.Replayed {
		s.replayed = true
		s.upstream = ev.Upstream
		if kr.Cache {
			s.cache = "hit"
		}
	}
}

// keyedCall is a claimed keyed request between its upstream call and its
// end: it commits or releases as the settled outcome says.
type keyedCall struct {
	g     *Gateway
	w     http.ResponseWriter
	r     *http.Request
	cl    *proxy.Call
	kr    *idempotency.Request
	lease *idempotency.Lease
	work  context.Context
	start time.Time
}

// json settles a buffered answer, commits it if it is the model's answer,
// and relays it. A failed commit answers 503 instead: a retry must never
// contradict what the client was given.
func (k *keyedCall) json(resp *proxy.Response, s *summary) error {
	v := outcome.Settle(resp.Result(k.cl.Tried))
	resp.Report(v)
	s.class = v.Class
	if v.Commit {
		failpoint("before-commit")
		err := k.lease.Commit(k.work, &cache.Record{Status: resp.Status, Header: idempotency.RecordHeader(resp.Header, resp.Outcome),
			Body: resp.Body, Upstream: resp.Upstream.Cfg.Name})
		if err != nil {
			return err
		}
		k.resolved()
		failpoint("after-commit")
	} else {
		if v.Uncommitted != "" {
			k.lease.Uncommitted()
			s.committed = "false: response over the record limit"
		}
		k.release(v)
	}
	return proxy.WriteJSON(k.w, resp, v)
}

// stream relays a keyed stream while recording it, then settles it and
// commits or releases. Whether it was committed is known only at its end:
// it is sent as a trailer.
func (k *keyedCall) stream(resp *proxy.Response, s *summary) {
	g := k.g
	rec := &sse.Recorder{MaxBytes: g.cfg.Idempotency.MaxRecordBytes, MaxEvents: g.cfg.Idempotency.MaxRecordEvents}
	committed := false
	defer func() { k.w.Header().Set(idempotency.CommittedTrailer, strconv.FormatBool(committed)) }()
	g.proxy.RelayStream(k.w, k.r.Context(), resp, rec, k.start, idempotency.CommittedTrailer)
	res := resp.Result(k.cl.Tried)
	res.Unrecordable = rec.Over()
	v := outcome.Settle(res)
	resp.Report(v)
	s.class = v.Class
	switch {
	case v.Commit:
		failpoint("before-commit")
		err := k.lease.Commit(k.work, &cache.Record{Status: resp.Status, Header: idempotency.RecordHeader(resp.Header, resp.Outcome),
			Stream: true, Events: rec.Events(), Upstream: resp.Upstream.Cfg.Name})
		if err == nil {
			committed = true
			k.resolved()
			failpoint("after-commit")
		}
	case v.Uncommitted != "":
		k.lease.Uncommitted()
		s.committed = "false: stream over the record limit"
		g.log.Warn("stream too large to commit; served but not committed", "request_id", k.w.Header().Get("X-Llmgate-Request-Id"),
			"idempotency_key", s.idemKey, "limit_bytes", rec.MaxBytes, "limit_events", rec.MaxEvents)
		k.lease.Release(k.work)
	default:
		k.release(v)
	}
}

// resolved removes the dead letter of a key that has now succeeded.
// Content-keyed cache entries have none.
func (k *keyedCall) resolved() {
	if !k.kr.Cache {
		k.g.dlq.Resolve(k.work, k.kr.Key)
	}
}

// release releases the key of a request that did not produce a committable
// answer (so the client's retry runs again) and records its dead letter
// when the verdict says so. Content-keyed cache entries are not dead
// letters: no client is waiting to retry them.
func (k *keyedCall) release(v outcome.Verdict) {
	k.lease.Release(k.work)
	if v.DeadLetter != nil && !k.kr.Cache {
		k.g.dlq.Record(k.work, k.kr.Key, deadletter.Request{Model: k.cl.Model, Body: k.cl.Body, First: k.start}, v.DeadLetter)
	}
}
