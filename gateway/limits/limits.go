// Package limits keeps one tenant from taking what all tenants share. Per
// configured client (config.ClientLimits, resolved by
// config.Client.EffectiveLimits) it keeps:
//
//   - a request rate: a token bucket (golang.org/x/time/rate) per client,
//     in this process, holding RequestsPerSecond/replicas and
//     ceil(Burst/replicas) — so the unkeyed path pays no round trip;
//   - a cap on requests in flight, ceil(MaxConcurrent/replicas) per
//     process: a Slot taken when a request is admitted and given back when
//     its work ends, which for a keyed call that runs on after its client
//     stopped waiting is when that call ends;
//   - a quota on the bytes the client keeps in the store: the records
//     committed under its keys (their cache.Record.StoredSize) and the
//     ownership entries of the provider objects it created under a shared
//     key, kept by the hour they expire in, so that hours which have
//     passed drop off. It is counted from the store at start
//     (ScanCommitted and ScanOwners; neither store reports expiries),
//     again every store.usage_rescan, and as this process writes them.
//
// A request over a limit is refused with an *apierror.ClientLimited (429,
// Retry-After) before it reaches an upstream. What a limit depends on
// failing (the store, for counting stored bytes) makes it admit requests:
// the limits fail open, and count so (metrics.ClientLimitFailOpen).
//
// With several replicas each one counts only its own commits between
// counts from the store, so it weighs them as if every replica committed
// as much: a client is over its quota when counted + replicas × own
// commits since the count reaches it. The fleet as a whole never passes
// the quota by more than the records admitted while under it; a client
// whose traffic all lands on one replica may be refused early, until the
// next count.
package limits

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/metrics"
)

// Store is what counting stored bytes needs of the store.
type Store interface {
	ScanCommitted(ctx context.Context, scope string, fn func(cache.CommittedRecord) error) error
	ScanOwners(ctx context.Context, scope string, fn func(cache.CommittedRecord) error) error
}

// Options configure a Limiter. Metrics is required.
type Options struct {
	// Config supplies clients (their names and limits), client_limits,
	// replicas and store.usage_rescan. With no clients configured,
	// client_limits applies to the one shared scope "".
	Config config.Config
	// Store is counted for stored bytes. If nil, stored bytes are only
	// counted as this process commits, and the storage limits fail open.
	Store   Store
	Metrics *metrics.Metrics
	// Logger: if nil, logs are discarded.
	Logger *slog.Logger
	// Now is the clock of the token buckets and of the hours stored bytes
	// expire in. If nil, time.Now.
	Now func() time.Time
	// ScanTimeout bounds one count of every limited client's stored bytes.
	// If <= 0, 1m.
	ScanTimeout time.Duration
}

const (
	defaultScanTimeout = time.Minute
	// retryCount is how soon a count that failed is tried again.
	retryCount = 30 * time.Second
	// recountEvery is how often a client refused for its stored bytes
	// has the store's purge mark read (with several replicas; see
	// CheckStorage).
	recountEvery = 10 * time.Second
)

// Limiter holds every client's limits and what counts against them. It is
// safe for concurrent use. Close stops its background counting.
type Limiter struct {
	clients  map[string]*client
	stored   []*client // the clients with a storage quota
	replicas int64
	now      func() time.Time
	store    Store
	metrics  *metrics.Metrics
	log      *slog.Logger
	rescan   time.Duration
	timeout  time.Duration

	countMu sync.Mutex // one count at a time
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	// marks reads the store's purge marks; nil when the store keeps none
	// (one process: its own purges reset its counts, Forget).
	marks purgeMarker
	// recounts are the purge-mark checks refusals started; closed (under
	// recountMu) stops new ones once Close waits for them.
	recounts  sync.WaitGroup
	recountMu sync.Mutex
	closed    bool
	// recounted, when set (tests), is sent to after each such check.
	recounted chan struct{}
}

// purgeMarker is what a store shared by replicas offers to tell them
// that a client's data was purged: a count of its purges.
type purgeMarker interface {
	PurgeMark(ctx context.Context, scope string) (int64, error)
}

// client is one client's limits and usage.
type client struct {
	name        string
	bucket      *rate.Limiter // nil: no rate limit
	maxInFlight int64         // 0: no limit
	inFlight    atomic.Int64
	maxStored   int64 // 0: no limit

	mu sync.Mutex
	// scanned is what the last count from the store found; local what this
	// process committed since that count began.
	scanned, local usage
	// known: a count from the store has succeeded (or a purge emptied it).
	known bool
	// gen is bumped by Forget, so a count that began before it is dropped.
	gen uint64
	// recountAfter is when a refusal may read the purge mark again
	// (CheckStorage); mark is the purge mark the last count began at.
	recountAfter time.Time
	mark         int64
}

// New builds the limiter and, when some client has a storage quota and
// there is a store, counts their stored bytes before it returns (within
// ScanTimeout; on failure the storage limits fail open and the count is
// retried every 30s), then recounts every store.usage_rescan.
func New(o Options) *Limiter {
	l := &Limiter{
		clients:  map[string]*client{},
		replicas: int64(max(o.Config.Replicas, 1)),
		now:      o.Now,
		store:    o.Store,
		metrics:  o.Metrics,
		log:      o.Logger,
		rescan:   o.Config.Store.UsageRescan.D(),
		timeout:  o.ScanTimeout,
		done:     make(chan struct{}),
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if m, ok := o.Store.(purgeMarker); ok && l.replicas > 1 {
		l.marks = m
	}
	if l.timeout <= 0 {
		l.timeout = defaultScanTimeout
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	if len(o.Config.Clients) == 0 {
		l.add("", config.ClientLimits{}.Over(o.Config.ClientLimits))
	}
	for _, c := range o.Config.Clients {
		l.add(c.Name, c.EffectiveLimits(o.Config.ClientLimits))
	}
	if len(l.stored) == 0 || l.store == nil {
		close(l.done)
		return l
	}
	ctx, cancel := context.WithTimeout(l.ctx, l.timeout)
	l.count(ctx)
	cancel()
	go l.run()
	return l
}

// add sets up a client with limits lim, each already for the whole fleet.
func (l *Limiter) add(name string, lim config.ClientLimits) {
	if lim == (config.ClientLimits{}) {
		return
	}
	c := &client{name: name, maxStored: lim.MaxStoredBytes}
	if lim.RequestsPerSecond > 0 {
		c.bucket = rate.NewLimiter(rate.Limit(lim.RequestsPerSecond/float64(l.replicas)), l.share(int64(lim.Burst)))
	}
	if lim.MaxConcurrent > 0 {
		c.maxInFlight = int64(l.share(int64(lim.MaxConcurrent)))
	}
	l.clients[name] = c
	if c.maxStored > 0 {
		l.stored = append(l.stored, c)
		l.metrics.ClientStored(name, 0)
	}
}

// share is this process's part of n: ceil(n/replicas), at least 1.
func (l *Limiter) share(n int64) int {
	return int(max((n+l.replicas-1)/l.replicas, 1))
}

// Close stops counting stored bytes in the background and waits for a
// count in progress to end.
func (l *Limiter) Close() {
	l.cancel()
	<-l.done
	l.recountMu.Lock()
	l.closed = true
	l.recountMu.Unlock()
	l.recounts.Wait()
}

// Slot is an admitted request's place among its client's requests in
// flight. Release gives it back. A nil *Slot — no concurrency limit — is
// valid and does nothing.
type Slot struct {
	c    *client
	held atomic.Bool
}

// Release gives the slot back. Only the first call does anything.
func (s *Slot) Release() {
	if s != nil && s.held.CompareAndSwap(true, false) {
		s.c.inFlight.Add(-1)
	}
}

// Take moves the slot to the returned one, which whoever outlives the
// caller releases: from then on s.Release does nothing. It is how a keyed
// call that runs on after its handler returned keeps its client's slot
// until it ends.
func (s *Slot) Take() *Slot {
	if s == nil || !s.held.CompareAndSwap(true, false) {
		return nil
	}
	t := &Slot{c: s.c}
	t.held.Store(true)
	return t
}

// Admit admits one request of client against its concurrency cap and its
// rate, in that order (a request refused for concurrency spends no token),
// and returns its Slot. Over either it returns an *apierror.ClientLimited.
// A client without limits (or a name not configured) is admitted at once.
func (l *Limiter) Admit(name string) (*Slot, error) {
	c := l.clients[name]
	if c == nil {
		return nil, nil
	}
	var slot *Slot
	if c.maxInFlight > 0 {
		if c.inFlight.Add(1) > c.maxInFlight {
			c.inFlight.Add(-1)
			return nil, l.refuse(c, apierror.LimitConcurrency, time.Second)
		}
		slot = &Slot{c: c}
		slot.held.Store(true)
	}
	if c.bucket != nil {
		now := l.now()
		if !c.bucket.AllowN(now, 1) {
			slot.Release()
			// The time until the bucket holds one token again, to the
			// millisecond: float error must not add a second to Retry-After.
			wait := (1 - c.bucket.TokensAt(now)) / float64(c.bucket.Limit())
			return nil, l.refuse(c, apierror.LimitRate, time.Duration(wait*float64(time.Second)).Round(time.Millisecond))
		}
	}
	return slot, nil
}

func (l *Limiter) refuse(c *client, limit apierror.Limit, retryAfter time.Duration) error {
	l.metrics.ClientLimited(c.name, string(limit))
	return &apierror.ClientLimited{Client: c.name, Limit: limit, RetryAfter: retryAfter}
}

// CheckStorage refuses a request that would store (a keyed one, one that
// creates provider objects under a shared key) of a client whose stored
// bytes have reached its quota: an *apierror.ClientLimited whose
// RetryAfter is when enough of them expire. A request under the quota is admitted whatever
// it will store, so a client may pass it by what its requests in flight
// store. Until a count from the store succeeds it checks what this
// process committed alone (fail open, counted).
//
// With several replicas, a refusal also reads the store's purge mark for
// the client (at most every recountEvery, in the background), and counts
// the client from the store when another replica has purged its data
// since the last count (DELETE /admin/clients/{name}/data): it stops
// being refused within seconds, not at the next store.usage_rescan. The
// mark is one read; a count scans the store, and happens once a purge.
func (l *Limiter) CheckStorage(name string) error {
	c := l.clients[name]
	if c == nil || c.maxStored == 0 {
		return nil
	}
	now := l.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.prune(now) {
		l.metrics.ClientStored(c.name, c.used(l.replicas))
	}
	if !c.known {
		l.metrics.ClientLimitFailOpen(string(apierror.LimitStorage))
	}
	if c.used(l.replicas) < c.maxStored {
		return nil
	}
	if l.marks != nil && !now.Before(c.recountAfter) {
		c.recountAfter = now.Add(recountEvery)
		l.recountMu.Lock()
		if !l.closed {
			l.recounts.Go(func() { l.recountIfPurged(c) })
		}
		l.recountMu.Unlock()
	}
	return l.refuse(c, apierror.LimitStorage, c.freedAfter(now, l.replicas))
}

// recountIfPurged counts c from the store, as count counts every client,
// if its purge mark moved since c was last counted.
func (l *Limiter) recountIfPurged(c *client) {
	defer func() {
		if l.recounted != nil {
			l.recounted <- struct{}{}
		}
	}()
	ctx, cancel := context.WithTimeout(l.ctx, l.timeout)
	mark, err := l.marks.PurgeMark(ctx, c.name)
	cancel()
	c.mu.Lock()
	moved := err == nil && mark != c.mark
	c.mu.Unlock()
	if !moved {
		return
	}
	l.countMu.Lock()
	defer l.countMu.Unlock()
	ctx, cancel = context.WithTimeout(l.ctx, l.timeout) // from the lock on
	defer cancel()
	// The mark just read: a purge since moves it past this count again.
	if err := l.countAt(ctx, c, mark); err != nil && l.ctx.Err() == nil {
		l.log.Warn("counting a client's stored bytes failed", slog.String("client", c.name), slog.Any("err", err))
	}
}

// Committed counts size bytes client stored now, to expire after ttl: a
// record committed under its key, or an ownership entry.
func (l *Limiter) Committed(name string, size int64, ttl time.Duration) {
	c := l.clients[name]
	if c == nil || c.maxStored == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.local.add(hourOf(l.now().Add(ttl)), size)
	l.metrics.ClientStored(c.name, c.used(l.replicas))
}

// Forget drops what is counted for client, after its data was purged: it
// starts again from zero, and a count in progress is not applied.
func (l *Limiter) Forget(name string) {
	c := l.clients[name]
	if c == nil || c.maxStored == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scanned, c.local = usage{}, usage{}
	c.known = true
	c.gen++
	l.metrics.ClientStored(c.name, 0)
}

// StoredBytes is what client's stored bytes count against its quota now
// (0 for a client without one).
func (l *Limiter) StoredBytes(name string) int64 {
	c := l.clients[name]
	if c == nil || c.maxStored == 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prune(l.now())
	return c.used(l.replicas)
}

// used is what counts against the quota; the caller holds c.mu.
func (c *client) used(replicas int64) int64 { return c.scanned.total + replicas*c.local.total }

func (c *client) prune(now time.Time) bool {
	h := hourOf(now)
	a, b := c.scanned.prune(h), c.local.prune(h)
	return a || b
}

// freedAfter is how long until enough hours have passed for the client to
// be under its quota again; the caller holds c.mu.
func (c *client) freedAfter(now time.Time, replicas int64) time.Duration {
	hours := map[int64]int64{}
	for h, n := range c.scanned.hours {
		hours[h] += n
	}
	for h, n := range c.local.hours {
		hours[h] += replicas * n
	}
	left := c.used(replicas)
	for _, h := range slices.Sorted(maps.Keys(hours)) {
		left -= hours[h]
		if left < c.maxStored {
			return time.Unix((h+1)*3600, 0).Sub(now)
		}
	}
	return time.Hour
}

// count counts the stored bytes of every client with a quota from the
// store, one client at a time. A client whose count fails keeps what it
// had; the errors are joined.
func (l *Limiter) count(ctx context.Context) error {
	l.countMu.Lock()
	defer l.countMu.Unlock()
	start := time.Now()
	var errs []error
	for _, c := range l.stored {
		if err := l.countClient(ctx, c); err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	switch {
	case err != nil && l.ctx.Err() != nil:
		// Closing: the count was cut short on purpose.
	case err != nil:
		l.log.Warn("counting clients' stored bytes failed; their storage limits count only this process's commits until a count succeeds",
			slog.Any("err", err))
	default:
		l.log.Debug("counted clients' stored bytes", slog.Int("clients", len(l.stored)), slog.Duration("took", time.Since(start)))
	}
	return err
}

// countClient counts c's stored bytes from the store; on failure c keeps
// what it had. The caller holds countMu.
func (l *Limiter) countClient(ctx context.Context, c *client) error {
	var mark int64
	if l.marks != nil {
		// Read first: a purge after it moves the mark past this count.
		m, err := l.marks.PurgeMark(ctx, c.name)
		if err != nil {
			l.metrics.UsageScan(false)
			return err
		}
		mark = m
	}
	return l.countAt(ctx, c, mark)
}

// countAt is countClient from the purge mark read before it began.
func (l *Limiter) countAt(ctx context.Context, c *client, mark int64) error {
	c.mu.Lock()
	gen, before := c.gen, c.local.clone()
	c.mu.Unlock()
	var got usage
	add := func(r cache.CommittedRecord) error {
		got.add(hourOf(r.ExpiresAt), r.Size)
		return nil
	}
	err := l.store.ScanCommitted(ctx, c.name, add)
	if err == nil {
		err = l.store.ScanOwners(ctx, c.name, add)
	}
	l.metrics.UsageScan(err == nil)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == gen {
		// What this process committed while the count ran stays local:
		// the count may have seen it too, which overcounts it until the
		// next count, never under.
		c.scanned = got
		c.local.sub(before)
		c.known = true
		c.mark = mark
	}
	c.prune(l.now())
	l.metrics.ClientStored(c.name, c.used(l.replicas))
	return nil
}

func (l *Limiter) allKnown() bool {
	for _, c := range l.stored {
		c.mu.Lock()
		k := c.known
		c.mu.Unlock()
		if !k {
			return false
		}
	}
	return true
}

// run counts again every rescan interval, and every 30s while a count has
// never succeeded, until Close.
func (l *Limiter) run() {
	defer close(l.done)
	for {
		wait := l.rescan
		if !l.allKnown() && (wait <= 0 || wait > retryCount) {
			wait = retryCount
		}
		if wait <= 0 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-l.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(l.ctx, l.timeout)
		l.count(ctx)
		cancel()
	}
}

// usage is stored bytes by the hour their records expire in (Unix hours:
// an hour h holds the records expiring in [h, h+1) hours since the epoch).
// Hour h drops off once the hour is over, so a record counts for at most
// an hour after it expired.
type usage struct {
	hours map[int64]int64
	total int64
	first int64 // the earliest hour in hours, if any
}

func hourOf(t time.Time) int64 {
	s := t.Unix()
	h := s / 3600
	if s%3600 < 0 {
		h--
	}
	return h
}

func (u *usage) add(h, n int64) {
	if u.hours == nil {
		u.hours = map[int64]int64{}
	}
	if len(u.hours) == 0 || h < u.first {
		u.first = h
	}
	u.hours[h] += n
	u.total += n
}

// prune drops the hours before now's and reports whether any went.
func (u *usage) prune(now int64) bool {
	if len(u.hours) == 0 || u.first >= now {
		return false
	}
	u.first = math.MaxInt64
	for h, n := range u.hours {
		if h < now {
			delete(u.hours, h)
			u.total -= n
		} else {
			u.first = min(u.first, h)
		}
	}
	return true
}

// sub takes o's bytes away, hour by hour, where u still has them.
func (u *usage) sub(o usage) {
	for h, n := range o.hours {
		cur, ok := u.hours[h]
		if !ok {
			continue
		}
		n = min(n, cur)
		u.total -= n
		if cur == n {
			delete(u.hours, h)
		} else {
			u.hours[h] = cur - n
		}
	}
	u.first = math.MaxInt64
	for h := range u.hours {
		u.first = min(u.first, h)
	}
}

func (u usage) clone() usage {
	c := u
	c.hours = make(map[int64]int64, len(u.hours))
	for h, n := range u.hours {
		c.hours[h] = n
	}
	return c
}
