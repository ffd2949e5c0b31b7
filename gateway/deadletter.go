package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/cache"
)

// DeadLetterStore keeps keyed requests that finally failed. cache.Badger
// and cache.Redis implement it.
type DeadLetterStore interface {
	PutDeadLetter(ctx context.Context, k cache.Key, d *cache.DeadLetter, ttl time.Duration) error
	GetDeadLetter(ctx context.Context, id string) (*cache.DeadLetter, error)
	DeleteDeadLetter(ctx context.Context, id string) error
	ListDeadLetters(ctx context.Context, f cache.DeadLetterFilter) ([]cache.DeadLetter, error)
}

// failure is what a keyed request's final failure says, for its dead letter.
type failure struct {
	class    string
	message  string
	status   int
	attempts int
	tried    []string
}

// deadLetterFailure decides whether a keyed request's end is a dead letter:
// a transient failure after the retry layer, an open breaker with no
// fallback, or the deadline spent. Permanent failures are the caller's to
// fix and are not recorded.
func deadLetterFailure(resp *response, err error, tried []string) (failure, bool) {
	f := failure{tried: tried}
	if err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			return f, false
		}
		switch ae.Code {
		case "upstream_unavailable":
			f.class = "breaker_open"
		case "deadline_exceeded":
			f.class = "deadline"
		default:
			return f, false
		}
		f.message, f.status = ae.Message, ae.Status
		return f, true
	}
	if resp == nil || !resp.outcome.Class.BreakerFailure() {
		return f, false
	}
	f.class = string(resp.outcome.Class)
	f.message = resp.outcome.Reason
	f.status = resp.status
	f.attempts = resp.attempts
	return f, true
}

// recordDeadLetter stores a keyed request's final failure.
func (g *Gateway) recordDeadLetter(ctx context.Context, cl *call, kr *keyedReq, f failure, first time.Time) {
	body := cl.body
	truncated := false
	if max := g.cfg.DeadLetters.MaxBodyBytes; max >= 0 && len(body) > max {
		body, truncated = body[:max], true
	}
	d := &cache.DeadLetter{
		Model: cl.rt.Model, Body: body, BodySize: len(cl.body), BodyTruncated: truncated,
		Upstreams: f.tried, Attempts: f.attempts, Class: f.class, Message: f.message, Status: f.status,
		FirstAt: first, LastAt: g.now(),
	}
	if err := g.store.PutDeadLetter(ctx, kr.key, d, g.cfg.DeadLetters.TTL.D()); err != nil {
		g.log.Error("recording dead letter failed", "idempotency_key", hashKey(kr.key.ID), "err", err)
		return
	}
	g.metrics.dlqRecorded.WithLabelValues(f.class).Inc()
	g.log.Warn("dead letter recorded", "id", d.ID, "client", d.Client, "idempotency_key", hashKey(kr.key.ID),
		"class", f.class, "upstreams", strings.Join(f.tried, ","), "failures", d.Failures)
	g.dlq.poke()
}

// resolveDeadLetter removes the dead letter of a key that has now
// succeeded.
func (g *Gateway) resolveDeadLetter(ctx context.Context, k cache.Key) {
	err := g.store.DeleteDeadLetter(ctx, cache.DeadLetterID(k))
	if err == nil {
		g.log.Info("dead letter resolved by a later success", "idempotency_key", hashKey(k.ID), "client", k.Scope)
		g.dlq.poke()
	} else if !errors.Is(err, cache.ErrNotFound) {
		g.log.Warn("resolving dead letter failed", "idempotency_key", hashKey(k.ID), "err", err)
	}
}

// dlqMonitor keeps the dead-letter gauges current and alerts when the queue
// passes its threshold: a log line at ERROR, the alert gauge, and one
// webhook POST per alert (repeated at most hourly while it lasts) — never a
// retry storm.
type dlqMonitor struct {
	g       *Gateway
	pokeCh  chan struct{}
	stop    chan struct{}
	stopped chan struct{}
	client  *http.Client

	mu         sync.Mutex
	summary    []dlqGroup
	total      int
	alerting   bool
	lastNotify time.Time
}

type dlqGroup struct {
	Upstream string `json:"upstream"`
	Class    string `json:"class"`
	Count    int    `json:"count"`
}

func newDLQMonitor(g *Gateway) *dlqMonitor {
	return &dlqMonitor{g: g, pokeCh: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{}),
		client: &http.Client{Timeout: g.cfg.DeadLetters.WebhookTimeout.D()}}
}

func (m *dlqMonitor) poke() {
	select {
	case m.pokeCh <- struct{}{}:
	default:
	}
}

func (m *dlqMonitor) run() {
	defer close(m.stopped)
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	m.refresh()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		case <-m.pokeCh:
		}
		m.refresh()
	}
}

func (m *dlqMonitor) close() {
	close(m.stop)
	<-m.stopped
}

// refresh recounts the queue, sets the gauges and evaluates the alert.
func (m *dlqMonitor) refresh() {
	g := m.g
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	all, err := g.store.ListDeadLetters(ctx, cache.DeadLetterFilter{})
	if err != nil {
		if !errors.Is(err, cache.ErrClosed) {
			g.log.Warn("counting dead letters failed", "err", err)
		}
		return
	}
	summary := groupDeadLetters(all)
	byClass := map[string]int{}
	hourAgo := g.now().Add(-time.Hour)
	grewHour := 0
	for _, d := range all {
		byClass[d.Class]++
		if d.FirstAt.After(hourAgo) {
			grewHour++
		}
	}
	g.metrics.dlqSize.Reset()
	for c, n := range byClass {
		g.metrics.dlqSize.WithLabelValues(c).Set(float64(n))
	}
	dc := g.cfg.DeadLetters
	alert := (dc.AlertThreshold > 0 && len(all) >= dc.AlertThreshold) ||
		(dc.AlertGrowthPerHour > 0 && grewHour >= dc.AlertGrowthPerHour)
	m.mu.Lock()
	m.summary, m.total = summary, len(all)
	was := m.alerting
	m.alerting = alert
	notify := alert && (!was || g.now().Sub(m.lastNotify) >= time.Hour)
	if notify {
		m.lastNotify = g.now()
	}
	m.mu.Unlock()
	if alert {
		g.metrics.dlqAlert.Set(1)
	} else {
		g.metrics.dlqAlert.Set(0)
	}
	if notify {
		msg := fmt.Sprintf("llmgate: %d dead letters (%d new in the last hour). Top cause: %s. See /admin/ to replay them after a fix.",
			len(all), grewHour, topCause(summary))
		g.log.Error("dead letter queue over its alert threshold", "dead_letters", len(all), "last_hour", grewHour,
			"threshold", dc.AlertThreshold, "growth_threshold", dc.AlertGrowthPerHour)
		if dc.WebhookURL != "" {
			go m.notify(msg)
		}
	} else if was && !alert {
		g.log.Info("dead letter queue back under its alert threshold", "dead_letters", len(all))
	}
}

// notify POSTs a Slack-compatible {"text": ...} alert once, with its own
// timeout. A failed POST is logged, not retried.
func (m *dlqMonitor) notify(text string) {
	body, _ := json.Marshal(map[string]string{"text": text})
	req, err := http.NewRequest(http.MethodPost, m.g.cfg.DeadLetters.WebhookURL, bytes.NewReader(body))
	if err != nil {
		m.g.log.Error("dead letter webhook", "err", err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := m.client.Do(req)
	if err != nil {
		// The URL may carry a token (Slack puts it in the path): log the
		// error's kind only.
		m.g.log.Error("dead letter webhook failed", "err", errors.Unwrap(err))
		return
	}
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		m.g.log.Error("dead letter webhook refused the alert", "status", res.StatusCode)
	}
}

func topCause(s []dlqGroup) string {
	if len(s) == 0 {
		return "none"
	}
	return fmt.Sprintf("%s on %s (%d)", s[0].Class, s[0].Upstream, s[0].Count)
}

// groupDeadLetters counts dead letters by (upstream, class) — "group by
// root cause" — largest group first. A request that tried several
// upstreams counts under its last one.
func groupDeadLetters(ds []cache.DeadLetter) []dlqGroup {
	counts := map[[2]string]int{}
	for _, d := range ds {
		up := ""
		if len(d.Upstreams) > 0 {
			up = d.Upstreams[len(d.Upstreams)-1]
		}
		counts[[2]string{up, d.Class}]++
	}
	out := make([]dlqGroup, 0, len(counts))
	for k, n := range counts {
		out = append(out, dlqGroup{Upstream: k[0], Class: k[1], Count: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Upstream+out[i].Class < out[j].Upstream+out[j].Class
	})
	return out
}

// deadLetterView is a dead letter in the admin API, its body as text.
type deadLetterView struct {
	cache.DeadLetter
	Body string `json:"body,omitempty"`
}

func (g *Gateway) adminListDeadLetters(c echo.Context) error {
	f := cache.DeadLetterFilter{Upstream: c.QueryParam("upstream"), Class: c.QueryParam("class"), Client: c.QueryParam("client")}
	all, err := g.store.ListDeadLetters(c.Request().Context(), f)
	if err != nil {
		return errStore(err)
	}
	limit, offset := 50, 0
	if v, err := strconv.Atoi(c.QueryParam("limit")); err == nil && v > 0 && v <= 1000 {
		limit = v
	}
	if v, err := strconv.Atoi(c.QueryParam("offset")); err == nil && v >= 0 {
		offset = v
	}
	page := all[min(offset, len(all)):min(offset+limit, len(all))]
	resp := map[string]any{
		"dead_letters": page,
		"total":        len(all),
		"summary":      groupDeadLetters(all),
	}
	if offset+limit < len(all) {
		resp["next_offset"] = offset + limit
	}
	return c.JSON(http.StatusOK, resp)
}

func (g *Gateway) adminGetDeadLetter(c echo.Context) error {
	d, err := g.store.GetDeadLetter(c.Request().Context(), c.Param("id"))
	if errors.Is(err, cache.ErrNotFound) {
		return errNoDeadLetter()
	}
	if err != nil {
		return errStore(err)
	}
	return c.JSON(http.StatusOK, deadLetterView{DeadLetter: *d, Body: string(d.Body)})
}

func errNoDeadLetter() *apiError {
	return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "dead_letter_not_found", Message: "No dead letter with this id."}
}

func (g *Gateway) adminDeleteDeadLetter(c echo.Context) error {
	err := g.store.DeleteDeadLetter(c.Request().Context(), c.Param("id"))
	if errors.Is(err, cache.ErrNotFound) {
		return errNoDeadLetter()
	}
	if err != nil {
		return errStore(err)
	}
	g.dlq.poke()
	return c.JSON(http.StatusOK, map[string]int{"deleted": 1})
}

type replayResult struct {
	ID       string `json:"id"`
	Status   int    `json:"status"`
	Replayed bool   `json:"already_committed"`
	Error    string `json:"error,omitempty"`
}

func (g *Gateway) adminReplayDeadLetter(c echo.Context) error {
	d, err := g.store.GetDeadLetter(c.Request().Context(), c.Param("id"))
	if errors.Is(err, cache.ErrNotFound) {
		return errNoDeadLetter()
	}
	if err != nil {
		return errStore(err)
	}
	return c.JSON(http.StatusOK, g.replayDeadLetter(c.Request().Context(), d))
}

// adminReplayGroup replays every dead letter matching upstream/class/client,
// at most dead_letters.replay_per_second, so a group replay after a fix does
// not become the next outage.
func (g *Gateway) adminReplayGroup(c echo.Context) error {
	f := cache.DeadLetterFilter{Upstream: c.QueryParam("upstream"), Class: c.QueryParam("class"), Client: c.QueryParam("client")}
	if f == (cache.DeadLetterFilter{}) {
		return errInvalid("upstream", "Name the group to replay with upstream=, class= and/or client=.")
	}
	ctx := c.Request().Context()
	list, err := g.store.ListDeadLetters(ctx, f)
	if err != nil {
		return errStore(err)
	}
	if len(list) > 1000 {
		list = list[:1000]
	}
	every := time.Duration(float64(time.Second) / g.cfg.DeadLetters.ReplayPerSecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	results := make([]replayResult, 0, len(list))
	ok := 0
	for i, d := range list {
		if i > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
		}
		full, err := g.store.GetDeadLetter(ctx, d.ID)
		if err != nil {
			continue // resolved meanwhile
		}
		r := g.replayDeadLetter(ctx, full)
		if r.Status >= 200 && r.Status <= 299 {
			ok++
		}
		results = append(results, r)
	}
	return c.JSON(http.StatusOK, map[string]any{"replayed": len(results), "succeeded": ok, "results": results})
}

type replayClientKey struct{}

// replayDeadLetter re-runs a dead letter's request under its original
// client and key through the normal path: on success the completion is
// committed under that key (and the dead letter resolved), so the client's
// next retry with its key gets the answer without another call.
func (g *Gateway) replayDeadLetter(ctx context.Context, d *cache.DeadLetter) replayResult {
	res := replayResult{ID: d.ID}
	if d.BodyTruncated {
		res.Error = "the stored body was truncated (dead_letters.max_body_bytes); it cannot be replayed"
		g.metrics.dlqReplays.WithLabelValues("refused").Inc()
		return res
	}
	ctx = context.WithValue(ctx, replayClientKey{}, d.Client)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.Endpoint, bytes.NewReader(d.Body))
	if err != nil {
		res.Error = err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", quoteKey(d.Key))
	w := &discardWriter{header: http.Header{}}
	g.echo.ServeHTTP(w, req)
	res.Status = w.status
	res.Replayed = w.header.Get("Idempotent-Replayed") == "true"
	result := "failed"
	if w.status >= 200 && w.status <= 299 {
		result = "succeeded"
		if res.Replayed {
			// The client's own retry got there first; nothing is left to do.
			_ = g.store.DeleteDeadLetter(ctx, d.ID)
		}
	}
	g.metrics.dlqReplays.WithLabelValues(result).Inc()
	g.log.Info("dead letter replayed", "id", d.ID, "client", d.Client, "status", w.status, "already_committed", res.Replayed)
	g.dlq.poke()
	return res
}

// quoteKey renders a key as an RFC 8941 sf-string, which parses back to it
// whatever characters it holds.
func quoteKey(k string) string {
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

// dlqMetrics are the dead-letter series.
type dlqMetrics struct {
	dlqSize     *prometheus.GaugeVec
	dlqAlert    prometheus.Gauge
	dlqReplays  *prometheus.CounterVec
	dlqRecorded *prometheus.CounterVec
}

func newDLQMetrics(reg prometheus.Registerer) dlqMetrics {
	m := dlqMetrics{
		dlqSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmgate_deadletters", Help: "Dead letters waiting, by final class.",
		}, []string{"class"}),
		dlqAlert: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmgate_deadletter_alert", Help: "1 while the dead-letter queue is over its alert threshold.",
		}),
		dlqReplays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_deadletter_replays_total", Help: "Dead-letter replays by result.",
		}, []string{"result"}),
		dlqRecorded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmgate_deadletters_recorded_total", Help: "Keyed requests recorded as dead letters, by final class.",
		}, []string{"class"}),
	}
	reg.MustRegister(m.dlqSize, m.dlqAlert, m.dlqReplays, m.dlqRecorded)
	return m
}
