// Package deadletter keeps keyed requests that finally failed: it records
// them per key (body capped, no headers), resolves them when the key later
// succeeds, keeps the dead-letter gauges current and alerts (log, gauge,
// one webhook POST at most hourly) when the queue passes its threshold, and
// replays them — one paced replay used by the admin API and the page —
// under their original client and key through the gateway's own handler.
//
// It knows nothing of echo or upstreams; the handler it replays through is
// given to it.
package deadletter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/idempotency"
	"github.com/llmgate/llmgate/gateway/metrics"
	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/proxy"
)

// Store keeps dead letters. The Badger and Redis stores implement it.
type Store interface {
	PutDeadLetter(ctx context.Context, k cache.Key, d *cache.DeadLetter, ttl time.Duration) error
	GetDeadLetter(ctx context.Context, id string) (*cache.DeadLetter, error)
	DeleteDeadLetter(ctx context.Context, id string) error
	ListDeadLetters(ctx context.Context, f cache.DeadLetterFilter) ([]cache.DeadLetter, error)
}

// Lister is implemented by a store that holds the id of every dead letter
// in its own memory (Badger, one process): it answers, without an
// operation, whether one may exist. A store shared by replicas (Redis)
// cannot, and does not implement it.
type Lister interface {
	MayHaveDeadLetter(id string) bool
}

// Options configure a Queue. Store and Metrics are required.
type Options struct {
	Store   Store
	Metrics *metrics.Metrics
	Config  config.DeadLetters
	// Logger: if nil, logs are discarded.
	Logger *slog.Logger
	// Now is the clock. If nil, time.Now.
	Now func() time.Time
	// OnRecord, if not nil, is called after each dead letter is stored,
	// with the last upstream tried ("" if none was).
	OnRecord func(upstream string)
}

// Queue is the dead-letter queue and its monitor. Close stops the monitor.
type Queue struct {
	store   Store
	metrics *metrics.Metrics
	cfg     config.DeadLetters
	log     *slog.Logger
	now     func() time.Time
	handler http.Handler
	onRec   func(upstream string)

	pokeCh  chan struct{}
	stop    chan struct{}
	stopped chan struct{}
	client  *http.Client

	mu         sync.Mutex
	alerting   bool
	lastNotify time.Time
	// drops counts, by client, the letters the store deleted to keep the
	// client within its bound, since start (Dropped).
	drops map[string]int64
}

// New starts the queue's monitor.
func New(o Options) *Queue {
	q := &Queue{store: o.Store, metrics: o.Metrics, cfg: o.Config, log: o.Logger, now: o.Now, onRec: o.OnRecord,
		pokeCh: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{}),
		client: &http.Client{Timeout: o.Config.WebhookTimeout.D()}}
	if q.log == nil {
		q.log = slog.New(slog.DiscardHandler)
	}
	if q.now == nil {
		q.now = time.Now
	}
	go q.run()
	return q
}

// SetHandler names the handler replays run through: the gateway's own,
// built after the queue.
func (q *Queue) SetHandler(h http.Handler) { q.handler = h }

// Request is what a dead letter keeps of the request.
type Request struct {
	Model string
	// Query is the request's query string, replayed with it.
	Query string
	// Header is the request headers its key's fingerprint covers,
	// replayed with it.
	Header map[string][]string
	// Body is the request's body, held whole (a JSON body).
	Body []byte
	// NotKept: the body is not in Body — a multipart or binary
	// passthrough body, spooled as it came — and Size is its length. The
	// letter is kept for diagnosis, and replay refuses it. If false, Body
	// is the whole body.
	NotKept bool
	Size    int64
	// First is when the request started.
	First time.Time
}

// RequestOf is what a dead letter keeps of cl, which started at first: its
// JSON body, or the length of a body that was not held whole.
func RequestOf(cl *proxy.Call, first time.Time) Request {
	r := Request{Model: cl.Model, Query: cl.Query, Header: cl.FingerprintedHeaders(), Body: cl.Body, First: first}
	if cl.Body == nil && cl.Source != nil && cl.Source.Size() > 0 {
		r.NotKept, r.Size = true, cl.Source.Size()
	}
	return r
}

// Record stores a keyed request's final failure.
func (q *Queue) Record(ctx context.Context, k cache.Key, r Request, f *outcome.Failure) {
	body := r.Body
	truncated := false
	if max := q.cfg.MaxBodyBytes; max >= 0 && len(body) > max {
		body, truncated = body[:max], true
	}
	size := len(r.Body)
	if r.NotKept {
		size = int(r.Size)
	}
	d := &cache.DeadLetter{
		Model: r.Model, Query: r.Query, Header: r.Header, Body: body, BodySize: size, BodyTruncated: truncated, BodyNotKept: r.NotKept,
		Upstreams: f.Tried, Attempts: f.Attempts, Class: f.Class, Message: f.Message, Status: f.Status,
		FirstAt: r.First, LastAt: q.now(),
	}
	if err := q.store.PutDeadLetter(ctx, k, d, q.cfg.TTL.D()); err != nil {
		q.log.Error("recording dead letter failed", "idempotency_key", idempotency.HashKey(k), "err", err)
		return
	}
	q.metrics.DLQRecorded.WithLabelValues(f.Class).Inc()
	q.dropped(d)
	if q.onRec != nil {
		q.onRec(LastUpstream(*d))
	}
	q.log.Warn("dead letter recorded", "id", d.ID, "client", d.Client, "idempotency_key", idempotency.HashKey(k),
		"class", f.Class, "upstreams", strings.Join(f.Tried, ","), "failures", d.Failures)
	q.Poke()
}

// dropped counts the letters the store deleted to make room for d.
func (q *Queue) dropped(d *cache.DeadLetter) {
	if len(d.Dropped) == 0 {
		return
	}
	q.metrics.DeadLettersDropped(d.Client, len(d.Dropped))
	q.mu.Lock()
	if q.drops == nil {
		q.drops = map[string]int64{}
	}
	q.drops[d.Client] += int64(len(d.Dropped))
	q.mu.Unlock()
	q.log.Warn("dead letters dropped: the client is over its dead-letter bound", "client", d.Client, "dropped", len(d.Dropped))
}

// Dropped returns, by client, how many of its dead letters were deleted
// since start to keep it within its bound (oldest first).
func (q *Queue) Dropped() map[string]int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make(map[string]int64, len(q.drops))
	for c, n := range q.drops {
		out[c] = n
	}
	return out
}

// Resolve removes the dead letter of a key that has now succeeded.
func (q *Queue) Resolve(ctx context.Context, k cache.Key) {
	err := q.store.DeleteDeadLetter(ctx, cache.DeadLetterID(k))
	if err == nil {
		q.log.Info("dead letter resolved by a later success", "idempotency_key", idempotency.HashKey(k), "client", k.Scope)
		q.Poke()
	} else if !errors.Is(err, cache.ErrNotFound) {
		q.log.Warn("resolving dead letter failed", "idempotency_key", idempotency.HashKey(k), "err", err)
	}
}

// MayHold reports whether k may have a dead letter for Resolve to remove:
// false only where the store knows in memory that it has none (Lister),
// so that a keyed success, nearly always of a key that never failed,
// skips Resolve and the bounded context it would make for it. A Lister
// names a letter from before its write begins, so MayHold misses only a
// letter whose write has not started, which Resolve would miss too.
func (q *Queue) MayHold(k cache.Key) bool {
	l, ok := q.store.(Lister)
	return !ok || l.MayHaveDeadLetter(cache.DeadLetterID(k))
}

// Poke asks the monitor to recount now.
func (q *Queue) Poke() {
	select {
	case q.pokeCh <- struct{}{}:
	default:
	}
}

// Alerting reports whether the queue is over its alert threshold.
func (q *Queue) Alerting() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.alerting
}

func (q *Queue) run() {
	defer close(q.stopped)
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	q.refresh()
	for {
		select {
		case <-q.stop:
			return
		case <-t.C:
		case <-q.pokeCh:
		}
		q.refresh()
	}
}

// Close stops the monitor.
func (q *Queue) Close() {
	close(q.stop)
	<-q.stopped
}

// refresh recounts the queue, sets the gauges and evaluates the alert.
func (q *Queue) refresh() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	all, err := q.store.ListDeadLetters(ctx, cache.DeadLetterFilter{})
	if err != nil {
		if !errors.Is(err, cache.ErrClosed) {
			q.log.Warn("counting dead letters failed", "err", err)
		}
		return
	}
	byClass := map[string]int{}
	hourAgo := q.now().Add(-time.Hour)
	grewHour := 0
	for _, d := range all {
		byClass[d.Class]++
		if d.FirstAt.After(hourAgo) {
			grewHour++
		}
	}
	q.metrics.DLQSize.Reset()
	for c, n := range byClass {
		q.metrics.DLQSize.WithLabelValues(c).Set(float64(n))
	}
	dc := q.cfg
	alert := (dc.AlertThreshold > 0 && len(all) >= dc.AlertThreshold) ||
		(dc.AlertGrowthPerHour > 0 && grewHour >= dc.AlertGrowthPerHour)
	q.mu.Lock()
	was := q.alerting
	q.alerting = alert
	notify := alert && (!was || q.now().Sub(q.lastNotify) >= time.Hour)
	if notify {
		q.lastNotify = q.now()
	}
	q.mu.Unlock()
	if alert {
		q.metrics.DLQAlert.Set(1)
	} else {
		q.metrics.DLQAlert.Set(0)
	}
	if notify {
		msg := fmt.Sprintf("llmgate: %d dead letters (%d new in the last hour). Top cause: %s. See /admin/ to replay them after a fix.",
			len(all), grewHour, topCause(Group(all)))
		q.log.Error("dead letter queue over its alert threshold", "dead_letters", len(all), "last_hour", grewHour,
			"threshold", dc.AlertThreshold, "growth_threshold", dc.AlertGrowthPerHour)
		if dc.WebhookURL != "" {
			go q.notify(msg)
		}
	} else if was && !alert {
		q.log.Info("dead letter queue back under its alert threshold", "dead_letters", len(all))
	}
}

// notify POSTs a Slack-compatible {"text": ...} alert once, with its own
// timeout. A failed POST is logged, not retried.
func (q *Queue) notify(text string) {
	body, _ := json.Marshal(map[string]string{"text": text})
	req, err := http.NewRequest(http.MethodPost, q.cfg.WebhookURL, bytes.NewReader(body))
	if err != nil {
		// Not the URL (a parse error quotes it): it may carry a token.
		q.log.Error("dead letter webhook", "err", errors.Unwrap(err))
		return
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := q.client.Do(req)
	if err != nil {
		// The URL may carry a token (Slack puts it in the path): log the
		// error's kind only.
		q.log.Error("dead letter webhook failed", "err", errors.Unwrap(err))
		return
	}
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		q.log.Error("dead letter webhook refused the alert", "status", res.StatusCode)
	}
}

func topCause(s []GroupCount) string {
	if len(s) == 0 {
		return "none"
	}
	return fmt.Sprintf("%s on %s (%d)", s[0].Class, s[0].Upstream, s[0].Count)
}

// GroupCount is one root cause: dead letters by (last upstream, class).
type GroupCount struct {
	Upstream string `json:"upstream"`
	Class    string `json:"class"`
	Count    int    `json:"count"`
}

// LastUpstream is the upstream a dead letter's request tried last.
func LastUpstream(d cache.DeadLetter) string {
	if len(d.Upstreams) == 0 {
		return ""
	}
	return d.Upstreams[len(d.Upstreams)-1]
}

// Group counts dead letters by (upstream, class) — "group by root cause" —
// largest group first. A request that tried several upstreams counts under
// its last one.
func Group(ds []cache.DeadLetter) []GroupCount {
	counts := map[[2]string]int{}
	for _, d := range ds {
		counts[[2]string{LastUpstream(d), d.Class}]++
	}
	out := make([]GroupCount, 0, len(counts))
	for k, n := range counts {
		out = append(out, GroupCount{Upstream: k[0], Class: k[1], Count: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Upstream+out[i].Class < out[j].Upstream+out[j].Class
	})
	return out
}
