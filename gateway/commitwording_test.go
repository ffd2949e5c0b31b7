package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// errStore fails its claims or its commits with the error a test sets.
type errStore struct {
	Store
	claimErr, commitErr atomic.Pointer[error]
}

func (s *errStore) Claim(ctx context.Context, k cache.Key, fp string, lease time.Duration) (cache.Claim, error) {
	if err := s.claimErr.Load(); err != nil {
		return cache.Claim{}, *err
	}
	return s.Store.Claim(ctx, k, fp, lease)
}

func (s *errStore) Commit(ctx context.Context, k cache.Key, owner string, rec *cache.Record, ttl time.Duration) error {
	if err := s.commitErr.Load(); err != nil {
		return *err
	}
	return s.Store.Commit(ctx, k, owner, rec, ttl)
}

// The 503 of a store failure says what happened to the call: at the claim
// it was not run; at the commit it ran (and may have been billed), its
// answer was not stored, and its retry runs it again — for a JSON answer
// and, in the same words, for a stream's error event. A full store at the
// commit keeps its code (idempotency_store_full) and says the same.
func TestStoreFailureSaysWhetherTheCallRan(t *testing.T) {
	var st *errStore
	h := newHarnessStore(t, nil, func(s Store) Store { st = &errStore{Store: s}; return st }, fakeprovider.Options{})
	set := func(p *atomic.Pointer[error], err error) {
		if err == nil {
			p.Store(nil)
			return
		}
		p.Store(&err)
	}
	notRun := func(msg string) bool { return strings.Contains(msg, "was not run") }
	ran := func(msg string) bool {
		return strings.Contains(msg, "was run") && strings.Contains(msg, "billed again") && !notRun(msg)
	}

	set(&st.claimErr, errDiskFull)
	e := wantOpenAIError(t, h.chat(chatBody, key("claim-fails")), http.StatusServiceUnavailable)
	if msg, _ := e["message"].(string); e["code"] != "idempotency_store_unavailable" || !notRun(msg) || h.fake.Calls("") != 0 {
		t.Fatalf("store failed at the claim: %v (upstream calls %d)", e, h.fake.Calls(""))
	}
	set(&st.claimErr, nil)

	for _, c := range []struct {
		name string
		err  error
		code string
	}{
		{"unavailable", errDiskFull, "idempotency_store_unavailable"},
		{"full", fmt.Errorf("commit: %w", cache.ErrFull), "idempotency_store_full"},
	} {
		set(&st.commitErr, c.err)
		calls := h.fake.Calls("")
		r := h.chat(chatBody, key("commit-fails-"+c.name))
		e := wantOpenAIError(t, r, http.StatusServiceUnavailable)
		if msg, _ := e["message"].(string); e["code"] != c.code || !ran(msg) || h.fake.Calls("") != calls+1 {
			t.Fatalf("store %s at the commit of a JSON answer: %v (upstream calls %d, was %d)", c.name, e, h.fake.Calls(""), calls)
		}
		if r.header.Get("Retry-After") == "" {
			t.Fatalf("store %s at the commit: no Retry-After", c.name)
		}
		jsonMsg := e["message"]

		ev := lastErrorEvent(t, h.chat(streamBody, key("stream-commit-fails-"+c.name)).body)
		if ev.Code != c.code || ev.Message != jsonMsg {
			t.Fatalf("store %s at the commit of a stream: error event %+v, want code %s and the JSON answer's words %q", c.name, ev, c.code, jsonMsg)
		}
	}
	set(&st.commitErr, nil)
	if r := h.chat(chatBody, key("commit-fails-unavailable")); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the retry after a failed commit: %d replayed=%q", r.status, r.header.Get("Idempotent-Replayed"))
	}
}

type streamError struct {
	Message string `json:"message"`
	Code    string `json:"code"`
}

// lastErrorEvent is the error object of a chat stream's last data event.
func lastErrorEvent(t *testing.T, body []byte) streamError {
	t.Helper()
	events := strings.Split(strings.TrimSpace(string(body)), "\n\n")
	last := strings.TrimPrefix(events[len(events)-1], "data: ")
	var ev struct {
		Error *streamError `json:"error"`
	}
	if err := json.Unmarshal([]byte(last), &ev); err != nil || ev.Error == nil {
		t.Fatalf("the stream does not end in an error event: %q", last)
	}
	return *ev.Error
}
