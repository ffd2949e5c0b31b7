// Package idempotency runs a keyed request's life in the store: claim the
// key (or replay its committed answer, wait for an in-flight duplicate,
// refuse another body), keep the lease alive while the call runs, and
// commit or release it as the settled outcome says. Commits and releases
// are the owner's alone (an owner token the store compares atomically).
//
// It takes http.ResponseWriter and *http.Request, never echo types, and
// does not know of upstreams or breakers: what to commit is decided by
// package outcome, and the call itself is the proxy's.
package idempotency

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/headers"
	"github.com/llmgate/llmgate/gateway/metrics"
	"github.com/llmgate/llmgate/gateway/sse"
)

// Store is what a keyed request needs of the idempotency store: an atomic
// claim with a lease and an owner token, renewal while the call runs,
// commit or release by the owner, a way to wait for another request's
// commit, and a lookup for Cache-Control: no-store.
type Store interface {
	Claim(ctx context.Context, k cache.Key, fingerprint string, lease time.Duration) (cache.Claim, error)
	Renew(ctx context.Context, k cache.Key, owner string, lease time.Duration) error
	Commit(ctx context.Context, k cache.Key, owner string, rec *cache.Record, ttl time.Duration) error
	Release(ctx context.Context, k cache.Key, owner string) error
	Wait(ctx context.Context, k cache.Key) error
	Get(ctx context.Context, k cache.Key) (*cache.Record, error)
}

// Options configure a Keeper. Store and Metrics are required.
type Options struct {
	Store   Store
	Metrics *metrics.Metrics
	// Lease is how long a claim lives without renewal; it is renewed every
	// quarter to a third of Lease while the call runs (renew.go).
	Lease time.Duration
	// WaitTimeout bounds how long a duplicate waits for the first request.
	WaitTimeout time.Duration
	// OpTimeout bounds each claim, commit, release and renewal. They run
	// detached from the request's context: a client that left, or whose
	// deadline passed, must not leave its key claimed or its answer
	// uncommitted. If <= 0, 5s.
	OpTimeout time.Duration
	// Logger: if nil, logs are discarded.
	Logger *slog.Logger
}

// Keeper runs keyed requests against the store.
type Keeper struct {
	store   Store
	metrics *metrics.Metrics
	lease   time.Duration
	wait    time.Duration
	opTime  time.Duration
	log     *slog.Logger
	// renewals keeps the leases of the calls in flight alive (renew.go).
	renewals *renewals
	// inProcess: the store runs its operations in this process and looks
	// at a context only as they begin (InProcessStore), so an op timeout
	// would bound nothing and cost a timer per operation.
	inProcess bool
}

// InProcessStore is a Store whose operations run in this process, look at
// their context only to refuse one that has already ended, and cannot be
// interrupted (Badger's): the Keeper gives them no op timeout. A store that
// waits on a network (Redis), or a wrapper that adds such waits, does not
// implement it.
type InProcessStore interface {
	InProcess() bool
}

// New returns a Keeper.
func New(o Options) *Keeper {
	k := &Keeper{store: o.Store, metrics: o.Metrics, lease: o.Lease, wait: o.WaitTimeout, opTime: o.OpTimeout, log: o.Logger,
		renewals: newRenewals(o.Lease)}
	if ip, ok := o.Store.(InProcessStore); ok {
		k.inProcess = ip.InProcess()
	}
	if k.opTime <= 0 {
		k.opTime = 5 * time.Second
	}
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	return k
}

// Request is a request that runs under an idempotency record: the client's
// Idempotency-Key, or a key derived from the body for content-keyed
// caching.
type Request struct {
	Key cache.Key
	// Raw is the key forwarded upstream (as ForwardKey): the client's
	// Idempotency-Key or one derived from its session (Derived); empty for
	// a content-derived key.
	Raw         string
	Fingerprint string
	TTL         time.Duration
	// Derived marks a key derived from the client's session header and
	// the fingerprint (DerivedKey), for a request that sent none.
	Derived bool
	// Cache marks a content-derived key (X-Llmgate-Cache: hit|miss).
	Cache bool
	// NoStore: Cache-Control: no-store — look up, but never commit.
	NoStore bool
	// Refused, when set, is why this request may store nothing new (the
	// store is full, its client over its quota): Claim then only waits
	// for the same key in flight and replays its answer; a key it finds
	// free it gives back at once and answers with Refused.
	Refused error
	// Model is the body's model: the model label of the tokens a replay
	// saves.
	Model string
	// ErrorBody renders the error of a not-stored marker in the shape of
	// the route's API, so that the key's retries get it as their SDK
	// parses it. If nil, apierror.Body (OpenAI's).
	ErrorBody func(*apierror.Error) []byte
	// StreamUsage reads the usage of a committed stream of the route's API
	// from its events, for the tokens a replay saves. If nil, a stream is
	// read as an OpenAI one (RecordUsage).
	StreamUsage func(events [][]byte) classify.Tokens
}

// CacheHeader turns content-keyed caching on or off for one request,
// overriding the upstream's cache setting: "on" or "off". Responses carry
// it too: "hit" or "miss".
const CacheHeader = "X-Llmgate-Cache"

// JoinedHeader is "true" on a duplicate of a keyed stream that joined the
// call running it on this replica: it gets what that call sends, as the
// first client does, and no upstream call of its own.
const JoinedHeader = "X-Llmgate-Joined"

// CommittedTrailer ends a keyed stream: "true" when it was committed and a
// retry with its key will replay it, "false" when it was served but not
// committed (cut short, failed, or over the record limits).
const CommittedTrailer = "X-Llmgate-Committed"

// ForwardKey is the Idempotency-Key sent upstream for k: an HMAC-SHA256
// of the scope (client), endpoint and key under the deployment's secret.
// Two tenants' equal keys differ upstream — a chained llmgate keeps them
// apart, and answers neither one's replay nor 422 to the other — and the
// client's key (which may name a business operation) cannot be read back
// from it. It is stable across replicas and restarts that share the secret,
// so an upstream that deduplicates still sees one key per operation.
func ForwardKey(secret []byte, k cache.Key) string { return NewMAC(secret).ForwardKey(k) }

// MAC is HMAC-SHA256 under one secret, for values computed on every
// request: hmac.New derives the key's pads and two hash states each time;
// a pooled one is Reset to the state just after the key instead.
type MAC struct{ pool sync.Pool }

// NewMAC is a MAC under secret.
func NewMAC(secret []byte) *MAC {
	m := &MAC{}
	m.pool.New = func() any { return hmac.New(sha256.New, secret) }
	return m
}

// Sum appends to dst the MAC of parts, each followed by a zero byte but
// the last.
func (m *MAC) Sum(dst []byte, parts ...string) []byte {
	h := m.pool.Get().(hash.Hash)
	h.Reset()
	for i, p := range parts {
		if i > 0 {
			h.Write([]byte{0})
		}
		io.WriteString(h, p)
	}
	dst = h.Sum(dst)
	m.pool.Put(h)
	return dst
}

// ForwardKey is ForwardKey under m's secret.
func (m *MAC) ForwardKey(k cache.Key) string {
	const prefix = "llmgate-"
	var sum [sha256.Size]byte
	out := make([]byte, len(prefix)+hex.EncodedLen(sha256.Size))
	copy(out, prefix)
	hex.Encode(out[len(prefix):], m.Sum(sum[:0], k.Scope, k.Endpoint, k.ID))
	return string(out)
}

// HashKey is how an idempotency key appears in logs and traces: enough to
// correlate one key's lines, not the key itself (it may embed business
// identifiers). It is scoped by client, so two tenants' equal keys log
// different hashes; an unscoped key (no clients configured) hashes as the
// key alone, as before. The endpoint is left out: one key's lines
// correlate across the endpoints it is used on.
func HashKey(k cache.Key) string {
	in := make([]byte, 0, 2*cache.MaxIDLen) // on the stack for any key that fits
	if k.Scope != "" {
		in = append(append(in, k.Scope...), 0)
	}
	sum := sha256.Sum256(append(in, k.ID...))
	var out [12]byte
	hex.Encode(out[:], sum[:6])
	return string(out[:])
}

// Event names what the claim ended in, for the log line.
type Event struct {
	// Replayed: a committed answer was written to the client.
	Replayed bool
	// Upstream is the replayed answer's upstream.
	Upstream string
	// Class is "replayed", "idempotency_mismatch" or
	// "idempotency_in_flight" when the claim answered the client itself.
	Class string
	// Waited: the claim waited for the same key in flight elsewhere, and
	// then replayed its answer or gave up at the client's deadline.
	Waited bool
	// InFlight: Lookup found the same key and body in flight, no answer
	// yet; a Claim would wait for it.
	InFlight bool
}

// Lookup answers a request that claims nothing (a Cache-Control: no-store
// one, one over its client's quota or while the store is full) from a
// committed record with the same fingerprint, if there is one: it reports
// true once it has replayed it. For a client's key, a record the store
// holds back (not yet on enough replicas: cache.ErrNotReplicated) is the
// store's error, for the caller to answer, as Claim's replay of it is:
// not a miss, which would run the call again beside an answer a retry
// may still get. A content-cache entry is no such promise: read plainly,
// and a miss when held back.
func (k *Keeper) Lookup(w http.ResponseWriter, r *http.Request, kr *Request) (Event, bool, error) {
	var rec *cache.Record
	var err error
	if rr, ok := k.store.(replayReader); ok && !kr.Cache {
		rec, err = rr.GetReplay(r.Context(), kr.Key, kr.Fingerprint)
	} else {
		rec, err = k.store.Get(r.Context(), kr.Key)
	}
	if err == nil && rec.State == cache.Committed && rec.Fingerprint == kr.Fingerprint {
		return k.replay(w, kr, rec), true, nil
	}
	if err == nil && rec.State == cache.InFlight && rec.Fingerprint == kr.Fingerprint {
		return Event{InFlight: true}, false, nil
	}
	if errors.Is(err, cache.ErrNotReplicated) {
		return Event{}, false, k.storeErr(r.Context(), err)
	}
	k.metrics.IdemEvent("cache_miss")
	return Event{}, false, nil
}

// replayReader is a store whose replay of a record waits for more than
// its read (Redis with WaitReplicas: the replicas); Lookup reads through
// it.
type replayReader interface {
	GetReplay(ctx context.Context, k cache.Key, fingerprint string) (*cache.Record, error)
}

// Claim loops until this request owns the key — it returns a Lease — or it
// has answered the client itself: a replay (nil Lease, nil error), or an
// error (422, 409, 503, 499, 504) for the caller to write. A wait for an
// in-flight duplicate is bounded by wait_timeout and by the client's own
// deadline (clientDeadline, when not zero), and ends when the client
// leaves; the store's claim itself does not (see claim). A client that has
// left gets ClientGone and holds no claim.
func (k *Keeper) Claim(w http.ResponseWriter, r *http.Request, kr *Request, clientDeadline time.Time) (*Lease, Event, error) {
	ctx := r.Context()
	start := time.Now()
	var (
		waitCtx  context.Context // made at the first wait: most claims never wait
		stopWait = func() {}
	)
	defer func() { stopWait() }()
	waited := false
	for {
		if ctx.Err() != nil {
			return nil, Event{}, apierror.ClientGone
		}
		at := k.renewals.now()
		cl, err := k.claim(ctx, kr)
		if err != nil {
			return nil, Event{}, k.storeErr(ctx, err)
		}
		switch cl.Status {
		case cache.Claimed:
			l, err := k.claimed(ctx, kr, cl.Owner, at)
			return l, Event{}, err
		case cache.Done:
			ev := k.replay(w, kr, cl.Record)
			ev.Waited = waited
			return nil, ev, nil
		case cache.Mismatch:
			k.metrics.IdemEvent("mismatch")
			return nil, Event{Class: "idempotency_mismatch"}, &apierror.KeyReused{}
		case cache.Busy:
			if !waited {
				k.metrics.IdemEvent("wait")
				waited = true
				waitCtx, stopWait = k.waitContext(ctx, start, clientDeadline)
			}
			if err := k.store.Wait(waitCtx, kr.Key); err != nil {
				if ctx.Err() == nil && context.Cause(waitCtx) == errClientDeadline {
					return nil, Event{Class: "client_deadline", Waited: true}, &apierror.ClientDeadline{Keyed: true}
				}
				if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
					k.metrics.IdemEvent("conflict")
					return nil, Event{Class: "idempotency_in_flight"}, &apierror.KeyInFlight{}
				}
				return nil, Event{}, k.storeErr(ctx, err)
			}
		}
	}
}

var errClientDeadline = errors.New("client deadline")

// claimed is the Lease of a claim the store gave owner at at: the
// request's to run, unless its client left while the claim ran (nothing
// has gone upstream for it: the key is given back now, so its retry
// claims at once rather than finding it in flight), or it may start no
// call (Request.Refused: the call it waited for ended without an answer).
func (k *Keeper) claimed(ctx context.Context, kr *Request, owner string, at time.Time) (*Lease, error) {
	l := &Lease{k: k, req: kr, owner: owner, heldAt: at}
	switch {
	case ctx.Err() != nil:
		l.Release(ctx)
		return nil, apierror.ClientGone
	case kr.Refused != nil:
		l.Release(ctx)
		return nil, kr.Refused
	}
	k.metrics.IdemEvent("claim")
	if kr.Cache {
		k.metrics.IdemEvent("cache_miss")
	}
	return l, nil
}

// waitContext bounds a claim's wait for an in-flight duplicate: wait_timeout
// from the claim's start, and the client's deadline when it sent one.
func (k *Keeper) waitContext(ctx context.Context, start, clientDeadline time.Time) (context.Context, context.CancelFunc) {
	wctx, cancel := context.WithDeadline(ctx, start.Add(k.wait))
	if clientDeadline.IsZero() {
		return wctx, cancel
	}
	dctx, cancelDL := context.WithDeadlineCause(wctx, clientDeadline, errClientDeadline)
	return dctx, func() { cancelDL(); cancel() }
}

// claim runs the store's claim detached from the client's context, bounded
// by the op timeout. Under the client's context a claim the store made as
// the client left could come back as the context's error (a driver gives
// up on the reply once the script has reached Redis): the record would be
// in flight with an owner nobody knows, renewed and released by nobody,
// and the client's retry would wait on it until its lease ran out.
// Detached, the claim's answer always comes back, and Claim releases a
// claim whose client has gone.
func (k *Keeper) claim(ctx context.Context, kr *Request) (cache.Claim, error) {
	octx, cancel := k.opCtx(ctx)
	defer cancel()
	return k.store.Claim(octx, kr.Key, kr.Fingerprint, k.lease)
}

// storeErr is a store failure while claiming, or the client leaving.
func (k *Keeper) storeErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return apierror.ClientGone
	}
	k.metrics.IdemEvent("store_error")
	return &apierror.StoreUnavailable{Err: err}
}

func (k *Keeper) replay(w http.ResponseWriter, kr *Request, rec *cache.Record) Event {
	if kr.Cache {
		w.Header().Set(CacheHeader, "hit")
		k.metrics.IdemEvent("cache_hit")
	} else {
		k.metrics.IdemEvent("replay")
	}
	k.metrics.UsageSaved(rec.Upstream, kr.Model, kr.Key.Scope, RecordUsage(rec, kr.StreamUsage))
	Replay(w, rec)
	return Event{Replayed: true, Upstream: rec.Upstream, Class: "replayed"}
}

// RecordUsage is the usage a committed answer reported: its body's, or a
// stream's as its API reads it (stream), or — stream nil, an OpenAI
// stream — its last usage chunk. Such a stream is read backwards from its end and
// only down to the chunk with a finish_reason — the usage comes with it
// or after it (OpenAI sends it last, with "choices":[]) — so a stream sent
// without include_usage costs a look at its tail, not a walk of it all.
func RecordUsage(rec *cache.Record, stream func(events [][]byte) classify.Tokens) classify.Tokens {
	if rec.Status < 200 || rec.Status > 299 {
		return classify.Tokens{} // a not-stored marker: no answer
	}
	if !rec.Stream {
		return classify.Usage(rec.Body)
	}
	if stream != nil {
		return stream(rec.Events)
	}
	for i := len(rec.Events) - 1; i >= 0; i-- {
		var o classify.StreamObserver
		o.Observe(sse.Data(rec.Events[i]))
		if t := o.Usage(); t.Reported || o.Finished() {
			return t
		}
		// A Responses stream's usage is in its terminal event.
		var r classify.ResponsesObserver
		if r.Observe(sse.Data(rec.Events[i])); r.Ended() {
			return r.Usage()
		}
	}
	return classify.Tokens{}
}

// Replay writes a committed record back to the client: the same status,
// headers and bytes; for a stream, the same events in order, each flushed.
func Replay(w http.ResponseWriter, rec *cache.Record) {
	h := w.Header()
	for k, v := range rec.Header {
		// A record from an earlier version may hold headers that are no
		// longer relayed; llmgate's own outcome headers are kept.
		if headers.Relayed(k) || k == "X-Llmgate-Outcome" || k == "X-Should-Retry" {
			h[k] = v
		}
	}
	h.Set("X-Llmgate-Upstream", rec.Upstream)
	h.Set("Idempotent-Replayed", "true")
	if rec.Stream {
		h.Del("Content-Length")
		if h.Get("Content-Type") == "" {
			h.Set("Content-Type", "text/event-stream")
		}
		w.WriteHeader(rec.Status)
		f, _ := w.(http.Flusher)
		for _, ev := range rec.Events {
			if _, err := w.Write(ev); err != nil {
				return
			}
			if f != nil {
				f.Flush()
			}
		}
		return
	}
	h.Set("Content-Length", strconv.Itoa(len(rec.Body)))
	w.WriteHeader(rec.Status)
	_, _ = w.Write(rec.Body)
}

// Lease is a claimed key: its owner commits or releases it.
type Lease struct {
	k     *Keeper
	req   *Request
	owner string
	// released: the key was given up; a second Release (a failed commit
	// released it, then the caller's cleanup does) does nothing.
	released atomic.Bool
	// settling: the call commits or releases the key. A renewal that
	// finds the key no longer its owner's from then on sees the call's
	// own doing, not a takeover (renewOnce).
	settling atomic.Bool

	// Renewal (renew.go): renewCtx is the call's, set by Renew; renewMu
	// is held across a renewal and guards the two flags: renewStopped
	// (StopRenewing), renewLost (the store said the key is not ours, or
	// the call's context ended).
	renewCtx     context.Context
	renewMu      sync.Mutex
	renewStopped bool
	renewLost    bool
	// heldAt is when the store last confirmed the lease: the claim's start,
	// then each successful renewal's (guarded by renewMu).
	heldAt time.Time

	// takeMu guards taken (a renewal found another owner holding the key)
	// and takenCh, made when first asked for (Taken) and closed once the
	// key is taken: only a call about to retry asks.
	takeMu  sync.Mutex
	taken   bool
	takenCh chan struct{}
}

// Taken is closed once a renewal of the lease has found the key not ours
// (cache.ErrNotOwner: another owner claimed it, or it was purged or lost
// in a failover): no answer of this call can be committed any more, so
// the call makes no further upstream attempt (proxy.Call.Lease); the
// client's retry with the key gets the answer of the call that now holds
// it, or runs again. Asked (as a retry is due) half a lease or more after
// the store last confirmed the lease, it renews it first (confirm).
func (l *Lease) Taken() <-chan struct{} {
	l.confirm()
	l.takeMu.Lock()
	defer l.takeMu.Unlock()
	if l.takenCh == nil {
		l.takenCh = make(chan struct{})
		if l.taken {
			close(l.takenCh)
		}
	}
	return l.takenCh
}

// TakenOver reports whether the key was taken over (Taken).
func (l *Lease) TakenOver() bool {
	l.takeMu.Lock()
	defer l.takeMu.Unlock()
	return l.taken
}

// markTaken notes the key taken over; true the first time.
func (l *Lease) markTaken() bool {
	l.takeMu.Lock()
	defer l.takeMu.Unlock()
	if l.taken {
		return false
	}
	l.taken = true
	if l.takenCh != nil {
		close(l.takenCh)
	}
	return true
}

// opCtx is the context of one store operation: detached from ctx's end,
// bounded by the op timeout alone (none for an InProcessStore, which could
// not be interrupted by it).
func (k *Keeper) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if k.inProcess {
		return context.WithoutCancel(ctx), func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), k.opTime)
}

// Commit stores rec under the key. On failure the completion exists but is
// not committed: the key is released and the error is a CommitFailed,
// so the client gets a 503 (or a stream its error event) rather than an
// answer a retry could contradict.
func (l *Lease) Commit(ctx context.Context, rec *cache.Record) error {
	rec.Fingerprint = l.req.Fingerprint
	l.settling.Store(true)
	octx, cancel := l.k.opCtx(ctx)
	defer cancel()
	err := l.k.store.Commit(octx, l.req.Key, l.owner, rec, l.req.TTL)
	if err == nil {
		l.k.metrics.IdemEvent("commit")
		return nil
	}
	l.k.log.Error("commit failed", "idempotency_key", HashKey(l.req.Key), "err", err)
	if errors.Is(err, cache.ErrNotOwner) {
		// The key is not ours any more (another owner claimed it, or it
		// was purged or lost), found by the commit before a renewal did:
		// a takeover, as a renewal's finding is, and nothing to release.
		if l.markTaken() {
			l.k.metrics.IdemEvent("taken_over")
		}
		return &apierror.CommitFailed{Err: err}
	}
	l.k.metrics.IdemEvent("store_error")
	l.Release(ctx)
	return &apierror.CommitFailed{Err: err}
}

// CommitNotStored commits a marker in place of an answer that was served
// (size bytes, at) but is too large to record: a retry with the key gets
// 410 idempotency_result_not_stored instead of paying for a second,
// different answer. The marker is an ordinary committed error response, so
// any version of llmgate replays it as such.
func (l *Lease) CommitNotStored(ctx context.Context, upstream string, size int64, at time.Time) error {
	e := apierror.Wire(&apierror.NotStored{Size: size, At: at})
	h := http.Header{"Content-Type": {"application/json"}, "X-Llmgate-Outcome": {"not_stored"}}
	apierror.SetRetry(h, e.ShouldRetry, e.RetryAfter)
	body := apierror.Body
	if l.req.ErrorBody != nil {
		body = l.req.ErrorBody
	}
	return l.Commit(ctx, &cache.Record{Status: http.StatusGone, Body: body(e), Upstream: upstream, Header: h})
}

// Release gives the key up, so the client's retry runs again. Only the
// first call does anything: it is counted once.
func (l *Lease) Release(ctx context.Context) {
	if l.released.Swap(true) {
		return
	}
	l.settling.Store(true)
	octx, cancel := l.k.opCtx(ctx)
	defer cancel()
	if err := l.k.store.Release(octx, l.req.Key, l.owner); err != nil && !errors.Is(err, cache.ErrNotOwner) {
		l.k.log.Warn("releasing idempotency key failed; it frees itself when its lease expires", "idempotency_key", HashKey(l.req.Key), "err", err)
	}
	l.k.metrics.IdemEvent("release")
}

// Uncommitted counts an answer that was served but not committed.
func (l *Lease) Uncommitted() { l.k.metrics.IdemEvent("uncommitted") }

// RecordHeader is what a committed record keeps of the response headers.
func RecordHeader(h http.Header, o classify.Outcome) map[string][]string {
	out := make(map[string][]string, len(h)+1)
	for k, v := range h {
		out[k] = v
	}
	if v := o.Header(); v != "" {
		out["X-Llmgate-Outcome"] = []string{v}
	}
	return out
}
