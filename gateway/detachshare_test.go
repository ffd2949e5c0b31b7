package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
)

// waitFor polls cond (a state another goroutine reaches) until it holds,
// failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestDetachedCallsShared: alice parks more keyed calls than
// idempotency.max_detached on a model that hangs and leaves; she keeps
// her share (half the cap) and her calls past it are cancelled. Bob's
// keyed call, whose client left too, runs on and commits: his retry is a
// replay, the upstream called once.
func TestDetachedCallsShared(t *testing.T) {
	release, bobGo := make(chan struct{}), make(chan struct{})
	var hung, hungEnded, slow atomic.Int32
	var bobCancelled atomic.Bool
	h, _ := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(body), `"model":"hang"`):
			hung.Add(1)
			defer hungEnded.Add(1)
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		case strings.Contains(string(body), `"model":"slow"`):
			slow.Add(1)
			select {
			case <-bobGo:
			case <-r.Context().Done():
				bobCancelled.Store(true)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"chatcmpl-b","object":"chat.completion","model":"slow","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	}, func(c *config.Config) {
		c.Clients = []config.Client{{Name: "alice", Key: aliceKey}, {Name: "bob", Key: bobKey}}
		c.Idempotency.MaxDetached = 4
		c.Retry.MaxAttempts = 1
	})
	t.Cleanup(func() { close(release) })
	detached := func() int64 { return h.gw.requests.Detached() }
	leave := func(as map[string]string, model, key string) (cancel func(), wait func()) {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := h.send(ctx, http.MethodPost, "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"x"}]}`, model),
				merged(as, map[string]string{"Idempotency-Key": key}))
			if err == nil {
				res.Body.Close()
			}
		}()
		return cancel, wg.Wait
	}
	var cancels []func()
	for i := range 6 {
		cancel, wait := leave(asAlice, "hang", fmt.Sprint("alice-", i))
		defer wait()
		cancels = append(cancels, cancel)
	}
	waitFor(t, "alice's six calls upstream", func() bool { return hung.Load() == 6 })
	for _, c := range cancels {
		c()
	}
	// Every call of hers still running upstream is detached: the others
	// were cancelled.
	waitFor(t, "alice's calls detached or cancelled", func() bool { return int64(hung.Load()-hungEnded.Load()) == detached() })
	aliceDetached := detached()

	cancel, wait := leave(asBob, "slow", "bob-1")
	defer wait()
	waitFor(t, "bob's call upstream", func() bool { return slow.Load() == 1 })
	cancel()
	waitFor(t, "bob's call detached or cancelled", func() bool { return detached() == aliceDetached+1 || bobCancelled.Load() })
	close(bobGo)
	r := h.chat(`{"model":"slow","messages":[{"role":"user","content":"x"}]}`, merged(asBob, key("bob-1")))
	if r.status != http.StatusOK || r.header.Get("Idempotent-Replayed") != "true" || slow.Load() != 1 {
		t.Fatalf("bob's retry: %d replayed=%q, upstream called %d times", r.status, r.header.Get("Idempotent-Replayed"), slow.Load())
	}
	waitFor(t, "bob's detached call to end", func() bool { return detached() == aliceDetached })
	if aliceDetached != 2 {
		t.Fatalf("alice's detached calls: %d; want her share of 2, still running", aliceDetached)
	}
}
