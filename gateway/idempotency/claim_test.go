package idempotency_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
	badger "github.com/llmgate/llmgate/cache/badger"
	redis "github.com/llmgate/llmgate/cache/redis"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/idempotency"
	"github.com/llmgate/llmgate/gateway/metrics"
)

// A client that leaves at any step of a claim leaves no claimed record
// behind: its retry with the same key claims it at once and runs, instead
// of waiting on an in-flight record nobody renews or releases. The stores'
// clocks are frozen, so no lease can run out during the test: the retry
// claims only if the first claim was given back.

// waitTimeout bounds the retry's wait for an in-flight duplicate: a retry
// that has to wait at all fails the test (409 after this long).
const waitTimeout = 2 * time.Second

var frozen = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func frozenNow() time.Time { return frozen }

// neverAfter is a store timer on the frozen clock: it never fires.
func neverAfter(time.Duration) <-chan time.Time { return nil }

func testRedisAddr(t *testing.T) string {
	t.Helper()
	addr := os.Getenv("LLMGATE_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr, DialTimeout: time.Second, MaxRetries: -1})
	defer c.Close()
	pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		if os.Getenv("LLMGATE_REQUIRE_REDIS") == "1" {
			t.Fatalf("Redis expected at %s (LLMGATE_REQUIRE_REDIS=1) but unreachable: %v", addr, err)
		}
		t.Skipf("Redis unreachable at %s (%v); LLMGATE_REQUIRE_REDIS=1 makes this a failure", addr, err)
	}
	return addr
}

// testRedis opens a Redis store under a unique prefix whose connections
// carry a unique client name (so a test can find them in CLIENT LIST), and
// deletes its keys when the test ends. It returns the store, the name and
// an admin client on the same Redis.
func testRedis(t *testing.T) (*redis.Store, string, *goredis.Client) {
	t.Helper()
	addr := testRedisAddr(t)
	tag := rand.Text()[:10]
	name, prefix := "llmgate-claim-test-"+tag, "llmgate-test:"+tag+":"
	s, err := redis.Open(context.Background(), redis.Options{URL: "redis://" + addr + "?client_name=" + name,
		Prefix: prefix, Now: frozenNow, After: neverAfter})
	if err != nil {
		t.Fatalf("redis.Open: %v", err)
	}
	admin := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() {
		ctx := context.Background()
		admin.ClientUnpause(ctx)
		s.Close()
		iter := admin.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			admin.Del(ctx, iter.Val())
		}
		admin.Close()
	})
	return s, name, admin
}

func testBadger(t *testing.T) *badger.Store {
	t.Helper()
	s, err := badger.Open(badger.Options{Dir: t.TempDir(), Now: frozenNow})
	if err != nil {
		t.Fatalf("badger.Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// hookStore runs hooks around the store's claim: before it (the client
// leaves as the call starts) or after it took effect (the client leaves
// while it runs). With ctxAware, a claim whose context ended while it ran
// reports the context's error although the claim took effect, as a driver
// that gives up on a call at its context's end does (go-redis at a
// context deadline: the script has reached Redis, its reply is dropped).
type hookStore struct {
	idempotency.Store
	before, after func()
	ctxAware      bool
	// onWait runs as a wait for an in-flight duplicate starts.
	onWait func()
}

func (h *hookStore) Wait(ctx context.Context, k cache.Key) error {
	if h.onWait != nil {
		h.onWait()
	}
	return h.Store.Wait(ctx, k)
}

func (h *hookStore) Claim(ctx context.Context, k cache.Key, fp string, lease time.Duration) (cache.Claim, error) {
	if h.before != nil {
		h.before()
		h.before = nil
	}
	c, err := h.Store.Claim(ctx, k, fp, lease)
	if h.after != nil {
		h.after()
		h.after = nil
	}
	if h.ctxAware && err == nil && ctx.Err() != nil {
		return cache.Claim{}, ctx.Err()
	}
	return c, err
}

func newKeeper(s idempotency.Store) *idempotency.Keeper {
	return idempotency.New(idempotency.Options{Store: s, Metrics: metrics.New(prometheus.NewRegistry(), nil),
		Lease: 30 * time.Second, WaitTimeout: waitTimeout, OpTimeout: 5 * time.Second})
}

func keyedRequest(id string) *idempotency.Request {
	return &idempotency.Request{Key: cache.Key{Scope: "acme", Endpoint: "/v1/chat/completions", ID: id},
		Raw: id, Fingerprint: "fp-1", TTL: time.Hour}
}

// claimAs runs one Claim for a client whose context is ctx.
func claimAs(ctx context.Context, k *idempotency.Keeper, kr *idempotency.Request) (*idempotency.Lease, error) {
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions", nil)
	lease, _, err := k.Claim(httptest.NewRecorder(), r, kr, time.Time{})
	return lease, err
}

// checkGoneThenRetry checks what the departed client got (no lease: it
// left, so nothing may go upstream for it) and that its retry with the
// same key claims at once.
func checkGoneThenRetry(t *testing.T, k *idempotency.Keeper, kr *idempotency.Request, lease *idempotency.Lease, err error) {
	t.Helper()
	if lease != nil {
		t.Errorf("departed client: got a lease (the call would run for nobody), want ClientGone")
		lease.Release(context.Background())
	} else if !errors.Is(err, apierror.ClientGone) {
		t.Errorf("departed client: err = %v, want ClientGone", err)
	}
	start := time.Now()
	retry, err := claimAs(context.Background(), k, kr)
	took := time.Since(start)
	if err != nil || retry == nil {
		t.Fatalf("retry with the same key: lease %v, err %v after %v; want a prompt claim (the first claim was orphaned)", retry, err, took)
	}
	t.Logf("retry claimed in %v", took)
	// The retry's run ends as any other: committed, then replayed.
	if err := retry.Commit(context.Background(), &cache.Record{Status: 200, Body: []byte(`{"ok":true}`), Upstream: "primary"}); err != nil {
		t.Fatalf("retry's commit: %v", err)
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	w := httptest.NewRecorder()
	again, ev, err := k.Claim(w, r, kr, time.Time{})
	if again != nil || err != nil || !ev.Replayed || w.Body.String() != `{"ok":true}` {
		t.Fatalf("after the retry's commit: lease %v, event %+v, err %v, body %q; want the replay", again, ev, err, w.Body)
	}
}

func TestClaimLeavesNoOrphanWhenClientLeaves(t *testing.T) {
	backends := map[string]func(t *testing.T) idempotency.Store{
		"redis":  func(t *testing.T) idempotency.Store { s, _, _ := testRedis(t); return s },
		"badger": func(t *testing.T) idempotency.Store { return testBadger(t) },
	}
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			t.Run("gone before the claim", func(t *testing.T) {
				k, kr := newKeeper(open(t)), keyedRequest("gone-before")
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				lease, err := claimAs(ctx, k, kr)
				checkGoneThenRetry(t, k, kr, lease, err)
			})
			t.Run("leaves as the store call starts", func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				s := &hookStore{Store: open(t), before: cancel}
				k, kr := newKeeper(s), keyedRequest("leaves-at-start")
				lease, err := claimAs(ctx, k, kr)
				checkGoneThenRetry(t, k, kr, lease, err)
			})
			t.Run("leaves once the store has claimed", func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				s := &hookStore{Store: open(t), after: cancel}
				k, kr := newKeeper(s), keyedRequest("leaves-after-claim")
				lease, err := claimAs(ctx, k, kr)
				checkGoneThenRetry(t, k, kr, lease, err)
			})
			t.Run("leaves while the store claims; the store reports it", func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				s := &hookStore{Store: open(t), after: cancel, ctxAware: true}
				k, kr := newKeeper(s), keyedRequest("leaves-reply-lost")
				lease, err := claimAs(ctx, k, kr)
				checkGoneThenRetry(t, k, kr, lease, err)
			})
			t.Run("leaves while waiting for an in-flight duplicate", func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				s := &hookStore{Store: open(t), onWait: cancel}
				k, kr := newKeeper(s), keyedRequest("leaves-while-waiting")
				first, err := claimAs(context.Background(), k, kr)
				if err != nil || first == nil {
					t.Fatalf("first claim: %v", err)
				}
				lease, err := claimAs(ctx, k, kr)
				first.Release(context.Background())
				checkGoneThenRetry(t, k, kr, lease, err)
			})
		})
	}
}

// The client leaves while the claim script waits in Redis: writes are
// paused (CLIENT PAUSE WRITE) until the store's connection is seen blocked
// on the script and the client has gone, then resumed.
func TestClaimLeavesNoOrphanWhenClientLeavesDuringRedisScript(t *testing.T) {
	s, name, admin := testRedis(t)
	k := newKeeper(s)
	// Load the claim script first, so the paused call is the script itself
	// (not a NOSCRIPT round trip followed by a second call).
	warm, err := claimAs(context.Background(), k, keyedRequest("warm-up"))
	if err != nil || warm == nil {
		t.Fatalf("warm-up claim: %v", err)
	}
	warm.Release(context.Background())

	bg := context.Background()
	// The pause is a safety cap: the test resumes writes as soon as the
	// client has left.
	if err := admin.Do(bg, "CLIENT", "PAUSE", 2000, "WRITE").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	kr := keyedRequest("leaves-during-script")
	ctx, cancel := context.WithCancel(bg)
	type result struct {
		lease *idempotency.Lease
		err   error
	}
	done := make(chan result, 1)
	go func() {
		lease, err := claimAs(ctx, k, kr)
		done <- result{lease, err}
	}()
	if !waitBlockedScript(t, admin, name) {
		admin.ClientUnpause(bg)
		t.Fatal("the claim script never showed up blocked in CLIENT LIST")
	}
	cancel()
	if err := admin.ClientUnpause(bg).Err(); err != nil {
		t.Fatalf("CLIENT UNPAUSE: %v", err)
	}
	res := <-done
	checkGoneThenRetry(t, k, kr, res.lease, res.err)
}

// waitBlockedScript polls CLIENT LIST until a connection named name is
// blocked (flags b) on an EVALSHA or EVAL, for at most the pause's cap.
func waitBlockedScript(t *testing.T, admin *goredis.Client, name string) bool {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(1500 * time.Millisecond)
	for {
		list, err := admin.ClientList(context.Background()).Result()
		if err != nil {
			t.Fatalf("CLIENT LIST: %v", err)
		}
		for _, line := range strings.Split(list, "\n") {
			f := " " + line + " "
			if strings.Contains(f, " name="+name+" ") && strings.Contains(f, " flags=b ") &&
				(strings.Contains(f, " cmd=evalsha ") || strings.Contains(f, " cmd=eval ")) {
				return true
			}
		}
		select {
		case <-tick.C:
		case <-limit:
			return false
		}
	}
}

// deadlineStore records whether the contexts of its claims carry a deadline.
type deadlineStore struct {
	idempotency.Store
	deadlines []bool
}

func (d *deadlineStore) Claim(ctx context.Context, k cache.Key, fp string, lease time.Duration) (cache.Claim, error) {
	_, has := ctx.Deadline()
	d.deadlines = append(d.deadlines, has)
	return d.Store.Claim(ctx, k, fp, lease)
}

// inProcess is deadlineStore that says its operations run in process, as
// Badger's store does.
type inProcess struct{ *deadlineStore }

func (inProcess) InProcess() bool { return true }

// A store operation gets the op timeout's deadline only from a store that
// can be bounded by it: an in-process store (Badger's, which says so)
// cannot be interrupted, and a timer per operation would cost every keyed
// request for nothing. Any other store (Redis, a wrapper) gets it.
func TestOpTimeoutOnlyWhereItCanBound(t *testing.T) {
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.InProcess() {
		t.Fatal("Badger's store does not say it runs in process")
	}
	for _, c := range []struct {
		name     string
		store    func(*deadlineStore) idempotency.Store
		deadline bool
	}{
		{"in process", func(d *deadlineStore) idempotency.Store { return inProcess{d} }, false},
		{"other", func(d *deadlineStore) idempotency.Store { return d }, true},
	} {
		d := &deadlineStore{Store: st}
		lease, err := claimAs(context.Background(), newKeeper(c.store(d)), keyedRequest("op-timeout-"+c.name))
		if err != nil || lease == nil {
			t.Fatalf("%s: claim: lease %v, err %v", c.name, lease, err)
		}
		lease.Release(context.Background())
		if len(d.deadlines) != 1 || d.deadlines[0] != c.deadline {
			t.Errorf("%s store: claim contexts with a deadline: %v, want [%v]", c.name, d.deadlines, c.deadline)
		}
	}
}
