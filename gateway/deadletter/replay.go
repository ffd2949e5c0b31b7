package deadletter

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

// ReplayResult is what one replay did.
type ReplayResult struct {
	ID       string `json:"id"`
	Status   int    `json:"status"`
	Replayed bool   `json:"already_committed"`
	Error    string `json:"error,omitempty"`
}

// OK reports whether the replay ended in a 2xx.
func (r ReplayResult) OK() bool { return r.Status >= 200 && r.Status <= 299 }

// Succeeded counts the replays that ended in a 2xx.
func Succeeded(rs []ReplayResult) int {
	n := 0
	for _, r := range rs {
		if r.OK() {
			n++
		}
	}
	return n
}

type replayClientKey struct{}

// ReplayClient returns the client an operator's in-process replay runs as.
// Nothing a client sends can set a context value.
func ReplayClient(ctx context.Context) (string, bool) {
	name, ok := ctx.Value(replayClientKey{}).(string)
	return name, ok
}

// Replay re-runs a dead letter's request under its original client and key
// through the gateway's handler: on success the completion is committed
// under that key (and the dead letter resolved), so the client's next retry
// with its key gets the answer without another call.
func (q *Queue) Replay(ctx context.Context, d *cache.DeadLetter) ReplayResult {
	res := ReplayResult{ID: d.ID}
	if why := unreplayable(d); why != "" {
		res.Error = why
		q.metrics.DLQReplays.WithLabelValues("refused").Inc()
		return res
	}
	ctx = context.WithValue(ctx, replayClientKey{}, d.Client)
	target := d.Endpoint
	if d.Query != "" {
		// The key's fingerprint covers the query: without it the replay
		// would commit another request under the client's key.
		target += "?" + d.Query
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(d.Body))
	if err != nil {
		res.Error = err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", QuoteKey(d.Key))
	w := &discardWriter{header: http.Header{}}
	q.handler.ServeHTTP(w, req)
	res.Status = w.status
	res.Replayed = w.header.Get("Idempotent-Replayed") == "true"
	if res.OK() && !res.Replayed && strings.HasPrefix(w.header.Get("Content-Type"), "text/event-stream") &&
		w.header.Get(idempotency.CommittedTrailer) != "true" {
		// A stream answers 200 before it is known to end well: it
		// succeeded only if it was committed.
		res.Error = "the stream failed again before it was committed"
		res.Status = http.StatusBadGateway
	}
	result := "failed"
	if res.OK() {
		result = "succeeded"
		if res.Replayed {
			// The client's own retry got there first; nothing is left to do.
			_ = q.store.DeleteDeadLetter(ctx, d.ID)
		}
	}
	q.metrics.DLQReplays.WithLabelValues(result).Inc()
	q.log.Info("dead letter replayed", "id", d.ID, "client", d.Client, "status", w.status, "already_committed", res.Replayed)
	q.Poke()
	return res
}

// unreplayable says why d cannot be replayed, or "". A letter without its
// whole body is refused and kept: replaying it would send another request
// (an empty or cut body) under the client's key, and commit its answer for
// the client's retry.
func unreplayable(d *cache.DeadLetter) string {
	switch {
	case d.BodyNotKept:
		return "the request's body was not kept (a multipart or binary upload is not stored with its dead letter); it cannot be replayed: the client must resend the request with its Idempotency-Key"
	case d.BodyTruncated:
		return "the stored body was truncated (dead_letters.max_body_bytes); it cannot be replayed"
	}
	return ""
}

// ReplayPaced replays ds in order at most dead_letters.replay_per_second,
// so a group replay after a fix does not become the next outage. A dead
// letter resolved meanwhile is skipped. It stops when ctx ends.
func (q *Queue) ReplayPaced(ctx context.Context, ds []cache.DeadLetter) ([]ReplayResult, error) {
	rate := q.cfg.ReplayPerSecond
	if rate <= 0 {
		rate = 5
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	results := make([]ReplayResult, 0, len(ds))
	for i, d := range ds {
		if i > 0 {
			select {
			case <-ctx.Done():
				return results, ctx.Err()
			case <-tick.C:
			}
		}
		full, err := q.store.GetDeadLetter(ctx, d.ID)
		if err != nil {
			continue // resolved meanwhile
		}
		results = append(results, q.Replay(ctx, full))
	}
	return results, nil
}

// QuoteKey renders a key as an RFC 8941 sf-string, which parses back to it
// whatever characters it holds.
func QuoteKey(k string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
}

// discardWriter is the ResponseWriter of an internal replay: it keeps the
// status and headers and drops the body (it is committed in the store).
type discardWriter struct {
	header http.Header
	status int
}

func (w *discardWriter) Header() http.Header { return w.header }
func (w *discardWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(b), nil
}
func (w *discardWriter) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
	}
}
func (w *discardWriter) Flush() {}
