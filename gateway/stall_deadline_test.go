package gateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

// slowMarkerStore takes delay to commit a not-stored marker (a 410
// record): a store slow to answer.
type slowMarkerStore struct {
	Store
	delay time.Duration
}

func (s *slowMarkerStore) Commit(ctx context.Context, k cache.Key, owner string, rec *cache.Record, ttl time.Duration) error {
	if rec.Status == http.StatusGone {
		time.Sleep(s.delay)
	}
	return s.Store.Commit(ctx, k, owner, rec, ttl)
}

// The stall guard's write deadline (server.write_stall_timeout) bounds the
// work's writes to its client, not what net/http writes after them: a
// keyed stream whose settling after its last event takes longer than
// write_stall_timeout (here the marker of a stream too large to record,
// committed by a slow store) still ends whole, its chunked body
// terminated and its X-Llmgate-Committed trailer sent. A deadline left
// set from the last event would cut net/http's final write, and the
// client would see a broken stream (and its retry get 410, the marker
// being committed for a stream it was "served").
func TestStallDeadlineDoesNotCutTheResponseEnd(t *testing.T) {
	const stall = 100 * time.Millisecond
	h := newHarnessStore(t, func(c *config.Config) {
		c.Idempotency.MaxRecordBytes = 1024
		c.Server.WriteStallTimeout = config.Duration(stall)
	}, func(s Store) Store { return &slowMarkerStore{Store: s, delay: 4 * stall} }, fakeprovider.Options{})
	h.fake.Enqueue(fakeprovider.Step{Body: fixedStream})
	res, err := h.send(context.Background(), http.MethodPost, "/v1/chat/completions", streamBody, key("slow-settle"))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("reading the stream: %v (got %d bytes, [DONE] %v)", err, len(b), strings.Contains(string(b), "[DONE]"))
	}
	if string(b) != fixedStream {
		t.Fatalf("client got %d bytes, want the upstream's %d", len(b), len(fixedStream))
	}
	if got := res.Trailer.Get(idempotency.CommittedTrailer); got == "" {
		t.Fatalf("no %s trailer: the response's end was cut", idempotency.CommittedTrailer)
	}
}
