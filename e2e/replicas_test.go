package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// redisURL returns the Redis the replica tests share, or skips — unless
// LLMGATE_REQUIRE_REDIS=1 (CI), where an absent Redis fails the test.
func redisURL(t *testing.T) string {
	t.Helper()
	addr := os.Getenv("LLMGATE_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		if os.Getenv("LLMGATE_REQUIRE_REDIS") == "1" {
			t.Fatalf("Redis expected at %s (LLMGATE_REQUIRE_REDIS=1) but unreachable: %v", addr, err)
		}
		t.Skipf("Redis not reachable at %s (%v): start redis-server, or set LLMGATE_REDIS_ADDR, to run the replica tests", addr, err)
	}
	c.Close()
	return "redis://" + addr + "/0"
}

// redisConfig is the store section of a replica test's gateways: the
// shared Redis under a key prefix of the test's own, whose keys are
// deleted when the test ends (after its gateways stopped: call it before
// starting them).
func redisConfig(t *testing.T, lease string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	url, prefix := redisURL(t), "llmgate-e2e-"+hex.EncodeToString(b[:])+":"
	leaveNoKeys(t, url, prefix)
	return fmt.Sprintf("store:\n  kind: redis\n  redis:\n    url: %s\n    prefix: %q\nidempotency:\n  lease: %s\n  wait_timeout: 30s\n",
		url, prefix, lease)
}

// leaveNoKeys makes sure that a test on the shared Redis at url leaves no
// key under prefix behind: when the test ends (its gateways stopped), the
// keys are deleted, and a SCAN for the prefix must then find none.
func leaveNoKeys(t *testing.T, url, prefix string) {
	t.Helper()
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c := redis.NewClient(opts)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		scan := func() []string {
			var keys []string
			iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				keys = append(keys, iter.Val())
			}
			if err := iter.Err(); err != nil {
				t.Errorf("SCAN %s*: %v", prefix, err)
			}
			return keys
		}
		if keys := scan(); len(keys) > 0 {
			if err := c.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("deleting the test's keys: %v", err)
			}
		}
		if left := scan(); len(left) > 0 {
			t.Errorf("the test left %d keys under %q in Redis, e.g. %q", len(left), prefix, left[0])
		}
	})
}

func TestReplicasShareKeys(t *testing.T) {
	fake, upURL := newFake(t, fakeprovider.Options{Latency: 300 * time.Millisecond})
	extra := redisConfig(t, "5s")
	bin := gatewayBin(t, "")
	a := start(t, bin, []string{"-config", writeConfig(t, t.TempDir(), upURL, extra)}, nil)
	b := start(t, bin, []string{"-config", writeConfig(t, t.TempDir(), upURL, extra)}, nil)

	for _, body := range []string{
		`{"model":"gpt-4o","messages":[{"role":"user","content":"shared"}]}`,
		`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"shared stream"}]}`,
	} {
		before := fake.Calls("")
		key := map[string]string{"Idempotency-Key": "replicas/" + fmt.Sprint(before)}
		var wg sync.WaitGroup
		answers := make([][]byte, 6)
		for i := range answers {
			url := a.URL
			if i%2 == 1 {
				url = b.URL
			}
			wg.Go(func() {
				status, _, got, err := tryPost(url+"/v1/chat/completions", body, key)
				if err != nil || status != 200 {
					t.Errorf("replica answer %d: %d %s %v", i, status, got, err)
				}
				answers[i] = got
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		for i := range answers {
			if string(answers[i]) != string(answers[0]) {
				t.Fatalf("replicas answered differently:\n%s\n%s", answers[0], answers[i])
			}
		}
		if n := fake.Calls("") - before; n != 1 {
			t.Fatalf("one key on two replicas made %d upstream calls", n)
		}
	}
}

func TestReplicaKilledMidRequestIsTakenOver(t *testing.T) {
	fake, upURL := newFake(t, fakeprovider.Options{})
	extra := redisConfig(t, "2s")
	bin := gatewayBin(t, "")
	a := start(t, bin, []string{"-config", writeConfig(t, t.TempDir(), upURL, extra)}, nil)
	b := start(t, bin, []string{"-config", writeConfig(t, t.TempDir(), upURL, extra)}, nil)
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"killed"}]}`
	key := map[string]string{"Idempotency-Key": "replicas/killed"}

	fake.Enqueue(fakeprovider.Step{Hang: true})
	go func() {
		req, _ := http.NewRequest(http.MethodPost, a.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key["Idempotency-Key"])
		if res, err := httpClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}()
	waitCalls(t, fake, 1)
	a.kill() // replica A dies holding the claim

	start := time.Now()
	status, h, got := post(t, b.URL+"/v1/chat/completions", body, key)
	if status != 200 || h.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after takeover: %d replayed=%q %s", status, h.Get("Idempotent-Replayed"), got)
	}
	if waited := time.Since(start); waited < time.Second {
		t.Fatalf("B ran the key after %v, before A's lease could expire", waited)
	}
	if n := fake.Calls(""); n != 2 {
		t.Fatalf("upstream calls %d, want 2 (A's lost one and B's)", n)
	}
	status, h, again := post(t, b.URL+"/v1/chat/completions", body, key)
	if status != 200 || h.Get("Idempotent-Replayed") != "true" || string(again) != string(got) {
		t.Fatal("the taken-over key was not committed")
	}
}

func TestForceOpenAppliesToEveryReplica(t *testing.T) {
	fake, upURL := newFake(t, fakeprovider.Options{})
	extra := redisConfig(t, "5s")
	bin := gatewayBin(t, "")
	a := start(t, bin, []string{"-config", writeConfig(t, t.TempDir(), upURL, extra)}, nil)
	b := start(t, bin, []string{"-config", writeConfig(t, t.TempDir(), upURL, extra)}, nil)

	adminReq := func(method, url string) (int, []byte) {
		req, _ := http.NewRequest(method, url, nil)
		req.Header.Set("Authorization", "Bearer e2e-admin-token")
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, body
	}
	if st, body := adminReq(http.MethodPost, a.URL+"/admin/breakers/fake/open"); st != 200 {
		t.Fatalf("force open on A: %d %s", st, body)
	}
	stateOn := func(p *proc) (string, bool) {
		_, body := adminReq(http.MethodGet, p.URL+"/admin/breakers")
		var v struct {
			Breakers []struct {
				Name, State string
				Forced      bool
			}
			SharedOverrides map[string]bool `json:"shared_overrides"`
		}
		_ = json.Unmarshal(body, &v)
		for _, br := range v.Breakers {
			if br.Name == "fake" {
				return br.State, v.SharedOverrides["fake"]
			}
		}
		return "", false
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		state, override := stateOn(b)
		if state == "open" && override {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("B never saw A's force-open: state %q override %v", state, override)
		}
		time.Sleep(20 * time.Millisecond) // waiting for pub/sub delivery to another process
	}
	before := fake.Calls("")
	if st, _, _ := post(t, b.URL+"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}`, nil); st != 503 {
		t.Fatalf("B with a force-opened breaker answered %d", st)
	}
	if fake.Calls("") != before {
		t.Fatal("B called a force-opened upstream")
	}
	if st, body := adminReq(http.MethodPost, b.URL+"/admin/breakers/fake/close"); st != 200 {
		t.Fatalf("close on B: %d %s", st, body)
	}
	for {
		state, override := stateOn(a)
		if state == "closed" && !override {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A never saw B's close: %q %v", state, override)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// One model forced open on A: B refuses that model and serves the
	// others of the same upstream; a close on B reaches A.
	if st, body := adminReq(http.MethodPost, a.URL+"/admin/breakers/fake/open?model=gpt-4o"); st != 200 {
		t.Fatalf("force open gpt-4o on A: %d %s", st, body)
	}
	modelForced := func(p *proc) (forced, listed bool) {
		_, body := adminReq(http.MethodGet, p.URL+"/admin/breakers")
		var v struct {
			Breakers []struct {
				Name, Model string
				Forced      bool
			}
			SharedModelOverrides map[string][]string `json:"shared_model_overrides"`
		}
		_ = json.Unmarshal(body, &v)
		for _, br := range v.Breakers {
			if br.Name == "fake" && br.Model == "gpt-4o" {
				forced = br.Forced
			}
		}
		return forced, slices.Contains(v.SharedModelOverrides["fake"], "gpt-4o")
	}
	deadline = time.Now().Add(15 * time.Second)
	for forced, listed := modelForced(b); !forced || !listed; forced, listed = modelForced(b) {
		if time.Now().After(deadline) {
			t.Fatalf("B never saw A's force-open of gpt-4o: forced %v, listed %v", forced, listed)
		}
		time.Sleep(20 * time.Millisecond) // waiting for pub/sub delivery to another process
	}
	if st, _, _ := post(t, b.URL+"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}`, nil); st != 503 {
		t.Fatalf("B with gpt-4o forced open answered %d", st)
	}
	if st, _, body := post(t, b.URL+"/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}]}`, nil); st != 200 {
		t.Fatalf("B refused gpt-4o-mini with only gpt-4o forced open: %d %s", st, body)
	}
	if st, body := adminReq(http.MethodPost, b.URL+"/admin/breakers/fake/close?model=gpt-4o"); st != 200 {
		t.Fatalf("close gpt-4o on B: %d %s", st, body)
	}
	for forced, listed := modelForced(a); forced || listed; forced, listed = modelForced(a) {
		if time.Now().After(deadline) {
			t.Fatalf("A never saw B's close of gpt-4o: forced %v, listed %v", forced, listed)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitCalls(t *testing.T, f *fakeprovider.Server, n int) {
	t.Helper()
	ctx, cancel := contextWithTimeout(10 * time.Second)
	defer cancel()
	if err := f.WaitForCalls(ctx, n); err != nil {
		t.Fatalf("upstream never got %d calls: %v", n, err)
	}
}
