package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	badgerstore "github.com/llmgate/llmgate/cache/badger"
	"github.com/llmgate/llmgate/cache/storetest"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

// Per-client limits (issue 13, item 9): one tenant cannot take what all
// share. Each test failed on the code before the limits.

// tenants configures two clients, alice and bob, under the default limits
// def, and returns their headers.
func tenants(def config.ClientLimits) (func(c *config.Config), map[string]string, map[string]string) {
	return func(c *config.Config) {
			c.Clients = []config.Client{{Name: "alice", Key: "key-alice"}, {Name: "bob", Key: "key-bob"}}
			c.ClientLimits = def
		}, map[string]string{"Authorization": "Bearer key-alice"},
		map[string]string{"Authorization": "Bearer key-bob"}
}

func with(hdr map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(hdr)+len(kv)/2)
	for k, v := range hdr {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// newLimitsHarness is newHarness with the limits on a fake clock, which
// the test moves.
func newLimitsHarness(t *testing.T, mutate func(c *config.Config)) (*harness, *storetest.Clock) {
	t.Helper()
	h := newHarness(t, mutate)
	clock := storetest.NewClock()
	serve(t, h, h.store, clock)
	return h, clock
}

// serve replaces h's gateway with one on store whose limits run on clock.
// The old gateway's server stops; newHarness's cleanup closes the gateway.
func serve(t *testing.T, h *harness, store *badgerstore.Store, clock *storetest.Clock) {
	t.Helper()
	serveOn(t, h, store, store, clock)
}

// serveOn is serve with the gateway given st, a wrapper of store.
func serveOn(t *testing.T, h *harness, store *badgerstore.Store, st Store, clock *storetest.Clock) {
	t.Helper()
	h.srv.Close()
	gw, err := New(Options{Config: h.cfg, Store: st, LimitsNow: clock.Now,
		Logger: slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	h.store, h.gw, h.srv = store, gw, httptest.NewServer(gw.Handler())
	t.Cleanup(h.srv.Close)
}

// wantLimited checks a 429 with the code, a Retry-After, and that the
// upstream saw no call since calls.
func wantLimited(t *testing.T, h *harness, r result, code, retryAfter string, calls int) {
	t.Helper()
	e := wantOpenAIError(t, r, http.StatusTooManyRequests)
	if e["code"] != code {
		t.Fatalf("code = %v, want %s: %s", e["code"], code, r.body)
	}
	if got := r.header.Get("Retry-After"); got == "" || (retryAfter != "" && got != retryAfter) {
		t.Fatalf("Retry-After = %q, want %q", got, retryAfter)
	}
	if n := h.fake.Calls(""); n != calls {
		t.Fatalf("a limited request reached the upstream: %d calls, want %d", n, calls)
	}
}

// The rate: a token bucket per client; replays of committed keys count
// too; another client is unaffected.
func TestClientRateLimit(t *testing.T) {
	mutate, alice, bob := tenants(config.ClientLimits{RequestsPerSecond: 0.01, Burst: 2})
	h, clock := newLimitsHarness(t, mutate)
	if r := h.chat(chatBody, with(alice, "Idempotency-Key", "k1")); r.status != 200 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	if r := h.chat(chatBody, with(alice, "Idempotency-Key", "k1")); r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	// The burst of 2 is spent: the next request waits 1/0.01 s for a token,
	// a replay too.
	calls := h.fake.Calls("")
	wantLimited(t, h, h.chat(chatBody, with(alice, "Idempotency-Key", "k1")), "client_rate_limited", "100", calls)
	wantLimited(t, h, h.chat(chatBody, alice), "client_rate_limited", "100", calls)
	if r := h.chat(chatBody, bob); r.status != 200 {
		t.Fatalf("bob is limited by alice's rate: %d %s", r.status, r.body)
	}
	clock.Advance(99 * time.Second)
	wantLimited(t, h, h.chat(chatBody, alice), "client_rate_limited", "1", calls+1)
	clock.Advance(time.Second)
	if r := h.chat(chatBody, alice); r.status != 200 {
		t.Fatalf("after Retry-After: %d %s", r.status, r.body)
	}
}

// Concurrency: N requests in flight hold the client's N slots; the N+1th
// gets 429 without reaching the upstream; another client is unaffected.
func TestClientConcurrencyLimit(t *testing.T) {
	const n = 2
	mutate, alice, bob := tenants(config.ClientLimits{MaxConcurrent: n})
	h := newHarness(t, mutate)
	h.fake.Enqueue(fakeprovider.Step{Hang: true}, fakeprovider.Step{Hang: true})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if res, err := h.send(ctx, http.MethodPost, "/v1/chat/completions", chatBody, alice); err == nil {
				res.Body.Close()
			}
		})
	}
	defer func() { cancel(); wg.Wait() }()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := h.fake.WaitForCalls(wctx, n); err != nil {
		t.Fatal(err)
	}
	wantLimited(t, h, h.chat(chatBody, alice), "client_concurrency_limited", "1", n)
	if r := h.chat(chatBody, bob); r.status != 200 {
		t.Fatalf("bob is limited by alice's requests in flight: %d %s", r.status, r.body)
	}
}

// A keyed call whose client stopped waiting runs on until it commits, and
// holds its client's slot until then.
func TestDetachedCallHoldsItsSlot(t *testing.T) {
	mutate, alice, _ := tenants(config.ClientLimits{MaxConcurrent: 1})
	h := newHarness(t, mutate)
	h.fake.Enqueue(fakeprovider.Step{Delay: time.Second})
	r := h.chat(chatBody, with(alice, "Idempotency-Key", "slow", DeadlineHeader, "50ms"))
	if r.status != http.StatusGatewayTimeout {
		t.Fatalf("at the client's deadline: %d %s", r.status, r.body)
	}
	wantLimited(t, h, h.chat(chatBody, alice), "client_concurrency_limited", "1", 1)
	h.gw.requests.WaitCalls() // the detached call ends (and commits)
	if r := h.chat(chatBody, with(alice, "Idempotency-Key", "slow")); r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after the detached call ended: %d %s", r.status, r.body)
	}
}

// storageHarness commits alice's keyed requests until her stored bytes
// pass max, and returns how many were committed.
func fillStorage(t *testing.T, h *harness, alice map[string]string) int {
	t.Helper()
	for i := range 20 {
		calls := h.fake.Calls("")
		r := h.chat(chatBody, with(alice, "Idempotency-Key", "fill-"+string(rune('a'+i))))
		switch r.status {
		case 200:
			continue
		case http.StatusTooManyRequests:
			if i == 0 {
				t.Fatalf("the first commit was refused: %s", r.body)
			}
			wantLimited(t, h, r, "client_storage_quota_exceeded", "", calls)
			return i
		default:
			t.Fatalf("commit %d: %d %s", i, r.status, r.body)
		}
	}
	t.Fatal("20 commits, none refused: stored bytes are not limited")
	return 0
}

// Storage: over max_stored_bytes a new keyed request gets 429 before its
// claim (no upstream call, nothing served uncommitted); replays of
// committed keys, unkeyed requests and other clients go on.
func TestClientStorageQuota(t *testing.T) {
	mutate, alice, bob := tenants(config.ClientLimits{MaxStoredBytes: 2000})
	h, clock := newLimitsHarness(t, mutate)
	n := fillStorage(t, h, alice)
	calls := h.fake.Calls("")
	for i := range n {
		r := h.chat(chatBody, with(alice, "Idempotency-Key", "fill-"+string(rune('a'+i))))
		if r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay of committed key %d over the quota: %d %s", i, r.status, r.body)
		}
	}
	if h.fake.Calls("") != calls {
		t.Fatal("replays reached the upstream")
	}
	if r := h.chat(chatBody, alice); r.status != 200 {
		t.Fatalf("unkeyed request over the storage quota: %d %s", r.status, r.body)
	}
	if r := h.chat(chatBody, with(bob, "Idempotency-Key", "fill-a")); r.status != 200 {
		t.Fatalf("bob is limited by alice's storage: %d %s", r.status, r.body)
	}
	// Committed at 12:00 for idempotency.ttl (24h): counted until the hour
	// they expire in is over, 25h from now.
	calls = h.fake.Calls("")
	wantLimited(t, h, h.chat(chatBody, with(alice, "Idempotency-Key", "new")), "client_storage_quota_exceeded", "90000", calls)
	clock.Advance(25*time.Hour - time.Second)
	wantLimited(t, h, h.chat(chatBody, with(alice, "Idempotency-Key", "new")), "client_storage_quota_exceeded", "1", calls)
	clock.Advance(time.Second)
	if r := h.chat(chatBody, with(alice, "Idempotency-Key", "new")); r.status != 200 {
		t.Fatalf("once the hour the records expire in is over: %d %s", r.status, r.body)
	}
}

// restart closes h's store and serves a new gateway, built from the same
// config, on the store reopened from its directory.
func restart(t *testing.T, h *harness, clock *storetest.Clock) {
	t.Helper()
	restartWith(t, h, clock, nil)
}

// restartWith is restart with the new gateway's store wrapped by wrap.
func restartWith(t *testing.T, h *harness, clock *storetest.Clock, wrap func(Store) Store) {
	t.Helper()
	h.srv.Close()
	if err := h.store.Close(); err != nil {
		t.Fatal(err)
	}
	store, err := badgerstore.Open(badgerstore.Options{Dir: h.cfg.DataDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	var st Store = store
	if wrap != nil {
		st = wrap(store)
	}
	serveOn(t, h, store, st, clock)
}

// The stored bytes are counted again at start from the store: a restart
// does not hand a tenant a fresh quota.
func TestClientStorageRebuiltAtStart(t *testing.T) {
	mutate, alice, _ := tenants(config.ClientLimits{MaxStoredBytes: 2000})
	h, clock := newLimitsHarness(t, mutate)
	fillStorage(t, h, alice)
	used := h.gw.limits.StoredBytes("alice")
	restart(t, h, clock)
	if got := h.gw.limits.StoredBytes("alice"); got != used {
		t.Fatalf("stored bytes after the restart: %d, before: %d", got, used)
	}
	calls := h.fake.Calls("")
	wantLimited(t, h, h.chat(chatBody, with(alice, "Idempotency-Key", "after-restart")), "client_storage_quota_exceeded", "", calls)
	if r := h.chat(chatBody, with(alice, "Idempotency-Key", "fill-a")); r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay after restart: %d %s", r.status, r.body)
	}
}

// scanFails is a store that cannot count stored bytes.
type scanFails struct{ Store }

func (scanFails) ScanCommitted(context.Context, string, func(cache.CommittedRecord) error) error {
	return errors.New("store unreachable")
}

// The store cannot be counted at start: the storage limit fails open —
// it admits what this process's own commits leave room for — and says so
// in a log line and a metric (a failed count per client: alice and bob).
func TestClientStorageFailsOpen(t *testing.T) {
	mutate, alice, _ := tenants(config.ClientLimits{MaxStoredBytes: 2000})
	h, clock := newLimitsHarness(t, mutate)
	fillStorage(t, h, alice)
	restartWith(t, h, clock, func(s Store) Store { return scanFails{s} })
	if r := h.chat(chatBody, with(alice, "Idempotency-Key", "unknown-usage")); r.status != 200 {
		t.Fatalf("with the usage unknown: %d %s", r.status, r.body)
	}
	if !strings.Contains(h.logs.String(), "counting clients' stored bytes failed") {
		t.Fatal("no log line for the failed count")
	}
	m := h.admin(http.MethodGet, "/metrics")
	if !strings.Contains(string(m.body), `llmgate_client_limit_fail_open_total{limit="storage"} 1`) ||
		!strings.Contains(string(m.body), `llmgate_client_usage_scans_total{result="error"} 2`) {
		t.Fatalf("metrics do not show the fail-open:\n%s", m.body)
	}
}

// Forgetting a client: every idempotency record and dead letter stored
// under its name goes, with a count and a WARN line; other clients keep
// theirs; its stored bytes start again from zero.
func TestPurgeClientData(t *testing.T) {
	mutate, alice, bob := tenants(config.ClientLimits{MaxStoredBytes: 2000})
	h := newHarness(t, func(c *config.Config) { mutate(c); c.Retry.MaxAttempts = 1 })
	h.fake.SetDefault(fakeprovider.Step{Status: 503})
	for _, hdr := range []map[string]string{with(alice, "Idempotency-Key", "fails"), with(bob, "Idempotency-Key", "fails")} {
		if r := h.chat(chatBody, hdr); r.status != 503 {
			t.Fatalf("failing call: %d %s", r.status, r.body)
		}
	}
	h.fake.SetDefault(fakeprovider.Step{})
	if r := h.chat(chatBody, with(bob, "Idempotency-Key", "fill-a")); r.status != 200 {
		t.Fatalf("bob: %d %s", r.status, r.body)
	}
	n := fillStorage(t, h, alice)

	if r := h.do(http.MethodDelete, "/admin/clients/alice/data", "", nil); r.status != http.StatusUnauthorized {
		t.Fatalf("purge without the admin token: %d %s", r.status, r.body)
	}
	r := h.admin(http.MethodDelete, "/admin/clients/alice/data")
	var got struct {
		Client      string `json:"client"`
		Records     int    `json:"records"`
		DeadLetters int    `json:"dead_letters"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &got) != nil || got.Client != "alice" || got.Records != n || got.DeadLetters != 1 {
		t.Fatalf("purge: %d %s; want %d records and 1 dead letter", r.status, r.body, n)
	}
	if !strings.Contains(h.logs.String(), `"level":"WARN","msg":"client data purged"`) {
		t.Fatalf("no WARN line for the purge:\n%s", h.logs.String())
	}
	if r := h.admin(http.MethodGet, "/admin/idempotency/fill-a?client=alice"); r.status != 404 {
		t.Fatalf("alice's record after the purge: %d %s", r.status, r.body)
	}
	if l := listDLQ(t, h, "?client=alice"); l.Total != 0 {
		t.Fatalf("alice's dead letters after the purge: %+v", l)
	}
	if l := listDLQ(t, h, "?client=bob"); l.Total != 1 {
		t.Fatalf("bob's dead letters after alice's purge: %+v", l)
	}
	if r := h.chat(chatBody, with(bob, "Idempotency-Key", "fill-a")); r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("bob's record after alice's purge: %d %s", r.status, r.body)
	}
	// Alice starts again: her keys run anew and her quota is free.
	calls := h.fake.Calls("")
	if r := h.chat(chatBody, with(alice, "Idempotency-Key", "fill-a")); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" || h.fake.Calls("") != calls+1 {
		t.Fatalf("alice's key after the purge: %d replayed=%q %s", r.status, r.header.Get("Idempotent-Replayed"), r.body)
	}
	if again := h.admin(http.MethodDelete, "/admin/clients/alice/data"); again.status != 200 || !strings.Contains(string(again.body), `"records":1`) {
		t.Fatalf("second purge: %d %s", again.status, again.body)
	}
}

// Over the storage quota a content-cached request is served, but not
// stored: caching saves calls, it is no guarantee a client asked for.
func TestCacheOverStorageQuota(t *testing.T) {
	mutate, alice, _ := tenants(config.ClientLimits{MaxStoredBytes: 2000})
	h := newHarness(t, mutate)
	fillStorage(t, h, alice)
	cached := with(alice, idempotency.CacheHeader, "on")
	for i := range 2 {
		calls := h.fake.Calls("")
		r := h.chat(chatBody, cached)
		if r.status != 200 || r.header.Get(idempotency.CacheHeader) != "miss" || h.fake.Calls("") != calls+1 {
			t.Fatalf("cached request %d over the quota: %d cache=%q calls %d→%d %s", i, r.status, r.header.Get(idempotency.CacheHeader), calls, h.fake.Calls(""), r.body)
		}
	}
}
