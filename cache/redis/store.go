// Package redisstore is the idempotency store of package cache shared by
// several gateway replicas through one Redis (or Redis Cluster): claims,
// records and dead letters in Redis, waiters woken across replicas by
// pub/sub, and the breaker overrides every replica applies. It passes
// cache/storetest. Its import path is .../cache/redis; the package is named
// redisstore so that it does not shadow go-redis's package redis.
package redisstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/internal/codec"
	"github.com/llmgate/llmgate/cache/internal/waiters"
)

// Options configures Open. Only URL is required.
type Options struct {
	// URL is redis://[user:password@]host:port[/db][?options] or rediss://
	// for TLS, parsed by redis.ParseURL (redis.ParseClusterURL when Cluster:
	// further nodes as &addr=host:port). Required. Unless the URL sets them,
	// dial_timeout, read_timeout and write_timeout are 1s and max_retries is
	// 1, so that calls fail fast while Redis is down.
	URL string
	// PoolSize is the number of connections per node. If <= 0, go-redis's
	// default (10 per GOMAXPROCS).
	PoolSize int
	// Prefix starts every key and channel, so several gateways (or tests)
	// can share one Redis. If "", "llmgate:". In Cluster mode it must not
	// contain '{' or '}', which would take over the keys' hash tags.
	Prefix string
	// Cluster uses a Redis Cluster client. Every script touches one key, or
	// keys of one hash tag, so no command crosses slots (see the key layout
	// in keys.go).
	Cluster bool
	// SentinelMaster, when set, finds the primary through Redis Sentinel
	// (go-redis's failover client): the Sentinels at SentinelAddrs name the
	// primary they monitor under this name, and the store follows them to
	// a promoted replica after a failover. URL then supplies only the data
	// nodes' credentials, database, TLS and timeouts — its host is
	// ignored — and may be "". Not with Cluster.
	SentinelMaster string
	// SentinelAddrs are the Sentinels' host:port. Required with
	// SentinelMaster.
	SentinelAddrs []string
	// SentinelPassword is the Sentinels' own password (their
	// requirepass), apart from the data nodes' in URL. "" for none.
	SentinelPassword string
	// Now is the clock for leases, CreatedAt and ExpiresAt. If nil,
	// time.Now. Redis's own expiry (PX) runs on real time.
	Now func() time.Time
	// After is the timer Wait uses to wake when a lease runs out, on the
	// Now clock. If nil, time.After.
	After func(time.Duration) <-chan time.Time
	// Logger receives connection trouble and unreadable entries. If nil,
	// they are discarded.
	Logger *slog.Logger
	// PollInterval is how often Wait re-reads a record it waits on, in
	// case the wake-up message was lost while the pub/sub connection
	// reconnected; also the retry period of WatchBreakerOverrides. If <= 0,
	// 1s.
	PollInterval time.Duration
	// WaitReplicas, when > 0, makes Commit wait (Redis WAIT, on the
	// connection that wrote the record) until that many replicas have
	// acknowledged the committed record. Fewer within WaitTimeout fail the
	// Commit with ErrNotReplicated; the record stays committed on the
	// primary (Redis cannot take a write back), so a retry that reaches
	// this primary replays it, and one after a failover that lost it runs
	// the key again. Either way the caller, told the commit failed, never
	// showed its client a complete answer. If 0, Commit returns once the
	// primary has the record.
	WaitReplicas int
	// WaitTimeout bounds WAIT. If <= 0, 1s. Keep it under the commit's
	// context deadline (store.op_timeout), or the context ends it first.
	WaitTimeout time.Duration
	// DeadLetters bounds each client's dead letters (see
	// cache.DeadLetterBound and letters.go). The zero value bounds
	// nothing.
	DeadLetters cache.DeadLetterBound
	// WriteV1Records writes every record uncompressed, as version 1 (see
	// cache/internal/codec), which releases before version 2 read: set it
	// while such a release shares this Redis (a rolling upgrade), since it
	// refuses a compressed record (ErrUnknownVersion) and answers that
	// key's retries with an error instead of the replay. This release
	// reads both either way. If false, records are compressed where that
	// pays.
	WriteV1Records bool
}

// clusterReload is how often a Cluster store re-reads the slot map, so a
// failover (a replica promoted in a dead master's place) is followed within
// about this long.
const clusterReload = time.Second

// ErrNotReplicated: Options.WaitReplicas replicas did not acknowledge a
// commit within Options.WaitTimeout. The record is committed on the
// primary; a failover to a replica that lacks it loses it.
var ErrNotReplicated = cache.ErrNotReplicated

// Store is the idempotency store shared by several gateway replicas: one
// Idempotency-Key means one upstream call across all of them. It has the
// method set and semantics of the Badger store (cache/badger), with these
// differences:
//
//   - Owner tokens are random. There is no "previous process" shortcut: a
//     dead replica's claim is taken over when its lease runs out.
//   - Waiters are woken by pub/sub across replicas (one PSUBSCRIBE
//     connection per store, fanned out locally), with a PollInterval
//     re-read as the fallback for messages lost in a reconnect.
//   - Stats reports no LSMBytes or VLogBytes.
//   - Breaker overrides are shared (SetBreakerOverride and friends).
//
// A record is one hash (fields in scripts.go) whose data field holds the
// record as codec.EncodeRecord writes it, the same bytes Badger stores. Every
// state change is one Lua script comparing and setting the owner token.
// Renew and Commit first read the record (one round trip) to build the new
// bytes in Go, then compare-and-set on the owner.
//
// It is safe for concurrent use. Calls while Redis is unreachable fail within
// about the dial timeout; go-redis reconnects by itself. go-redis resends a
// command once after a network error (max_retries=1), so a script may run
// twice: Claim recognises its own owner token and Commit its own per-call
// nonce, so their retries still succeed; a retried Release or Delete whose
// first run took effect reports ErrNotOwner or ErrNotFound.
type Store struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // nil unless Cluster
	bound   cache.DeadLetterBound
	prefix  string
	now     func() time.Time
	after   func(time.Duration) <-chan time.Time
	log     *slog.Logger
	poll    time.Duration

	// Pub/sub: one connection, subscribed to the wake pattern and the
	// breakers channel; dispatch fans messages out to waiters and watchers.
	ps            *redis.PubSub
	wakePattern   string
	psDone        chan struct{} // closed when dispatch returns
	ready         chan struct{} // closed once both subscriptions are confirmed
	readyOnce     sync.Once
	subscriptions atomic.Int64 // wake-pattern (re)subscriptions, for tests

	waiters  waiters.Broadcast
	watchMu  sync.Mutex
	watchers map[*breakerWatcher]struct{}

	waitReplicas int
	waitTimeout  time.Duration
	v1Records    bool // Options.WriteV1Records

	closed    atomic.Bool
	done      chan struct{} // closed by Close
	closeOnce sync.Once
	closeErr  error

	statsMu sync.Mutex
	stats   cache.Stats

	// waitBlocked, if set (tests), is called each time Wait is about to block.
	waitBlocked func()
}

const (
	defaultRedisPrefix  = "llmgate:"
	defaultPollInterval = time.Second
	defaultWaitTimeout  = time.Second
	redisTimeout        = time.Second
	redisScanCount      = 1000
	redisBatch          = 256
	// readyWait bounds how long Open waits for the pub/sub
	// subscription when Redis answers: Waits started before it are not
	// woken by pub/sub but by the PollInterval re-read.
	readyWait = 2 * time.Second
	// inFlightGrace is how long past its lease Redis keeps an in-flight
	// record (its PX): a claimant takes over an expired lease long before
	// that, and until then its owner may still renew it; the PX only makes
	// sure an orphan nobody claims again disappears.
	inFlightGrace = time.Minute
	statsMaxAge   = 5 * time.Second
	// maxConflictRetries bounds PutDeadLetter's WATCH/MULTI retries.
	maxConflictRetries = 100
)

// Open connects to Redis. It fails on a bad URL or options, but not
// when Redis is unreachable: the gateway must start and reconnect by
// itself, and calls fail meanwhile (Ping reports it). ctx bounds the
// initial ping and the wait for the pub/sub subscription.
func Open(ctx context.Context, o Options) (*Store, error) {
	if o.URL == "" && o.SentinelMaster == "" {
		return nil, errors.New("open redis store: Options.URL is required")
	}
	r := &Store{
		prefix:   o.Prefix,
		now:      o.Now,
		after:    o.After,
		log:      o.Logger,
		poll:     o.PollInterval,
		psDone:   make(chan struct{}),
		ready:    make(chan struct{}),
		done:     make(chan struct{}),
		watchers: make(map[*breakerWatcher]struct{}),
	}
	if r.prefix == "" {
		r.prefix = defaultRedisPrefix
	}
	if o.Cluster && strings.ContainsAny(r.prefix, "{}") {
		return nil, fmt.Errorf("open redis store: Prefix %q must not contain '{' or '}' in Cluster mode: they would take over the keys' hash tags", r.prefix)
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.after == nil {
		r.after = time.After
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.poll <= 0 {
		r.poll = defaultPollInterval
	}
	r.waitReplicas, r.waitTimeout = o.WaitReplicas, o.WaitTimeout
	r.v1Records = o.WriteV1Records
	r.bound = o.DeadLetters
	if r.waitTimeout <= 0 {
		r.waitTimeout = defaultWaitTimeout
	}

	opt, err := storeOptions(o)
	if err != nil {
		return nil, fmt.Errorf("open redis store: %w", err)
	}
	setDefault(&opt.DialTimeout, redisTimeout)
	setDefault(&opt.ReadTimeout, redisTimeout)
	setDefault(&opt.WriteTimeout, redisTimeout)
	setDefault(&opt.MaxRetries, 1)
	setDefault(&opt.DialerRetries, 1)
	if o.PoolSize > 0 {
		opt.PoolSize = o.PoolSize
	}
	opt.ContextTimeoutEnabled = true
	r.client, r.cluster = newClient(opt, o.Cluster)

	r.wakePattern = globEscape(r.prefix) + redisWakeNS + "*"
	r.ps = r.client.Subscribe(context.Background())
	// Both calls remember the subscription even when Redis is down, and
	// go-redis subscribes again on every reconnection.
	_ = r.ps.PSubscribe(ctx, r.wakePattern)
	_ = r.ps.Subscribe(ctx, r.breakersKey())
	go r.dispatch(r.ps.ChannelWithSubscriptions(redis.WithChannelSize(1024)))

	if err := r.Ping(ctx); err != nil {
		r.log.Warn("redis store unreachable at start; it reconnects by itself", slog.Any("err", err))
		return r, nil
	}
	wait, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	select {
	case <-r.ready:
	case <-wait.Done():
		r.log.Warn("redis store: pub/sub not subscribed yet; waiters poll until it is")
	}
	return r, nil
}

// newClient makes the client of opt: a Cluster client when cluster, else
// what redis.NewUniversalClient makes (a failover client with a master
// name, a plain one otherwise).
func newClient(opt *redis.UniversalOptions, cluster bool) (redis.UniversalClient, *redis.ClusterClient) {
	if !cluster {
		return redis.NewUniversalClient(opt), nil
	}
	// go-redis re-reads the slot map only on a MOVED reply or once its copy
	// is ClusterStateReloadInterval old (60s by default), and a dead master
	// sends no MOVED: after a failover the keys of its slots would fail for
	// up to a minute while its replica serves them. Re-read it every
	// clusterReload instead (one CLUSTER SLOTS).
	co := opt.Cluster()
	co.ClusterStateReloadInterval = clusterReload
	c := redis.NewClusterClient(co)
	return c, c
}

// storeOptions are the client options of o: its URL's (universalOptions),
// and with SentinelMaster the Sentinels in place of the URL's host, so
// that redis.NewUniversalClient makes a failover client.
func storeOptions(o Options) (*redis.UniversalOptions, error) {
	if o.SentinelMaster == "" {
		return universalOptions(o.URL, o.Cluster)
	}
	if o.Cluster || len(o.SentinelAddrs) == 0 {
		return nil, errors.New("SentinelMaster needs SentinelAddrs, and no Cluster")
	}
	opt := &redis.UniversalOptions{}
	if o.URL != "" {
		var err error
		if opt, err = universalOptions(o.URL, false); err != nil {
			return nil, err
		}
	}
	opt.Addrs = slices.Clone(o.SentinelAddrs)
	opt.MasterName = o.SentinelMaster
	opt.SentinelPassword = o.SentinelPassword
	return opt, nil
}

// universalOptions parses url as go-redis does for the client that cluster
// selects — redis.ParseURL, or redis.ParseClusterURL, which takes further
// nodes as &addr=host:port — into the options redis.NewUniversalClient
// takes. With cluster, IsClusterMode makes even one address a cluster
// client; without, ParseURL admits one address, so the client is a plain
// one. Every field either parser sets is carried over (TestRedisURLOptions
// holds this to go-redis).
func universalOptions(url string, cluster bool) (*redis.UniversalOptions, error) {
	if cluster {
		o, err := redis.ParseClusterURL(url)
		if err != nil {
			return nil, err
		}
		return &redis.UniversalOptions{
			Addrs:                   o.Addrs,
			IsClusterMode:           true,
			ClientName:              o.ClientName,
			Protocol:                o.Protocol,
			Username:                o.Username,
			Password:                o.Password,
			TLSConfig:               o.TLSConfig,
			MaxRedirects:            o.MaxRedirects,
			ReadOnly:                o.ReadOnly,
			RouteByLatency:          o.RouteByLatency,
			RouteByLatencyTolerance: o.RouteByLatencyTolerance,
			RouteRandomly:           o.RouteRandomly,
			MaxRetries:              o.MaxRetries,
			MinRetryBackoff:         o.MinRetryBackoff,
			MaxRetryBackoff:         o.MaxRetryBackoff,
			DialTimeout:             o.DialTimeout,
			DialerRetries:           o.DialerRetries,
			DialerRetryTimeout:      o.DialerRetryTimeout,
			ReadTimeout:             o.ReadTimeout,
			WriteTimeout:            o.WriteTimeout,
			PoolFIFO:                o.PoolFIFO,
			PoolSize:                o.PoolSize,
			MaxConcurrentDials:      o.MaxConcurrentDials,
			PoolTimeout:             o.PoolTimeout,
			MinIdleConns:            o.MinIdleConns,
			MaxIdleConns:            o.MaxIdleConns,
			MaxActiveConns:          o.MaxActiveConns,
			PipelinePoolSize:        o.PipelinePoolSize,
			PipelineReadBufferSize:  o.PipelineReadBufferSize,
			PipelineWriteBufferSize: o.PipelineWriteBufferSize,
			ConnMaxIdleTime:         o.ConnMaxIdleTime,
			ConnMaxLifetime:         o.ConnMaxLifetime,
			ConnMaxLifetimeJitter:   o.ConnMaxLifetimeJitter,
			FailingTimeoutSeconds:   o.FailingTimeoutSeconds,
		}, nil
	}
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	return &redis.UniversalOptions{
		Addrs:                   []string{o.Addr},
		DB:                      o.DB,
		ClientName:              o.ClientName,
		Protocol:                o.Protocol,
		Username:                o.Username,
		Password:                o.Password,
		TLSConfig:               o.TLSConfig,
		MaxRetries:              o.MaxRetries,
		MinRetryBackoff:         o.MinRetryBackoff,
		MaxRetryBackoff:         o.MaxRetryBackoff,
		DialTimeout:             o.DialTimeout,
		ReadTimeout:             o.ReadTimeout,
		WriteTimeout:            o.WriteTimeout,
		PoolFIFO:                o.PoolFIFO,
		PoolSize:                o.PoolSize,
		MaxConcurrentDials:      o.MaxConcurrentDials,
		PoolTimeout:             o.PoolTimeout,
		MinIdleConns:            o.MinIdleConns,
		MaxIdleConns:            o.MaxIdleConns,
		MaxActiveConns:          o.MaxActiveConns,
		PipelinePoolSize:        o.PipelinePoolSize,
		PipelineReadBufferSize:  o.PipelineReadBufferSize,
		PipelineWriteBufferSize: o.PipelineWriteBufferSize,
		ConnMaxIdleTime:         o.ConnMaxIdleTime,
		ConnMaxLifetime:         o.ConnMaxLifetime,
		ConnMaxLifetimeJitter:   o.ConnMaxLifetimeJitter,
	}, nil
}

func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// Claim takes the key for the caller, or reports why it cannot, in one
// script; the outcomes are those of the Badger store's Claim. The owner
// token is random.
func (r *Store) Claim(ctx context.Context, k cache.Key, fingerprint string, lease time.Duration) (cache.Claim, error) {
	if lease <= 0 {
		return cache.Claim{}, fmt.Errorf("claim %s: lease %v must be positive", k, lease)
	}
	if err := k.Validate(); err != nil {
		return cache.Claim{}, fmt.Errorf("claim %s: %w", k, err)
	}
	if err := r.begin(ctx); err != nil {
		return cache.Claim{}, fmt.Errorf("claim %s: %w", k, err)
	}
	now := r.now()
	owner := rand.Text()
	rec := &cache.Record{
		State:       cache.InFlight,
		Fingerprint: fingerprint,
		Owner:       owner,
		LeaseUntil:  now.Add(lease),
		CreatedAt:   now,
	}
	key := r.recordKey(recordIdent(k))
	// With WaitReplicas a replay waits for the replicas on the connection
	// that read the record (replicated).
	var run redis.Scripter = r.client
	var conn *redis.Conn
	if r.waitReplicas > 0 {
		node, err := r.primaryFor(ctx, key)
		if err != nil {
			return cache.Claim{}, fmt.Errorf("claim %s: %w", k, r.mapErr(err))
		}
		conn = node.Conn()
		defer conn.Close()
		run = conn
	}
	res, err := claimScript.Run(ctx, run, []string{key},
		fingerprint, luaTime(now), owner, luaTime(rec.LeaseUntil), r.encode(rec),
		pxMillis(lease+inFlightGrace)).Slice()
	if err != nil {
		return cache.Claim{}, fmt.Errorf("claim %s: %w", k, r.mapErr(err))
	}
	var c cache.Claim
	switch status, _ := res[0].(int64); status {
	case 0:
		return cache.Claim{Status: cache.Claimed, Owner: owner}, nil
	case 1:
		c.Status = cache.Busy
	case 2:
		c.Status = cache.Done
	case 3:
		c.Status = cache.Mismatch
	default:
		return cache.Claim{}, fmt.Errorf("claim %s: unexpected script reply %v", k, res)
	}
	if len(res) < 2 {
		return cache.Claim{}, fmt.Errorf("claim %s: unexpected script reply %v", k, res)
	}
	data, _ := res[1].(string)
	if c.Record, err = codec.DecodeRecord([]byte(data)); err != nil {
		return cache.Claim{}, fmt.Errorf("claim %s: %w", k, err)
	}
	if c.Status == cache.Done && conn != nil {
		if err := r.replicated(ctx, conn, key); err != nil {
			return cache.Claim{}, fmt.Errorf("claim %s: %w", k, err)
		}
	}
	return c, nil
}

// replicated holds a replay back until WaitReplicas replicas have the
// record the connection just read. A commit whose WAIT failed stays on
// the primary, and a duplicate or retry that replayed it there would show
// its client an answer a failover can still lose (and the retry after it
// would get another). WAIT counts only the connection's own writes, so it
// writes a barrier (a short-lived key in the record's slot) after the
// read: replicas apply the primary's writes in order, so once they have
// acknowledged the barrier they have the record too. Fewer within
// WaitTimeout: ErrNotReplicated, and the client is told to retry.
func (r *Store) replicated(ctx context.Context, conn *redis.Conn, key string) error {
	if err := conn.Set(ctx, r.barrierKey(key), "1", time.Second).Err(); err != nil {
		return r.mapErr(err)
	}
	n, err := conn.Wait(ctx, r.waitReplicas, r.waitTimeout).Result()
	if err != nil {
		return fmt.Errorf("%w: WAIT %d before a replay: %w", ErrNotReplicated, r.waitReplicas, r.mapErr(err))
	}
	if n < int64(r.waitReplicas) {
		return fmt.Errorf("%w: a replay found %d of %d within %v", ErrNotReplicated, n, r.waitReplicas, r.waitTimeout)
	}
	return nil
}

// Renew extends the lease of the caller's in-flight record to now+lease.
// ErrNotOwner if the key is not in flight under owner. A lease that has run
// out is still renewed if nobody has taken it over.
func (r *Store) Renew(ctx context.Context, k cache.Key, owner string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("renew %s: lease %v must be positive", k, lease)
	}
	if err := k.Validate(); err != nil {
		return fmt.Errorf("renew %s: %w", k, err)
	}
	if err := r.renew(ctx, r.recordKey(recordIdent(k)), owner, lease); err != nil {
		return fmt.Errorf("renew %s: %w", k, err)
	}
	return nil
}

func (r *Store) renew(ctx context.Context, key, owner string, lease time.Duration) error {
	cur, err := r.owned(ctx, key, owner, "data")
	if err != nil {
		return err
	}
	rec, err := codec.DecodeRecord([]byte(cur[0]))
	if err != nil {
		return err
	}
	rec.LeaseUntil = r.now().Add(lease)
	ok, err := renewScript.Run(ctx, r.client, []string{key},
		owner, luaTime(rec.LeaseUntil), r.encode(rec), pxMillis(lease+inFlightGrace)).Int()
	if err != nil {
		return r.mapErr(err)
	}
	if ok != 1 {
		return cache.ErrNotOwner
	}
	return nil
}

// Commit stores rec as the key's committed record if the key is still in
// flight under owner (ErrNotOwner otherwise), as the Badger store's Commit
// does. Redis
// drops it after ttl. Waiters on every replica are woken.
func (r *Store) Commit(ctx context.Context, k cache.Key, owner string, rec *cache.Record, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("commit %s: ttl %v must be positive", k, ttl)
	}
	if rec == nil {
		return fmt.Errorf("commit %s: nil record", k)
	}
	if err := k.Validate(); err != nil {
		return fmt.Errorf("commit %s: %w", k, err)
	}
	ident := recordIdent(k)
	if err := r.commit(ctx, ident, owner, rec, ttl); err != nil {
		return fmt.Errorf("commit %s: %w", k, err)
	}
	// Local waiters need not depend on the pub/sub connection.
	r.waiters.Wake(ident)
	return nil
}

func (r *Store) commit(ctx context.Context, ident, owner string, rec *cache.Record, ttl time.Duration) error {
	key := r.recordKey(ident)
	cur, err := r.owned(ctx, key, owner, "fp")
	if err != nil {
		return err
	}
	now := r.now()
	stored := *rec
	stored.State = cache.Committed
	stored.Fingerprint = cur[0]
	stored.Owner = ""
	stored.LeaseUntil = time.Time{}
	stored.CreatedAt = now
	stored.ExpiresAt = now.Add(ttl)
	args := []any{owner, stored.Fingerprint, r.encode(&stored), luaTime(stored.ExpiresAt),
		pxMillis(ttl), r.wakeChannel(ident), rand.Text(), stored.StoredSize()}
	if r.waitReplicas > 0 {
		return r.commitReplicated(ctx, key, args)
	}
	ok, err := commitScript.Run(ctx, r.client, []string{key}, args...).Int()
	if err != nil {
		return r.mapErr(err)
	}
	if ok != 1 {
		return cache.ErrNotOwner
	}
	return nil
}

// commitReplicated runs the commit script and then WAIT on one connection
// of the key's primary: WAIT counts the replicas that have every write of
// its own connection, so it must follow the script on the same one. A
// go-redis retry of the script that finds its own commit already there
// writes again (a PEXPIRE, see commitScript), so WAIT still covers the
// record on the retry's connection.
func (r *Store) commitReplicated(ctx context.Context, key string, args []any) error {
	node, err := r.primaryFor(ctx, key)
	if err != nil {
		return r.mapErr(err)
	}
	conn := node.Conn()
	defer conn.Close()
	ok, err := commitScript.Run(ctx, conn, []string{key}, args...).Int()
	if err != nil {
		return r.mapErr(err)
	}
	if ok != 1 {
		return cache.ErrNotOwner
	}
	n, err := conn.Wait(ctx, r.waitReplicas, r.waitTimeout).Result()
	if err != nil {
		return fmt.Errorf("%w: WAIT %d: %w", ErrNotReplicated, r.waitReplicas, r.mapErr(err))
	}
	if n < int64(r.waitReplicas) {
		return fmt.Errorf("%w: %d of %d within %v", ErrNotReplicated, n, r.waitReplicas, r.waitTimeout)
	}
	return nil
}

// primaryFor is the client of the primary that holds key.
func (r *Store) primaryFor(ctx context.Context, key string) (*redis.Client, error) {
	if r.cluster != nil {
		return r.cluster.MasterForKey(ctx, key)
	}
	c, ok := r.client.(*redis.Client)
	if !ok {
		return nil, fmt.Errorf("redis store: WaitReplicas needs a single-primary or cluster client, not %T", r.client)
	}
	return c, nil
}

// owned reads fields of the record at key if it is in flight under owner,
// else returns ErrNotOwner. The scripts check again: this read only
// supplies what Go needs to build the new value.
func (r *Store) owned(ctx context.Context, key, owner string, fields ...string) ([]string, error) {
	if err := r.begin(ctx); err != nil {
		return nil, err
	}
	if owner == "" {
		return nil, cache.ErrNotOwner
	}
	vals, err := r.client.HMGet(ctx, key, append([]string{"state", "owner"}, fields...)...).Result()
	if err != nil {
		return nil, r.mapErr(err)
	}
	if vals[0] != "1" || vals[1] != owner {
		return nil, cache.ErrNotOwner
	}
	out := make([]string, len(fields))
	for i := range fields {
		s, ok := vals[2+i].(string)
		if !ok {
			return nil, cache.ErrNotOwner
		}
		out[i] = s
	}
	return out, nil
}

// Release deletes the caller's in-flight record, so the client may retry,
// and wakes waiters. ErrNotOwner if the key is not in flight under owner.
func (r *Store) Release(ctx context.Context, k cache.Key, owner string) error {
	if err := k.Validate(); err != nil {
		return fmt.Errorf("release %s: %w", k, err)
	}
	ident := recordIdent(k)
	err := r.begin(ctx)
	if err == nil && owner == "" {
		err = cache.ErrNotOwner
	}
	if err == nil {
		var ok int
		ok, err = releaseScript.Run(ctx, r.client, []string{r.recordKey(ident)}, owner, r.wakeChannel(ident)).Int()
		if err == nil && ok != 1 {
			err = cache.ErrNotOwner
		}
	}
	if err != nil {
		return fmt.Errorf("release %s: %w", k, r.mapErr(err))
	}
	r.waiters.Wake(ident)
	return nil
}

// Get returns the key's record, in flight or committed. ErrNotFound when
// absent or expired.
func (r *Store) Get(ctx context.Context, k cache.Key) (*cache.Record, error) {
	if err := k.Validate(); err != nil {
		return nil, fmt.Errorf("get %s: %w", k, err)
	}
	rec, err := r.get(ctx, r.client, r.recordKey(recordIdent(k)))
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", k, err)
	}
	return rec, nil
}

// GetReplay is Get for a record about to be replayed to a request of
// fingerprint (the lookup of a keyed request that claims nothing: one
// over its client's quota, one while the store is full, a no-store one).
// With WaitReplicas a record committed with that fingerprint is read on
// its primary and held back until replicated (ErrNotReplicated
// otherwise), as Claim's replay is; another is returned as it is read.
func (r *Store) GetReplay(ctx context.Context, k cache.Key, fingerprint string) (*cache.Record, error) {
	if r.waitReplicas <= 0 {
		return r.Get(ctx, k)
	}
	if err := k.Validate(); err != nil {
		return nil, fmt.Errorf("get %s: %w", k, err)
	}
	key := r.recordKey(recordIdent(k))
	node, err := r.primaryFor(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", k, r.mapErr(err))
	}
	conn := node.Conn()
	defer conn.Close()
	rec, err := r.get(ctx, conn, key)
	if err == nil && rec.State == cache.Committed && rec.Fingerprint == fingerprint {
		err = r.replicated(ctx, conn, key)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", k, err)
	}
	return rec, nil
}

func (r *Store) get(ctx context.Context, c redis.Cmdable, key string) (*cache.Record, error) {
	if err := r.begin(ctx); err != nil {
		return nil, err
	}
	data, err := c.HGet(ctx, key, "data").Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, cache.ErrNotFound
	}
	if err != nil {
		return nil, r.mapErr(err)
	}
	rec, err := codec.DecodeRecord(data)
	if err != nil {
		return nil, err
	}
	if rec.State == cache.Committed && !rec.ExpiresAt.IsZero() && !r.now().Before(rec.ExpiresAt) {
		return nil, cache.ErrNotFound
	}
	return rec, nil
}

// Delete forgets the key, whatever its state (admin), and wakes waiters.
// ErrNotFound when absent.
func (r *Store) Delete(ctx context.Context, k cache.Key) error {
	if err := k.Validate(); err != nil {
		return fmt.Errorf("delete %s: %w", k, err)
	}
	ident := recordIdent(k)
	err := r.begin(ctx)
	if err == nil {
		var ok int
		ok, err = deleteScript.Run(ctx, r.client, []string{r.recordKey(ident)}, r.wakeChannel(ident)).Int()
		if err == nil && ok != 1 {
			err = cache.ErrNotFound
		}
	}
	if err != nil {
		return fmt.Errorf("delete %s: %w", k, r.mapErr(err))
	}
	r.waiters.Wake(ident)
	return nil
}

// Wait blocks until the key's in-flight record may have changed: it was
// committed, released or deleted (on any replica), or its lease ran out.
// It returns nil at once if the key is not in flight (or is claimable),
// ctx.Err() when ctx is done, and ErrClosed when the store closes. As with
// Badger, a nil return is a hint: the caller loops Claim → Busy → Wait.
//
// The waiter is registered before the record is read, and the wake pattern
// is subscribed for the store's life, so a change published after the read
// is delivered to it. Messages lost while the pub/sub connection reconnects
// are covered by a re-read every PollInterval, and every resubscription
// wakes all waiters.
func (r *Store) Wait(ctx context.Context, k cache.Key) error {
	if err := k.Validate(); err != nil {
		return fmt.Errorf("wait %s: %w", k, err)
	}
	if err := r.begin(ctx); err != nil {
		return err
	}
	ident := recordIdent(k)
	key := r.recordKey(ident)
	e, ok := r.waiters.Subscribe(ident)
	if !ok {
		return cache.ErrClosed
	}
	defer r.waiters.Unsubscribe(ident, e)

	rec, err := r.get(ctx, r.client, key)
	if errors.Is(err, cache.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("wait %s: %w", k, err)
	}
	now := r.now()
	if rec.State != cache.InFlight || !now.Before(rec.LeaseUntil) {
		return nil
	}
	leaseOut := r.after(rec.LeaseUntil.Sub(now))
	poll := time.NewTicker(r.poll)
	defer poll.Stop()
	for {
		if r.waitBlocked != nil {
			r.waitBlocked()
		}
		select {
		case <-e.Done():
			if r.closed.Load() {
				return cache.ErrClosed
			}
			return nil
		case <-leaseOut:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-poll.C:
			cur, err := r.get(ctx, r.client, key)
			if errors.Is(err, cache.ErrNotFound) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("wait %s: %w", k, err)
			}
			if cur.State != cache.InFlight || cur.Owner != rec.Owner || !r.now().Before(cur.LeaseUntil) {
				return nil
			}
		}
	}
}

// Ping reports whether Redis answers PING within ctx.
func (r *Store) Ping(ctx context.Context) error {
	if err := r.begin(ctx); err != nil {
		return err
	}
	if err := r.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis store: %w", r.mapErr(err))
	}
	return nil
}

// Stats counts the records by a SCAN of the record keys (on every master
// in Cluster mode) and reads their states in pipelined batches. The result
// is cached for 5 seconds (store clock); when Redis fails, or after Close,
// the last result is returned. LSMBytes and VLogBytes are 0.
func (r *Store) Stats() cache.Stats {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	now := r.now()
	if age := now.Sub(r.stats.At); !r.stats.At.IsZero() && age >= 0 && age < statsMaxAge {
		return r.stats
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*redisTimeout)
	defer cancel()
	if r.begin(ctx) != nil {
		return r.stats
	}
	st := cache.Stats{At: now}
	var mu sync.Mutex
	err := r.scan(ctx, globEscape(r.prefix)+redisRecordNS+"*", func(ctx context.Context, c redis.Cmdable, keys []string) error {
		cmds, err := pipelined(ctx, c, keys, func(p redis.Pipeliner, key string) *redis.StringCmd {
			return p.HGet(ctx, key, "state")
		})
		if err != nil {
			return err
		}
		var recs, inFlight int64
		for _, cmd := range cmds {
			state, err := cmd.Result()
			if errors.Is(err, redis.Nil) {
				continue // gone since the scan
			}
			if err != nil {
				return err
			}
			recs++
			if state == "1" {
				inFlight++
			}
		}
		mu.Lock()
		st.Records += recs
		st.InFlight += inFlight
		mu.Unlock()
		return nil
	})
	if err != nil {
		r.log.Warn("redis store stats", slog.Any("err", r.mapErr(err)))
		return r.stats
	}
	r.stats = st
	return st
}

// Close wakes every waiter (their Wait returns ErrClosed), stops the
// pub/sub connection and breaker watchers, and closes the client. Later
// calls return ErrClosed. Close is idempotent.
func (r *Store) Close() error {
	r.closeOnce.Do(func() {
		r.closed.Store(true)
		close(r.done)
		r.waiters.Close()
		_ = r.ps.Close()
		<-r.psDone
		if err := r.client.Close(); err != nil {
			r.closeErr = fmt.Errorf("close redis store: %w", err)
		}
	})
	return r.closeErr
}

// begin fails once ctx is done or the store is closed. Unlike Badger's, it
// holds nothing: go-redis fails calls racing with Close with its ErrClosed,
// which mapErr turns into ours.
func (r *Store) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.closed.Load() {
		return cache.ErrClosed
	}
	return nil
}

func (r *Store) mapErr(err error) error {
	if errors.Is(err, redis.ErrClosed) && r.closed.Load() {
		return cache.ErrClosed
	}
	// Redis at maxmemory (noeviction) refuses writes with an OOM error
	// reply: the store is full, as a Badger store below its floor is, and
	// the gateway answers 503 idempotency_store_full (reads still work).
	if redis.IsOOMError(err) {
		return fmt.Errorf("%w: %w", cache.ErrFull, err)
	}
	return err
}

// scan calls fn with each batch of keys matching match, on every master in
// Cluster mode (concurrently: fn must lock what it shares), with the client
// of the node the keys are on.
func (r *Store) scan(ctx context.Context, match string, fn func(ctx context.Context, c redis.Cmdable, keys []string) error) error {
	one := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, match, redisScanCount).Result()
			if err != nil {
				return err
			}
			if len(keys) > 0 {
				if err := fn(ctx, c, keys); err != nil {
					return err
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	if r.cluster != nil {
		return r.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return one(ctx, c) })
	}
	return one(ctx, r.client)
}

// pipelined runs one command per key in pipelined batches and returns the
// commands in key order. Individual errors (redis.Nil) are left in them.
func pipelined[C redis.Cmder](ctx context.Context, c redis.Cmdable, keys []string, cmd func(redis.Pipeliner, string) C) ([]C, error) {
	out := make([]C, 0, len(keys))
	for chunk := range slices.Chunk(keys, redisBatch) {
		p := c.Pipeline()
		for _, key := range chunk {
			out = append(out, cmd(p, key))
		}
		if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
	}
	return out, nil
}

// encode is the record's stored form: compressed where that pays, unless
// Options.WriteV1Records.
func (r *Store) encode(rec *cache.Record) []byte {
	if r.v1Records {
		return codec.EncodeRecordV1(rec)
	}
	return codec.EncodeRecord(rec)
}
