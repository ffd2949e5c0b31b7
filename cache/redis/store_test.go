package redisstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/internal/codec"
	"github.com/llmgate/llmgate/cache/storetest"
)

// The Redis tests need a real Redis 7. They use LLMGATE_REDIS_ADDR
// (default 127.0.0.1:6379) and skip when nothing answers there, unless
// LLMGATE_REQUIRE_REDIS=1, when they fail instead (CI). Each test uses its
// own random key prefix and deletes its keys at the end.

var (
	ctx    = context.Background()
	chatEP = "/v1/chat/completions"
	key1   = cache.Key{Scope: "acme", Endpoint: chatEP, ID: "key-1"}
)

const (
	lease = 30 * time.Second
	ttl   = 24 * time.Hour
)

var redisProbe = sync.OnceValues(func() (string, error) {
	addr := os.Getenv("LLMGATE_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, MaxRetries: -1, DialerRetries: 1})
	defer c.Close()
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return addr, c.Ping(pctx).Err()
})

// redisAddr returns the address of the test Redis, or skips the test (fails
// it under LLMGATE_REQUIRE_REDIS=1) when it is unreachable.
func redisAddr(tb testing.TB) string {
	tb.Helper()
	addr, err := redisProbe()
	if err != nil {
		if os.Getenv("LLMGATE_REQUIRE_REDIS") == "1" {
			tb.Fatalf("Redis expected at %s (LLMGATE_REQUIRE_REDIS=1) but unreachable: %v", addr, err)
		}
		tb.Skipf("Redis unreachable at %s (%v): start one with `redis-server --port 6379 --save '' --appendonly no`, or set LLMGATE_REDIS_ADDR to one; LLMGATE_REQUIRE_REDIS=1 makes this a failure", addr, err)
	}
	return addr
}

// requireBinary returns the path of a Redis binary under the same rule.
func requireBinary(tb testing.TB, name string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("LLMGATE_REQUIRE_REDIS") == "1" {
			tb.Fatalf("%s expected (LLMGATE_REQUIRE_REDIS=1): %v", name, err)
		}
		tb.Skipf("%s not installed (%v): install Redis 7 to run this test", name, err)
	}
	return path
}

// openTestRedis opens a store on the test Redis (o.URL, if set, instead)
// under a random prefix (o.Prefix, if set, instead). When the test ends it
// checks that every key under the prefix has a TTL, except the breakers
// hash, deletes them and closes the store.
func openTestRedis(tb testing.TB, o Options) *Store {
	tb.Helper()
	if o.URL == "" {
		o.URL = "redis://" + redisAddr(tb)
	}
	if o.Prefix == "" {
		o.Prefix = testPrefix()
	}
	r, err := Open(ctx, o)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() {
		defer r.Close()
		if r.closed.Load() {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err := r.scan(cctx, globEscape(r.prefix)+"*", func(ctx context.Context, c redis.Cmdable, keys []string) error {
			for _, key := range keys {
				if key == r.breakersKey() {
					c.Del(ctx, key)
					continue
				}
				if d, err := c.PTTL(ctx, key).Result(); err == nil && d < 0 && d != -2*time.Nanosecond {
					tb.Errorf("key %q has no TTL (PTTL %v)", key, d)
				}
				c.Del(ctx, key)
			}
			return nil
		})
		if err != nil {
			tb.Logf("cleaning up keys under %q: %v", r.prefix, err)
		}
	})
	return r
}

func testPrefix() string { return "llmgate-test:" + rand.Text()[:10] + ":" }

// observeRedis wires r's Wait hook and real TTLs into the suite's view.
func observeRedis(r *Store) *storetest.Observed {
	o := storetest.NewObserved(r)
	r.waitBlocked = o.SignalBlocked
	o.TTL = func(k cache.Key) time.Duration {
		return r.client.PTTL(ctx, r.recordKey(recordIdent(k))).Val()
	}
	o.Grace = inFlightGrace
	return o
}

func waitResult(t *testing.T, res <-chan error) error {
	t.Helper()
	select {
	case err := <-res:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return within 10s")
		return nil
	}
}

func TestRedisStoreSuite(t *testing.T) {
	redisAddr(t)
	storetest.Run(t, func(t *testing.T, now func() time.Time) storetest.Store {
		// A long poll, so that only a wake-up can end a Wait in time.
		return observeRedis(openTestRedis(t, Options{Now: now, PollInterval: time.Hour}))
	})
}

func TestRedisCrossReplica(t *testing.T) {
	testCrossReplica(t, Options{URL: "redis://" + redisAddr(t)})
}

// testCrossReplica runs two stores on one Redis and prefix, as two gateway
// replicas, with a poll too long to matter: only pub/sub can wake a waiter
// of one replica on the other's commit.
func testCrossReplica(t *testing.T, base Options) {
	base.Prefix = testPrefix()
	base.PollInterval = time.Hour
	a := openTestRedis(t, base)
	b := openTestRedis(t, base)
	bo := observeRedis(b)

	for _, end := range []string{"commit", "release", "delete"} {
		t.Run("woken by "+end+" on the other replica", func(t *testing.T) {
			k := cache.Key{Scope: "acme", Endpoint: chatEP, ID: "cross-" + end}
			c, err := a.Claim(ctx, k, "fp", lease)
			if err != nil || c.Status != cache.Claimed {
				t.Fatalf("Claim on a: %+v, %v", c, err)
			}
			if cb, err := b.Claim(ctx, k, "fp", lease); err != nil || cb.Status != cache.Busy {
				t.Fatalf("Claim on b: %+v, %v; want busy", cb, err)
			}
			res := make(chan error, 1)
			go func() { res <- b.Wait(ctx, k) }()
			waitBlocked(t, bo, res)
			switch end {
			case "commit":
				err = a.Commit(ctx, k, c.Owner, storetest.StreamRecord(), ttl)
			case "release":
				err = a.Release(ctx, k, c.Owner)
			case "delete":
				err = a.Delete(ctx, k)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := waitResult(t, res); err != nil {
				t.Fatalf("Wait on b: %v", err)
			}
			want := map[string]cache.ClaimStatus{"commit": cache.Done, "release": cache.Claimed, "delete": cache.Claimed}[end]
			cb, err := b.Claim(ctx, k, "fp", lease)
			if err != nil || cb.Status != want {
				t.Fatalf("Claim on b after %s: %+v, %v; want %v", end, cb, err, want)
			}
			if want == cache.Done {
				want := storetest.StreamRecord()
				want.State, want.Fingerprint = cache.Committed, "fp"
				want.CreatedAt, want.ExpiresAt = cb.Record.CreatedAt, cb.Record.CreatedAt.Add(ttl)
				storetest.AssertSameRecord(t, cb.Record, want)
			}
		})
	}

	t.Run("one claim across replicas", func(t *testing.T) {
		k := cache.Key{Endpoint: chatEP, ID: "race"}
		var wg sync.WaitGroup
		var mu sync.Mutex
		counts := map[cache.ClaimStatus]int{}
		for i := range 32 {
			s := a
			if i%2 == 1 {
				s = b
			}
			wg.Go(func() {
				c, err := s.Claim(ctx, k, "fp", lease)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				counts[c.Status]++
				mu.Unlock()
			})
		}
		wg.Wait()
		if counts[cache.Claimed] != 1 || counts[cache.Busy] != 31 {
			t.Fatalf("claims = %v, want 1 claimed, 31 busy", counts)
		}
	})

	t.Run("breaker overrides", func(t *testing.T) {
		testBreakerOverrides(t, a, b)
	})
}

type override struct {
	upstream string
	open     bool
}

// watch runs WatchBreakerOverrides on s until the test ends and returns
// what it reports.
func watch(t *testing.T, s *Store) <-chan override {
	wctx, cancel := context.WithCancel(ctx)
	got := make(chan override, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.WatchBreakerOverrides(wctx, func(u string, open bool) { got <- override{u, open} })
	}()
	t.Cleanup(func() { cancel(); <-done })
	return got
}

func expectOverride(t *testing.T, ch <-chan override, want override) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Fatalf("override = %+v, want %+v", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no override %+v within 10s", want)
	}
}

func testBreakerOverrides(t *testing.T, a, b *Store) {
	// Set before the replicas watch, without a message that could reach a
	// watcher after its first read and report the same state twice.
	if err := a.client.HSet(ctx, a.breakersKey(), "before", "open").Err(); err != nil {
		t.Fatal(err)
	}
	onB := watch(t, b)
	expectOverride(t, onB, override{"before", true}) // the initial read
	onA := watch(t, a)
	expectOverride(t, onA, override{"before", true})

	if err := a.SetBreakerOverride(ctx, "openai", true); err != nil {
		t.Fatal(err)
	}
	expectOverride(t, onB, override{"openai", true})
	expectOverride(t, onA, override{"openai", true}) // itself included
	if err := b.SetBreakerOverride(ctx, "before", false); err != nil {
		t.Fatal(err)
	}
	expectOverride(t, onB, override{"before", false})
	expectOverride(t, onA, override{"before", false})
	got, err := b.BreakerOverrides(ctx)
	if err != nil || len(got) != 1 || !got["openai"] {
		t.Fatalf("BreakerOverrides = %v, %v; want openai only", got, err)
	}
	if err := a.SetBreakerOverride(ctx, "", true); err == nil {
		t.Fatal("SetBreakerOverride of an empty name: no error")
	}

	// A change b never hears of (written behind its back), then b's pub/sub
	// connection drops: on resubscribing, b re-reads and converges.
	if err := b.client.HDel(ctx, b.breakersKey(), "openai").Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.client.HSet(ctx, b.breakersKey(), "azure", "open").Err(); err != nil {
		t.Fatal(err)
	}
	killPubSub(t, b)
	expectOverride(t, onB, override{"azure", true})
	expectOverride(t, onB, override{"openai", false})
}

// killPubSub closes, server side, the connections with pattern
// subscriptions: the test stores' pub/sub connections.
func killPubSub(t *testing.T, r *Store) {
	t.Helper()
	kill := func(ctx context.Context, c *redis.Client) error {
		list, err := c.ClientList(ctx).Result()
		if err != nil {
			return err
		}
		for line := range strings.Lines(list) {
			var id string
			psub := false
			for f := range strings.FieldsSeq(line) {
				if v, ok := strings.CutPrefix(f, "id="); ok {
					id = v
				}
				if v, ok := strings.CutPrefix(f, "psub="); ok && v != "0" {
					psub = true
				}
			}
			if psub {
				c.Do(ctx, "CLIENT", "KILL", "ID", id)
			}
		}
		return nil
	}
	var err error
	if r.cluster != nil {
		err = r.cluster.ForEachShard(ctx, kill)
	} else {
		err = kill(ctx, r.client.(*redis.Client))
	}
	if err != nil {
		t.Fatalf("killing pub/sub connections: %v", err)
	}
}

func TestRedisResubscribeWakesWaiters(t *testing.T) {
	r := openTestRedis(t, Options{PollInterval: time.Hour})
	o := observeRedis(r)
	c, err := r.Claim(ctx, key1, "fp", lease)
	if err != nil || c.Status != cache.Claimed {
		t.Fatal(c, err)
	}
	res := make(chan error, 1)
	go func() { res <- r.Wait(ctx, key1) }()
	waitBlocked(t, o, res)
	before := r.subscriptions.Load()
	killPubSub(t, r)
	// Nothing changed, but a message could have been lost: the waiter
	// returns to re-claim.
	if err := waitResult(t, res); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if r.subscriptions.Load() <= before {
		t.Fatal("woken without a resubscription")
	}
}

func TestRedisWaitLeaseTimer(t *testing.T) {
	clock := storetest.NewClock()
	r := openTestRedis(t, Options{Now: clock.Now, After: clock.After, PollInterval: time.Hour})
	if _, err := r.Claim(ctx, key1, "fp", lease); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { res <- r.Wait(ctx, key1) }()
	select {
	case d := <-clock.AfterCalls():
		if d != lease {
			t.Fatalf("lease timer %v, want %v", d, lease)
		}
	case err := <-res:
		t.Fatalf("Wait returned %v instead of arming the lease timer", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait armed no lease timer within 10s")
	}
	clock.Advance(lease)
	if err := waitResult(t, res); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

// TestRedisWaitPoll: a change nobody publishes (the record vanishes behind
// the store's back, as a message lost in a reconnection) is seen by the
// PollInterval re-read.
func TestRedisWaitPoll(t *testing.T) {
	r := openTestRedis(t, Options{PollInterval: 20 * time.Millisecond})
	o := observeRedis(r)
	if _, err := r.Claim(ctx, key1, "fp", lease); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { res <- r.Wait(ctx, key1) }()
	waitBlocked(t, o, res)
	waitBlocked(t, o, res) // one poll re-read found it still in flight
	if err := r.client.Del(ctx, r.recordKey(recordIdent(key1))).Err(); err != nil {
		t.Fatal(err)
	}
	if err := waitResult(t, res); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

// TestRedisRecordBytes: a committed record's data field is the record as
// codec.EncodeRecord writes it, the same bytes the Badger store keeps (its
// TestRecordBytes), and the fields the scripts compare are set.
func TestRedisRecordBytes(t *testing.T) {
	clock := storetest.NewClock()
	r := openTestRedis(t, Options{Now: clock.Now})
	c, err := r.Claim(ctx, key1, "fp", lease)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Commit(ctx, key1, c.Owner, storetest.StreamRecord(), ttl); err != nil {
		t.Fatal(err)
	}
	want := storetest.StreamRecord()
	want.State, want.Fingerprint = cache.Committed, "fp"
	want.CreatedAt, want.ExpiresAt = clock.Now(), clock.Now().Add(ttl)
	got, err := r.client.HGet(ctx, r.recordKey(recordIdent(key1)), "data").Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, codec.EncodeRecord(want)) {
		t.Fatalf("stored bytes differ from the codec's:\n got %q\nwant %q", got, codec.EncodeRecord(want))
	}
	fields, err := r.client.HGetAll(ctx, r.recordKey(recordIdent(key1))).Result()
	if err != nil {
		t.Fatal(err)
	}
	exp := luaTime(clock.Now().Add(ttl))
	if fields["state"] != "2" || fields["fp"] != "fp" || fields["exp"] != exp || fields["lease"] != "" {
		t.Fatalf("record fields = %v", fields)
	}
}

// TestRedisWriteV1Records: a compressible record is stored as version 2,
// unless WriteV1Records, where it is the version 1 bytes a release before
// compression reads; this release reads back both.
func TestRedisWriteV1Records(t *testing.T) {
	stream := storetest.StreamRecord()
	chunk := []byte(`data: {"id":"chatcmpl-9","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}` + "\n\n")
	for range 30 {
		stream.Events = append(stream.Events, chunk)
	}
	for _, tc := range []struct {
		v1      bool
		version byte
	}{{false, 2}, {true, 1}} {
		r := openTestRedis(t, Options{WriteV1Records: tc.v1})
		c, err := r.Claim(ctx, key1, "fp", lease)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Commit(ctx, key1, c.Owner, stream, ttl); err != nil {
			t.Fatal(err)
		}
		got, err := r.client.HGet(ctx, r.recordKey(recordIdent(key1)), "data").Bytes()
		if err != nil {
			t.Fatal(err)
		}
		if got[0] != tc.version {
			t.Fatalf("WriteV1Records %v: stored version %d, want %d", tc.v1, got[0], tc.version)
		}
		rec, err := r.Get(ctx, key1)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Events) != len(stream.Events) || !bytes.Equal(rec.Events[len(rec.Events)-1], chunk) {
			t.Fatalf("WriteV1Records %v: read back %d events", tc.v1, len(rec.Events))
		}
	}
}

func TestRedisKeyLayout(t *testing.T) {
	weird := []cache.Key{
		{Scope: "a:b{c}", Endpoint: "/v1/chat/completions", ID: "id with spaces %41 *?[x]\\ {tag}"},
		{Scope: "", Endpoint: "", ID: "~"},
		{Scope: "ünï\tcode", Endpoint: "/e:p", ID: ":::"},
	}
	r := &Store{prefix: "llmgate:"}
	for _, k := range weird {
		ident := recordIdent(k)
		key := r.recordKey(ident)
		if strings.Count(key, "{") != 1 || strings.Count(key, "}") != 1 || !strings.HasSuffix(key, "{"+ident+"}") {
			t.Fatalf("key %q has not exactly one hash tag {%s}", key, ident)
		}
		if strings.ContainsAny(ident, `*?[]\ `) {
			t.Fatalf("ident %q keeps a glob metacharacter or a space", ident)
		}
		got, ok := parseRecordKey(r.prefix, key)
		if !ok || got != k {
			t.Fatalf("parseRecordKey(%q) = %+v, %v; want %+v", key, got, ok, k)
		}
	}
	if got := r.recordKey(recordIdent(key1)); got != "llmgate:r:{acme:/v1/chat/completions:key-1}" {
		t.Fatalf("recordKey = %q", got)
	}
	if got := r.deadLetterKey("abc"); got != "llmgate:d:{abc}" {
		t.Fatalf("deadLetterKey = %q", got)
	}
	for _, bad := range []string{"llmgate:r:{a:b}", "llmgate:r:{a:b:c", "llmgate:r:{a:b:%zz}", "other:r:{a:b:c}", "llmgate:r:{a:b:%4}"} {
		if k, ok := parseRecordKey(r.prefix, bad); ok {
			t.Fatalf("parseRecordKey(%q) = %+v, want failure", bad, k)
		}
	}

	// On a real Redis, under a prefix with glob characters: each weird key
	// is a record of its own.
	s := openTestRedis(t, Options{Prefix: testPrefix() + "*?[]"})
	for i, k := range weird {
		if _, err := s.Claim(ctx, k, fmt.Sprint("fp", i), lease); err != nil {
			t.Fatalf("Claim %+v: %v", k, err)
		}
	}
	for i, k := range weird {
		if got, err := s.Get(ctx, k); err != nil || got.Fingerprint != fmt.Sprint("fp", i) {
			t.Fatalf("Get(%+v) = %+v, %v; want fingerprint fp%d", k, got, err, i)
		}
	}
}

// parseRecordKey inverts recordKey(recordIdent(k)) under prefix, to show the
// layout is unambiguous: escapePart writes %XX, which url.PathUnescape reads.
func parseRecordKey(prefix, key string) (cache.Key, bool) {
	rest, ok := strings.CutPrefix(key, prefix+redisRecordNS+"{")
	if !ok {
		return cache.Key{}, false
	}
	rest, ok = strings.CutSuffix(rest, "}")
	if !ok {
		return cache.Key{}, false
	}
	parts := strings.Split(rest, ":")
	if len(parts) != 3 {
		return cache.Key{}, false
	}
	var out [3]string
	for i, p := range parts {
		s, err := url.PathUnescape(p)
		if err != nil {
			return cache.Key{}, false
		}
		out[i] = s
	}
	return cache.Key{Scope: out[0], Endpoint: out[1], ID: out[2]}, true
}

func TestRedisOpen(t *testing.T) {
	for name, o := range map[string]Options{
		"no url":         {},
		"bad scheme":     {URL: "http://127.0.0.1:6379"},
		"bad db":         {URL: "redis://127.0.0.1:6379/x"},
		"cluster braces": {URL: "redis://127.0.0.1:6379", Cluster: true, Prefix: "{llmgate}:"},
	} {
		if r, err := Open(ctx, o); err == nil {
			r.Close()
			t.Errorf("%s: Open(%+v) succeeded", name, o)
		}
	}

	// Nothing listens on a port just released: Open succeeds, calls fail fast.
	start := time.Now()
	r, err := Open(ctx, Options{URL: "redis://" + deadAddr(t)})
	if err != nil {
		t.Fatalf("OpenRedis on an unreachable Redis: %v", err)
	}
	defer r.Close()
	if _, err := r.Claim(ctx, key1, "fp", lease); err == nil {
		t.Fatal("Claim on an unreachable Redis: no error")
	}
	if err := r.Ping(ctx); err == nil {
		t.Fatal("Ping on an unreachable Redis: no error")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Open, cache.Claim and Ping took %v on an unreachable Redis", d)
	}
	r.Stats() // does not hang or panic
}

// TestRedisURLOptions: universalOptions carries over everything go-redis's
// URL parsers read, so a URL means to the one redis.NewUniversalClient what
// it meant to redis.NewClient or redis.NewClusterClient, and Cluster alone
// decides which client it is.
func TestRedisURLOptions(t *testing.T) {
	const common = "protocol=2&client_name=gw&max_retries=3&min_retry_backoff=1ms&max_retry_backoff=2ms" +
		"&dial_timeout=3s&read_timeout=4s&write_timeout=5s&pool_fifo=true&pool_size=6&pool_timeout=7s" +
		"&min_idle_conns=1&max_idle_conns=2&max_active_conns=9&max_concurrent_dials=3" +
		"&pipeline_pool_size=4&pipeline_read_buffer_size=1024&pipeline_write_buffer_size=2048" +
		"&conn_max_idle_time=8s&conn_max_lifetime=9s&conn_max_lifetime_jitter=1s"

	single := "rediss://user:pw@db.example:6380/3?" + common + "&skip_verify=true"
	want, err := redis.ParseURL(single)
	if err != nil {
		t.Fatal(err)
	}
	u, err := universalOptions(single, false)
	if err != nil {
		t.Fatal(err)
	}
	got := u.Simple()
	got.Network = want.Network // redis.NewClient infers it from Addr
	if !reflect.DeepEqual(got, want) {
		t.Errorf("plain URL:\n got %+v\nwant %+v", got, want)
	}

	cluster := "rediss://user:pw@n1.example:7000?" + common +
		"&max_redirects=4&read_only=true&route_by_latency=true&route_by_latency_tolerance=1ms" +
		"&route_randomly=true&dialer_retries=2&dialer_retry_timeout=10ms&failing_timeout_seconds=3" +
		"&addr=n2.example:7001&addr=n3.example:7002"
	wantC, err := redis.ParseClusterURL(cluster)
	if err != nil {
		t.Fatal(err)
	}
	if u, err = universalOptions(cluster, true); err != nil {
		t.Fatal(err)
	}
	if gotC := u.Cluster(); !reflect.DeepEqual(gotC, wantC) {
		t.Errorf("cluster URL:\n got %+v\nwant %+v", gotC, wantC)
	}

	for _, cluster := range []bool{false, true} {
		u, err := universalOptions("redis://127.0.0.1:6379", cluster)
		if err != nil {
			t.Fatal(err)
		}
		c := redis.NewUniversalClient(u)
		if _, isCluster := c.(*redis.ClusterClient); isCluster != cluster {
			t.Errorf("Cluster %v with one address: client %T", cluster, c)
		}
		c.Close()
	}
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// redisServer is a redis-server the test starts, kills and restarts.
type redisServer struct {
	t    *testing.T
	bin  string
	port int
	args []string
	cmd  *exec.Cmd
}

func startRedisServer(t *testing.T, port int, args ...string) *redisServer {
	t.Helper()
	s := &redisServer{t: t, bin: requireBinary(t, "redis-server"), port: port, args: args}
	s.start()
	t.Cleanup(s.kill)
	return s
}

func (s *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *redisServer) start() {
	s.t.Helper()
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.t.TempDir()}, s.args...)
	s.cmd = exec.Command(s.bin, args...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	eventually(s.t, 5*time.Second, "redis-server answering on "+s.addr(), func() bool {
		return c.Ping(ctx).Err() == nil
	})
}

func (s *redisServer) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

// eventually polls cond until it holds or d passes: for conditions on an
// external process (a server coming up, a client reconnecting) that send
// no event the test could wait on.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	_, port, _ := net.SplitHostPort(deadAddr(t))
	n, _ := strconv.Atoi(port)
	return n
}

// TestRedisReconnect kills the store's Redis and restarts it on the same
// port: calls fail fast meanwhile, and the same store works again after,
// pub/sub included.
func TestRedisReconnect(t *testing.T) {
	srv := startRedisServer(t, freePort(t))
	url := "redis://" + srv.addr()
	prefix := testPrefix()
	r := openTestRedis(t, Options{URL: url, Prefix: prefix, PollInterval: time.Hour})
	ro := observeRedis(r)
	if c, err := r.Claim(ctx, key1, "fp", lease); err != nil || c.Status != cache.Claimed {
		t.Fatalf("Claim: %+v, %v", c, err)
	}

	srv.kill()
	start := time.Now()
	k2 := cache.Key{Endpoint: chatEP, ID: "while-down"}
	if _, err := r.Claim(ctx, k2, "fp", lease); err == nil {
		t.Fatal("Claim with Redis down: no error")
	} else {
		t.Logf("Claim with Redis down: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Claim with Redis down took %v", d)
	}
	if err := r.Ping(ctx); err == nil {
		t.Fatal("Ping with Redis down: no error")
	}
	if err := r.Wait(ctx, k2); err == nil {
		t.Fatal("Wait with Redis down: no error")
	}
	subs := r.subscriptions.Load()

	srv.start() // empty: no persistence
	eventually(t, 10*time.Second, "Ping after restart", func() bool { return r.Ping(ctx) == nil })
	c, err := r.Claim(ctx, k2, "fp", lease)
	if err != nil || c.Status != cache.Claimed {
		t.Fatalf("Claim after restart: %+v, %v", c, err)
	}
	eventually(t, 15*time.Second, "pub/sub resubscription", func() bool { return r.subscriptions.Load() > subs })

	// Another replica's commit wakes this one's waiter, so pub/sub is back.
	other := openTestRedis(t, Options{URL: url, Prefix: prefix, PollInterval: time.Hour})
	res := make(chan error, 1)
	go func() { res <- r.Wait(ctx, k2) }()
	waitBlocked(t, ro, res)
	if err := other.Commit(ctx, k2, c.Owner, storetest.JSONRecord(), ttl); err != nil {
		t.Fatal(err)
	}
	if err := waitResult(t, res); err != nil {
		t.Fatalf("Wait after restart: %v", err)
	}
}

func TestRedisCloseWakesWaitersAndRefusesCalls(t *testing.T) {
	r := openTestRedis(t, Options{PollInterval: time.Hour})
	o := observeRedis(r)
	c, err := r.Claim(ctx, key1, "fp", lease)
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { res <- r.Wait(ctx, key1) }()
	waitBlocked(t, o, res)
	// Unpublished, so the waiter stays blocked; the store is closed before
	// openTestRedis's cleanup could delete the key.
	if err := r.client.Del(ctx, r.recordKey(recordIdent(key1))).Err(); err != nil {
		t.Fatal(err)
	}
	watched := make(chan struct{})
	go func() {
		r.WatchBreakerOverrides(ctx, func(string, bool) {})
		close(watched)
	}()
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := waitResult(t, res); !errors.Is(err, cache.ErrClosed) {
		t.Fatalf("Wait across Close: %v, want cache.ErrClosed", err)
	}
	select {
	case <-watched:
	case <-time.After(10 * time.Second):
		t.Fatal("WatchBreakerOverrides did not return within 10s of Close")
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, claimErr := r.Claim(ctx, key1, "fp", lease)
	_, getErr := r.Get(ctx, key1)
	_, dlErr := r.ListDeadLetters(ctx, cache.DeadLetterFilter{})
	_, boErr := r.BreakerOverrides(ctx)
	for name, err := range map[string]error{
		"Claim":            claimErr,
		"Get":              getErr,
		"ListDeadLetters":  dlErr,
		"BreakerOverrides": boErr,
		"Renew":            r.Renew(ctx, key1, c.Owner, lease),
		"Commit":           r.Commit(ctx, key1, c.Owner, storetest.JSONRecord(), ttl),
		"Release":          r.Release(ctx, key1, c.Owner),
		"Delete":           r.Delete(ctx, key1),
		"Wait":             r.Wait(ctx, key1),
		"Ping":             r.Ping(ctx),
		"SetBreaker":       r.SetBreakerOverride(ctx, "x", true),
	} {
		if !errors.Is(err, cache.ErrClosed) {
			t.Errorf("%s after Close: %v, want cache.ErrClosed", name, err)
		}
	}
	_ = r.Stats()
	r.WatchBreakerOverrides(ctx, func(string, bool) { t.Error("watcher called after Close") })
}

func TestRedisStats(t *testing.T) {
	clock := storetest.NewClock()
	r := openTestRedis(t, Options{Now: clock.Now})
	for i := range 5 {
		k := cache.Key{Scope: "acme", Endpoint: chatEP, ID: fmt.Sprintf("k%d", i)}
		c, err := r.Claim(ctx, k, "fp", lease)
		if err != nil {
			t.Fatal(err)
		}
		if i < 3 {
			if err := r.Commit(ctx, k, c.Owner, storetest.JSONRecord(), ttl); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Dead letters are not records.
	if err := r.PutDeadLetter(ctx, key1, &cache.DeadLetter{Class: "transient"}, ttl); err != nil {
		t.Fatal(err)
	}
	st := r.Stats()
	if st.Records != 5 || st.InFlight != 2 || !st.At.Equal(clock.Now()) || st.LSMBytes != 0 || st.VLogBytes != 0 {
		t.Fatalf("Stats = %+v, want 5 records, 2 in flight", st)
	}
	if _, err := r.Claim(ctx, cache.Key{Endpoint: chatEP, ID: "more"}, "fp", lease); err != nil {
		t.Fatal(err)
	}
	if r.Stats().Records != 5 {
		t.Fatal("Stats not cached")
	}
	clock.Advance(statsMaxAge)
	if got := r.Stats(); got.Records != 6 || got.InFlight != 3 {
		t.Fatalf("Stats after cache expiry: %+v, want 6 records, 3 in flight", got)
	}
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func BenchmarkRedisClaimCommit(b *testing.B) {
	r := openTestRedis(b, Options{})
	rec := storetest.JSONRecord()
	rec.Body = bytes.Repeat([]byte("x"), 1024)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := cache.Key{Endpoint: chatEP, ID: fmt.Sprintf("bench-%d", i)}
		i++
		c, err := r.Claim(ctx, k, "fp", lease)
		if err != nil || c.Status != cache.Claimed {
			b.Fatal(c.Status, err)
		}
		if err := r.Commit(ctx, k, c.Owner, rec, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRedisGet(b *testing.B) {
	r := openTestRedis(b, Options{})
	rec := storetest.JSONRecord()
	rec.Body = bytes.Repeat([]byte("x"), 1024)
	c, err := r.Claim(ctx, key1, "fp", lease)
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Commit(ctx, key1, c.Owner, rec, ttl); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Get(ctx, key1); err != nil {
			b.Fatal(err)
		}
	}
}

// waitBlocked waits until a Wait call on o blocks. res is that call's
// result, so that a Wait that returns instead fails the test rather than
// leaving it waiting for a signal that never comes.
func waitBlocked(t *testing.T, o *storetest.Observed, res <-chan error) {
	t.Helper()
	select {
	case <-o.Blocked:
	case err := <-res:
		t.Fatalf("Wait returned %v instead of blocking", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not block within 10s")
	}
}

// TestRedisOOMIsFull: a Redis at maxmemory (noeviction) refuses writes
// with an OOM reply; the store reports it as cache.ErrFull, which the
// gateway answers with 503 idempotency_store_full, as a full Badger disk.
// Committed records still read.
func TestRedisOOMIsFull(t *testing.T) {
	srv := startRedisServer(t, freePort(t))
	r := openTestRedis(t, Options{URL: "redis://" + srv.addr(), PollInterval: time.Hour})
	c, err := r.Claim(ctx, key1, "fp", lease)
	if err != nil || c.Status != cache.Claimed {
		t.Fatalf("Claim: %+v, %v", c, err)
	}
	if err := r.Commit(ctx, key1, c.Owner, storetest.JSONRecord(), ttl); err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(&redis.Options{Addr: srv.addr()})
	defer admin.Close()
	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.ConfigSet(ctx, "maxmemory", "0")
	key2 := cache.Key{Scope: key1.Scope, Endpoint: key1.Endpoint, ID: "oom"}
	_, err = r.Claim(ctx, key2, "fp", lease)
	if !errors.Is(err, cache.ErrFull) {
		t.Fatalf("Claim at maxmemory: %v, want cache.ErrFull", err)
	}
	var f interface{ StoreFull() bool }
	if !errors.As(err, &f) || !f.StoreFull() {
		t.Fatalf("the OOM error does not report StoreFull: %v", err)
	}
	if _, err := r.Get(ctx, key1); err != nil {
		t.Fatalf("Get at maxmemory: %v", err)
	}
}
