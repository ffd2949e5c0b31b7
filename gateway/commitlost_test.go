package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// lostReplyStore is a store whose commit reaches the store but whose reply
// is lost: it calls the real Commit, then reports a timeout, as a Redis
// commit does when the connection drops after the script ran (or when
// WAIT finds too few replicas: the record is on the primary all the same).
type lostReplyStore struct {
	Store
	lose atomic.Bool
}

var errReplyLost = errors.New("read tcp 127.0.0.1:6379: i/o timeout")

func (s *lostReplyStore) Commit(ctx context.Context, k cache.Key, owner string, rec *cache.Record, ttl time.Duration) error {
	err := s.Store.Commit(ctx, k, owner, rec, ttl)
	if err == nil && s.lose.Load() {
		return errReplyLost
	}
	return err
}

// Fault (f): a commit that was written although the gateway was told it
// failed. The client is told the answer could not be stored (a stream ends
// in the error event, so no SDK takes it as complete; a JSON answer is a
// 503), and its retry replays the stored answer with no second upstream
// call: the same content the stream had already shown. The client never
// holds two different complete answers for one key.
func TestCommitWrittenButReplyLost(t *testing.T) {
	var ls *lostReplyStore
	h := newHarnessStore(t, nil, func(s Store) Store { ls = &lostReplyStore{Store: s}; return ls }, fakeprovider.Options{})
	ls.lose.Store(true)

	hdr := key("lost-reply-stream")
	complete, text := sdkStream(t, h, hdr)
	if complete {
		t.Fatal("the SDK saw a stream complete whose commit reported a failure")
	}
	if !strings.Contains(h.logs.String(), "commit failed") {
		t.Fatal("the failed commit was not logged")
	}
	ls.lose.Store(false)
	complete2, text2 := sdkStream(t, h, hdr)
	if !complete2 || text2 != text || h.fake.Calls("") != 1 {
		t.Fatalf("the retry is not a replay of the answer the first stream showed: complete=%v %q vs %q, calls %d",
			complete2, text2, text, h.fake.Calls(""))
	}

	ls.lose.Store(true)
	r := h.chat(chatBody, key("lost-reply-json"))
	if e := wantOpenAIError(t, r, http.StatusServiceUnavailable); e["code"] != "idempotency_store_unavailable" {
		t.Fatalf("JSON answer whose commit reply was lost: %s", r.body)
	}
	ls.lose.Store(false)
	again := h.chat(chatBody, key("lost-reply-json"))
	if again.status != 200 || again.header.Get("Idempotent-Replayed") != "true" || h.fake.Calls("") != 2 {
		t.Fatalf("JSON retry: %d replayed=%q calls=%d", again.status, again.header.Get("Idempotent-Replayed"), h.fake.Calls(""))
	}
}
