package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/classify"
)

// keyedReq is a request that runs under an idempotency record: the
// client's Idempotency-Key, or a key derived from the body for
// content-keyed caching.
type keyedReq struct {
	key cache.Key
	// raw is the client's Idempotency-Key, forwarded upstream; empty for a
	// content-derived key.
	raw string
	fp  string
	ttl time.Duration
	// cache marks a content-derived key (X-Llmgate-Cache: hit|miss).
	cache bool
	// noStore: Cache-Control: no-store — look up, but never commit.
	noStore bool
}

// CacheHeader turns content-keyed caching on or off for one request,
// overriding the upstream's cache setting: "on" or "off". Responses carry
// it too: "hit" or "miss".
const CacheHeader = "X-Llmgate-Cache"

// keyFor decides whether a request is keyed, and by what.
func (g *Gateway) keyFor(c echo.Context, ep endpoint, u *upstream, body []byte) (*keyedReq, error) {
	r := c.Request()
	scope := clientOf(c)
	if hv, ok := r.Header["Idempotency-Key"]; ok {
		if len(hv) != 1 {
			return nil, errInvalid("", "Send exactly one Idempotency-Key header.")
		}
		key, err := parseIdempotencyKey(hv[0])
		if err != nil {
			return nil, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_idempotency_key",
				Message: err.Error() + ".", Err: err}
		}
		return &keyedReq{
			key: cache.Key{Scope: scope, Endpoint: ep.path, ID: key},
			raw: key, fp: fingerprint(body), ttl: g.cfg.Idempotency.TTL.D(),
		}, nil
	}
	if g.cfg.Idempotency.RequireKey {
		return nil, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "idempotency_key_required",
			Message: "This gateway requires an Idempotency-Key header on every POST. Name the business operation, e.g. order-4711/summarize."}
	}
	on := u.cfg.Cache
	switch strings.ToLower(r.Header.Get(CacheHeader)) {
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
	return &keyedReq{
		key:     cache.Key{Scope: scope, Endpoint: ep.path, ID: "cache:" + fp},
		fp:      fp,
		ttl:     g.cfg.Idempotency.CacheTTL.D(),
		cache:   true,
		noStore: strings.Contains(cc, "no-store"),
	}, nil
}

// hashKey is how an idempotency key appears in logs: enough to correlate
// lines, not the key itself (it may embed business identifiers).
func hashKey(k string) string {
	s := sha256.Sum256([]byte(k))
	return hex.EncodeToString(s[:6])
}

func errStore(err error) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "idempotency_store_unavailable",
		Message:    "The idempotency store is unavailable, so this keyed request was not run (it would not be protected against duplicates). Retry later.",
		RetryAfter: time.Second, Err: err}
}

// serveKeyed runs a keyed request: replay a committed response, wait for
// an in-flight duplicate, or claim the key, call upstream and commit.
func (g *Gateway) serveKeyed(c echo.Context, cl *call, u *upstream, kr *keyedReq) error {
	r := c.Request()
	info := infoOf(c)
	info.idemKey = hashKey(kr.key.ID)
	if kr.cache {
		info.cache = "miss"
		c.Response().Header().Set(CacheHeader, "miss")
	}
	if kr.noStore {
		rec, err := g.store.Get(r.Context(), kr.key)
		if err == nil && rec.State == cache.Committed && rec.Fingerprint == kr.fp {
			return g.replay(c, kr, rec)
		}
		g.metrics.idemEvent("cache_miss")
		return g.runUnkeyed(c, cl, u)
	}

	owner, err := g.claim(c, kr)
	if err != nil || owner == "" {
		return err
	}
	g.metrics.idemEvent("claim")
	if kr.cache {
		g.metrics.idemEvent("cache_miss")
	}

	// From here the upstream call outlives the client: if the client goes
	// away (its timeout is often shorter than the model's), the call still
	// finishes and commits, so the client's retry gets this result instead
	// of paying for a second, different one. The request's deadline still
	// bounds it.
	work := context.WithoutCancel(r.Context())
	var cancel context.CancelFunc
	if !cl.deadline.IsZero() {
		work, cancel = context.WithDeadline(work, cl.deadline)
	} else {
		work, cancel = context.WithCancel(work)
	}
	defer cancel()
	stopRenew := g.renewLease(work, kr.key, owner)
	defer stopRenew()

	cl.idemKey = kr.raw
	start := g.now()
	failpoint("before-upstream")
	resp, err := g.execute(work, cl, u)
	if err != nil {
		g.releaseFailed(work, cl, kr, owner, nil, err, start)
		return err
	}
	g.note(info, resp)

	if resp.stream != nil {
		rec := &recorder{maxBytes: g.cfg.Idempotency.MaxRecordBytes, maxEvents: g.cfg.Idempotency.MaxRecordEvents}
		out := g.relayStream(c, resp, rec, start)
		committed := false
		defer func() { c.Response().Header().Set(CommittedTrailer, strconv.FormatBool(committed)) }()
		switch {
		case !committable(out):
			g.releaseFailed(work, cl, kr, owner, resp, nil, start)
		case rec.over:
			g.metrics.idemEvent("uncommitted")
			info.committed = "false: stream over the record limit"
			g.log.Warn("stream too large to commit; served but not committed", "request_id", info.id,
				"idempotency_key", info.idemKey, "limit_bytes", rec.maxBytes, "limit_events", rec.maxEvents)
			g.release(work, kr.key, owner)
		default:
			hdr := recordHeader(resp.header, out)
			failpoint("before-commit")
			err := g.store.Commit(work, kr.key, owner, &cache.Record{
				Fingerprint: kr.fp, Status: resp.status, Header: hdr, Stream: true,
				Events: rec.events, Upstream: resp.upstream.cfg.Name,
			}, kr.ttl)
			if g.afterCommit(work, kr, owner, err) == nil {
				committed = true
				failpoint("after-commit")
			}
		}
		return nil
	}

	if resp.status >= 200 && resp.status <= 299 && resp.rest == nil && committable(resp.outcome) {
		failpoint("before-commit")
		err := g.store.Commit(work, kr.key, owner, &cache.Record{
			Fingerprint: kr.fp, Status: resp.status, Header: recordHeader(resp.header, resp.outcome),
			Body: resp.body, Upstream: resp.upstream.cfg.Name,
		}, kr.ttl)
		if err := g.afterCommit(work, kr, owner, err); err != nil {
			return err
		}
		failpoint("after-commit")
	} else {
		if resp.rest != nil {
			g.metrics.idemEvent("uncommitted")
			info.committed = "false: response over the record limit"
		}
		g.releaseFailed(work, cl, kr, owner, resp, nil, start)
	}
	return g.writeResponse(c, resp)
}

// committable says whether a finished stream's outcome is the model's
// answer (committed) or a failure (released for the client to retry).
func committable(o classify.Outcome) bool {
	switch o.Class {
	case classify.Success, classify.ContentFilter, classify.Empty:
		return true
	}
	return false
}

// claim loops until this request owns the key, or it has answered the
// client itself (replay, 409, 422, 503) — then owner is "".
func (g *Gateway) claim(c echo.Context, kr *keyedReq) (owner string, err error) {
	r := c.Request()
	waitCtx, cancel := context.WithTimeout(r.Context(), g.cfg.Idempotency.WaitTimeout.D())
	defer cancel()
	lease := g.cfg.Idempotency.Lease.D()
	waited := false
	for {
		cl, err := g.store.Claim(r.Context(), kr.key, kr.fp, lease)
		if err != nil {
			if r.Context().Err() != nil {
				return "", errClientGone
			}
			g.metrics.idemEvent("store_error")
			return "", errStore(err)
		}
		switch cl.Status {
		case cache.Claimed:
			return cl.Owner, nil
		case cache.Done:
			return "", g.replay(c, kr, cl.Record)
		case cache.Mismatch:
			g.metrics.idemEvent("mismatch")
			infoOf(c).outcome = "idempotency_mismatch"
			return "", &apiError{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Code: "idempotency_key_reused", Param: "Idempotency-Key",
				Message: "This Idempotency-Key was already used for a different request body. Use a new key for a new request, or resend the original body."}
		case cache.Busy:
			if !waited {
				g.metrics.idemEvent("wait")
				waited = true
			}
			if err := g.store.Wait(waitCtx, kr.key); err != nil {
				if r.Context().Err() != nil {
					return "", errClientGone
				}
				if errors.Is(err, context.DeadlineExceeded) {
					g.metrics.idemEvent("conflict")
					infoOf(c).outcome = "idempotency_in_flight"
					return "", &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "idempotency_key_in_flight", Param: "Idempotency-Key",
						Message:    "A request with this Idempotency-Key is still in progress. Retry after the Retry-After interval to get its result.",
						RetryAfter: time.Second, ShouldRetry: true}
				}
				g.metrics.idemEvent("store_error")
				return "", errStore(err)
			}
		}
	}
}

func (g *Gateway) replay(c echo.Context, kr *keyedReq, rec *cache.Record) error {
	info := infoOf(c)
	info.replayed = true
	info.upstream = rec.Upstream
	info.outcome = "replayed"
	if kr.cache {
		info.cache = "hit"
		c.Response().Header().Set(CacheHeader, "hit")
		g.metrics.idemEvent("cache_hit")
	} else {
		g.metrics.idemEvent("replay")
	}
	replayRecord(c.Response(), rec)
	return nil
}

// afterCommit handles a commit's error: the completion exists but is not
// committed, so the client gets a 503 rather than an answer a retry could
// contradict, and the key is released.
func (g *Gateway) afterCommit(ctx context.Context, kr *keyedReq, owner string, err error) error {
	if err == nil {
		g.metrics.idemEvent("commit")
		if !kr.cache {
			g.resolveDeadLetter(ctx, kr.key)
		}
		return nil
	}
	g.metrics.idemEvent("store_error")
	g.log.Error("commit failed", "idempotency_key", hashKey(kr.key.ID), "err", err)
	if !errors.Is(err, cache.ErrNotOwner) {
		g.release(ctx, kr.key, owner)
	}
	return errStore(err)
}

func (g *Gateway) release(ctx context.Context, k cache.Key, owner string) {
	if err := g.store.Release(ctx, k, owner); err != nil && !errors.Is(err, cache.ErrNotOwner) {
		g.log.Warn("releasing idempotency key failed; it frees itself when its lease expires", "idempotency_key", hashKey(k.ID), "err", err)
	}
	g.metrics.idemEvent("release")
}

// releaseFailed releases the key of a request that did not produce a
// committable answer (so the client's retry runs again) and, when its
// failure is one a dead letter is for, records it. Content-keyed cache
// entries are not dead letters: no client is waiting to retry them.
func (g *Gateway) releaseFailed(ctx context.Context, cl *call, kr *keyedReq, owner string, resp *response, err error, first time.Time) {
	g.release(ctx, kr.key, owner)
	if f, ok := deadLetterFailure(resp, err, cl.tried); ok && !kr.cache {
		g.recordDeadLetter(ctx, cl, kr, f, first)
	}
}

// renewLease keeps the claim alive while a long call or stream runs. It is
// a timer, not a goroutine: most keyed calls end before the first renewal,
// and then stopping costs no goroutine start and no hand-off. stop waits
// for a renewal in progress, so none runs after it returns.
func (g *Gateway) renewLease(ctx context.Context, k cache.Key, owner string) (stop func()) {
	lease := g.cfg.Idempotency.Lease.D()
	var (
		mu      sync.Mutex
		stopped bool
		t       *time.Timer
	)
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(lease/3, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped || ctx.Err() != nil {
			return
		}
		if err := g.store.Renew(ctx, k, owner, lease); err != nil {
			g.log.Warn("renewing idempotency lease failed", "idempotency_key", hashKey(k.ID), "err", err)
			if errors.Is(err, cache.ErrNotOwner) {
				return
			}
		}
		t.Reset(lease / 3)
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// recordHeader is what a committed record keeps of the response headers.
func recordHeader(h http.Header, o classify.Outcome) map[string][]string {
	out := make(map[string][]string, len(h)+1)
	for k, v := range h {
		out[k] = v
	}
	if o.Class != classify.Success && o.Class != "" {
		out["X-Llmgate-Outcome"] = []string{string(o.Class)}
	}
	return out
}

// runUnkeyed serves a request with no idempotency record.
func (g *Gateway) runUnkeyed(c echo.Context, cl *call, u *upstream) error {
	ctx := c.Request().Context()
	if !cl.deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, cl.deadline)
		defer cancel()
	}
	start := g.now()
	resp, err := g.execute(ctx, cl, u)
	if err != nil {
		return err
	}
	g.note(infoOf(c), resp)
	if resp.stream != nil {
		g.relayStream(c, resp, nil, start)
		return nil
	}
	return g.writeResponse(c, resp)
}
