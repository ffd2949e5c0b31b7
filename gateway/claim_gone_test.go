package gateway

import (
	"context"
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
	redisstore "github.com/llmgate/llmgate/cache/redis"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// claimGate holds the next claim, once the store has made it, until the
// test lets it return: the client leaves while the claim runs. With
// ctxAware, the claim then reports its context's end, as a driver that
// drops the reply at its context's end does, although the store claimed.
type claimGate struct {
	Store
	armed    atomic.Bool
	ctxAware bool
	claimed  chan struct{}
	proceed  chan struct{}
}

func (g *claimGate) Claim(ctx context.Context, k cache.Key, fp string, lease time.Duration) (cache.Claim, error) {
	if !g.armed.CompareAndSwap(true, false) {
		return g.Store.Claim(ctx, k, fp, lease)
	}
	c, err := g.Store.Claim(ctx, k, fp, lease)
	g.claimed <- struct{}{}
	<-g.proceed
	if g.ctxAware && err == nil && ctx.Err() != nil {
		return cache.Claim{}, ctx.Err()
	}
	return c, err
}

// gatewayRedis opens a Redis store under a unique prefix, on a frozen
// clock (no lease runs out during the test), deleting its keys at the end.
func gatewayRedis(t *testing.T) *redisstore.Store {
	t.Helper()
	addr := os.Getenv("LLMGATE_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	prefix := "llmgate-test:" + rand.Text()[:10] + ":"
	frozen := time.Now()
	s, err := redisstore.Open(context.Background(), redisstore.Options{URL: "redis://" + addr, Prefix: prefix,
		Now: func() time.Time { return frozen }, After: func(time.Duration) <-chan time.Time { return nil }})
	if err != nil {
		if os.Getenv("LLMGATE_REQUIRE_REDIS") == "1" {
			t.Fatalf("Redis expected at %s (LLMGATE_REQUIRE_REDIS=1): %v", addr, err)
		}
		t.Skipf("Redis unreachable at %s: %v", addr, err)
	}
	t.Cleanup(func() {
		s.Close()
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		defer c.Close()
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	return s
}

// A client that leaves while its keyed request's claim runs gets nothing
// sent upstream for it, and leaves the key free: its retry with the same
// key runs at once (one upstream call in all, a fresh 200), never a wait
// for an in-flight record nobody renews or releases.
func TestClientGoneDuringClaimLeavesKeyFree(t *testing.T) {
	for _, backend := range []string{"badger", "redis"} {
		for _, ctxAware := range []bool{false, true} {
			name := backend + "/claim answers"
			if ctxAware {
				name = backend + "/claim reports the client's departure"
			}
			t.Run(name, func(t *testing.T) { clientGoneDuringClaim(t, backend, ctxAware) })
		}
	}
}

func clientGoneDuringClaim(t *testing.T, backend string, ctxAware bool) {
	gate := &claimGate{ctxAware: ctxAware, claimed: make(chan struct{}), proceed: make(chan struct{})}
	h := newHarnessStore(t, func(c *config.Config) { c.Idempotency.WaitTimeout = config.Duration(2 * time.Second) },
		func(s Store) Store {
			if backend == "redis" {
				s = gatewayRedis(t)
			}
			gate.Store = s
			return gate
		}, fakeprovider.Options{})
	// The gateway behind a handler that hands the test each request's
	// context and says when the handler has returned.
	reqCtx, served := make(chan context.Context, 1), make(chan struct{}, 1)
	handler := h.gw.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqCtx <- r.Context()
		handler.ServeHTTP(w, r)
		served <- struct{}{}
	}))
	defer srv.Close()
	send := func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "leaves-during-claim")
		return testClient.Do(req)
	}

	gate.armed.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		res, err := send(ctx)
		if err == nil {
			res.Body.Close()
		}
		left <- err
	}()
	server := <-reqCtx
	<-gate.claimed
	cancel()
	<-server.Done() // the gateway has seen the client leave
	close(gate.proceed)
	<-served
	if err := <-left; err == nil {
		t.Fatal("the departing client got an answer")
	}
	if n := h.fake.Calls(""); n != 0 {
		t.Fatalf("upstream called %d time(s) for a client that left during the claim, want 0", n)
	}

	start := time.Now()
	res, err := send(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	<-reqCtx
	<-served
	body := readAllBody(t, res)
	took := time.Since(start)
	if res.StatusCode != http.StatusOK || res.Header.Get("Idempotent-Replayed") == "true" {
		t.Fatalf("retry: %d (replayed %q) %s after %v; want a fresh 200", res.StatusCode, res.Header.Get("Idempotent-Replayed"), body, took)
	}
	if n := h.fake.Calls(""); n != 1 {
		t.Fatalf("upstream called %d time(s), want 1 (the retry's)", n)
	}
	t.Logf("retry answered 200 in %v", took)
}
