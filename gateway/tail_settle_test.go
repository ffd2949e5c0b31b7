package gateway

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// slowSettle is a store whose budget settlement blocks until release is
// closed (a Redis round trip that takes its time, up to store.op_timeout),
// and says when it has begun.
type slowSettle struct {
	Store
	began   chan struct{}
	release chan struct{}
}

func (s slowSettle) SettleBudget(ctx context.Context, scope, id string, lines []cache.BudgetLine) error {
	close(s.began)
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return s.Store.SettleBudget(context.WithoutCancel(ctx), scope, id, lines)
}

// TestKeyedStreamEndNotHeldBySettling: once a keyed stream is committed,
// its held-back ending ([DONE] included) goes to the client; the work
// left after it (the budget's settlement, a store round trip) must not
// hold it in net/http's buffer. Since the tail has gone out unflushed, to
// be flushed with the response's end, a client of a budgeted tenant got
// [DONE] only once the settlement returned: on a slow budget store, up to
// store.op_timeout late.
func TestKeyedStreamEndNotHeldBySettling(t *testing.T) {
	up := httptest.NewServer(&metered{In: 1, Out: 1})
	defer up.Close()
	st := slowSettle{began: make(chan struct{}), release: make(chan struct{})}
	h := newHarnessStore(t, budgeted(up.URL, config.Budget{Window: "day", Tokens: 1 << 30}),
		func(s Store) Store { st.Store = s; return st }, fakeprovider.Options{})
	srv := httptest.NewServer(h.gw.Handler())
	defer srv.Close()
	defer close(st.release)
	body := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Hello"}]}`
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer key-alice")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "tail-settle")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	gotDone := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if sc.Text() == "data: [DONE]" {
				close(gotDone)
				return
			}
		}
	}()
	select {
	case <-st.began:
	case <-time.After(5 * time.Second):
		t.Fatal("the budget was never settled")
	}
	select {
	case <-gotDone:
	case <-time.After(2 * time.Second):
		t.Fatal("the committed stream's [DONE] did not reach the client while the budget's settlement was under way")
	}
}
