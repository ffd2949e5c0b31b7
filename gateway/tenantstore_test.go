package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	badgerstore "github.com/llmgate/llmgate/cache/badger"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

const (
	malloryKey = "sk-gw-mallory-0123456789"
	// brokenModel always fails upstream with a transient 500.
	brokenModel = "broken"
	// bigModel answers with 64 KiB of content.
	bigModel = "big"
)

var asMallory = map[string]string{"Authorization": "Bearer " + malloryKey}

// tenantUpstream answers every chat completion, but with a 500 for
// brokenModel and with 64 KiB of random hex for bigModel; it counts calls.
type tenantUpstream struct{ calls atomic.Int64 }

func (u *tenantUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	n := u.calls.Add(1)
	w.Header().Set("Content-Type", "application/json")
	if strings.Contains(string(body), `"model":"`+brokenModel+`"`) {
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`)
		return
	}
	content := "ok"
	if strings.Contains(string(body), `"model":"`+bigModel+`"`) {
		// Random, so that the store cannot compress it away.
		b := make([]byte, 32<<10)
		rand.Read(b)
		content = hex.EncodeToString(b)
	}
	fmt.Fprintf(w, `{"id":"chatcmpl-%d","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}]}`, n, content)
}

// tenantHarness is a gateway with alice, bob and mallory in front of a
// tenantUpstream, on a Badger store opened with so (Dir set here).
func tenantHarness(t *testing.T, so badgerstore.Options, mutate func(*config.Config)) (*harness, *badgerstore.Store, *tenantUpstream) {
	t.Helper()
	up := &tenantUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	so.Dir = t.TempDir()
	store, err := badgerstore.Open(so)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	h := newHarnessStore(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = srv.URL + "/v1"
		c.Clients = []config.Client{{Name: "alice", Key: aliceKey}, {Name: "bob", Key: bobKey}, {Name: "mallory", Key: malloryKey}}
		c.Retry.MaxAttempts = 1
		// The broken model's failures must not open the one upstream's
		// breaker for the other requests.
		c.Breaker.ConsecutiveFailures = 1 << 20
		c.Breaker.MinRequests = 1 << 20
		if mutate != nil {
			mutate(c)
		}
	}, func(Store) Store { return store }, simOptions())
	return h, store, up
}

func merged(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func chatOf(model string, pad int) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, strings.Repeat("p", pad))
}

// clientsView reads GET /admin/clients.
func clientsView(t *testing.T, h *harness) map[string]clientViewJSON {
	t.Helper()
	r := h.admin(http.MethodGet, "/admin/clients")
	var v struct{ Clients []clientViewJSON }
	if err := json.Unmarshal(r.body, &v); r.status != http.StatusOK || err != nil {
		t.Fatalf("GET /admin/clients: %d %s", r.status, r.body)
	}
	out := map[string]clientViewJSON{}
	for _, c := range v.Clients {
		out[c.Client] = c
	}
	return out
}

type clientViewJSON struct {
	Client             string `json:"client"`
	DeadLetters        int    `json:"dead_letters"`
	DeadLetterBytes    int64  `json:"dead_letter_bytes"`
	MaxDeadLetterBytes int64  `json:"max_dead_letter_bytes"`
	DeadLettersDropped int64  `json:"dead_letters_dropped"`
}

// TestDeadLettersBoundedPerClient: mallory's keyed requests on a failing
// model, with bodies near dead_letters.max_body_bytes, leave at most her
// bound of dead letters — her oldest dropped, counted in a metric and in
// the admin clients view — while alice's dead letter stays and alice's
// keyed requests still commit.
func TestDeadLettersBoundedPerClient(t *testing.T) {
	const bound = 1 << 20
	h, _, _ := tenantHarness(t, badgerstore.Options{DeadLetters: cache.DeadLetterBound{MaxBytes: bound}}, func(c *config.Config) {
		c.DeadLetters.MaxBytesPerClient = bound
	})
	if r := h.chat(chatOf(brokenModel, 10), merged(asAlice, key("alice-1"))); r.status < 500 {
		t.Fatalf("alice on the broken model: %d %s", r.status, r.body)
	}
	for i := range 30 {
		if r := h.chat(chatOf(brokenModel, 200<<10), merged(asMallory, key(fmt.Sprint("m-", i)))); r.status < 500 {
			t.Fatalf("mallory on the broken model: %d %s", r.status, r.body)
		}
	}
	v := clientsView(t, h)
	m, a := v["mallory"], v["alice"]
	if m.DeadLetterBytes > bound || m.DeadLetters == 0 || m.DeadLettersDropped == 0 || m.MaxDeadLetterBytes != bound {
		t.Fatalf("mallory: %+v, want at most %d bytes and drops counted", m, bound)
	}
	if a.DeadLetters != 1 || a.DeadLettersDropped != 0 {
		t.Fatalf("alice: %+v, want her one letter kept", a)
	}
	if !strings.Contains(h.metricsText(), fmt.Sprintf(`llmgate_deadletters_dropped_total{client="mallory"} %d`, m.DeadLettersDropped)) {
		t.Fatalf("drops not in the metric:\n%s", grepLines(h.metricsText(), "dropped"))
	}
	if r := h.chat(chatOf("gpt-4o-mini", 10), merged(asAlice, key("alice-2"))); r.status != http.StatusOK {
		t.Fatalf("alice's keyed request: %d %s", r.status, r.body)
	}
	if r := h.chat(chatOf("gpt-4o-mini", 10), merged(asAlice, key("alice-2"))); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("alice's keyed request was not committed: %d %v", r.status, r.header)
	}
	t.Logf("mallory: %d letters, %d bytes (bound %d), %d dropped", m.DeadLetters, m.DeadLetterBytes, bound, m.DeadLettersDropped)
}

// simOptions is the harness's fake-upstream options: none (these tests
// bring their own upstream).
func simOptions() fakeprovider.Options { return fakeprovider.Options{} }

// TestPurgeTakesTheStoreOutOfFull: mallory's dead letters fill the store
// to store.max_bytes (never past it), and alice's new keyed requests get
// 503 idempotency_store_full; DELETE /admin/clients/mallory/data takes the
// store out of the full state at once, without a restart: alice's next
// keyed request commits.
func TestPurgeTakesTheStoreOutOfFull(t *testing.T) {
	const capBytes = 4 << 20
	h, store, _ := tenantHarness(t, badgerstore.Options{MaxBytes: capBytes, DeadLetters: cache.DeadLetterBound{MaxBytes: 2 * capBytes}}, nil)
	for i := range 30 {
		h.chat(chatOf(brokenModel, 200<<10), merged(asMallory, key(fmt.Sprint("m-", i))))
	}
	// The live figure is never under what the store holds, but it may be
	// over: a letter written while the space check's rescan ran is counted
	// by the scan and again as written since (cache/badger/live.go). With
	// nothing in flight now, the next rescan (every SpaceInterval, 1 s,
	// this near the cap) gives the true sum; a store really past its cap
	// stays past it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		sp := store.Space()
		if sp.LiveBytes <= capBytes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mallory's dead letters went past the cap: %+v", sp)
		}
	}
	// Her keyed commits take the rest, until the store refuses them.
	for i := 0; ; i++ {
		r := h.chat(chatOf(bigModel, 10), merged(asMallory, key(fmt.Sprint("big-", i))))
		if r.status == http.StatusServiceUnavailable {
			break
		}
		if r.status != http.StatusOK || i > 100 {
			t.Fatalf("mallory's commit %d: %d (%d bytes); store %+v", i, r.status, len(r.body), store.Space())
		}
	}
	full := store.Space()
	// A commit admitted below the cap lands: the cap is passed by the
	// calls running when it was reached (here one at a time) at most.
	if !full.Full || full.LiveBytes > capBytes+128<<10 {
		t.Fatalf("after mallory's flood: %+v, want full, past the cap by one commit at most", full)
	}
	r := h.chat(chatOf("gpt-4o-mini", 10), merged(asAlice, key("alice-1")))
	if e := wantOpenAIError(t, r, http.StatusServiceUnavailable); e["code"] != "idempotency_store_full" {
		t.Fatalf("alice on a full store: %v", e)
	}
	start := time.Now()
	if r := h.admin(http.MethodDelete, "/admin/clients/mallory/data"); r.status != http.StatusOK {
		t.Fatalf("purge: %d %s", r.status, r.body)
	}
	r = h.chat(chatOf("gpt-4o-mini", 10), merged(asAlice, key("alice-1")))
	took := time.Since(start)
	if r.status != http.StatusOK {
		t.Fatalf("alice after the purge: %d %s", r.status, r.body)
	}
	after := store.Space()
	t.Logf("full: live %d of %d bytes (files %d); purge to alice's commit %v; after: live %d, files %d", full.LiveBytes, capBytes, full.UsedBytes, took, after.LiveBytes, after.UsedBytes)
}
