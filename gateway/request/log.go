package request

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/metrics"
	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/tracing"
)

// summary is what a request's log line and metrics say. requestLog makes
// one per /v1 request and reads it in a defer; the route adapter (post)
// hands it to the handler, which notes what the rooms it called returned.
// Only the handler writes it, so a panic or an abort still leaves whatever
// it had noted for the log line.
type summary struct {
	endpoint  string
	model     string
	routed    bool
	upstream  string
	class     classify.Class
	attempts  int
	idemKey   string // hashed, never the key itself
	idemEvent string // what the claim came to (tracing.Request.IdempotencyEvent)
	keySource string // "derived" for a key derived from a session header, else ""
	replayed  bool
	cache     string
	committed string
}

const summaryKey = "llmgate.summary"

// RequestLog assigns the request id and, for /v1, writes one structured
// line per request plus its metrics, in a defer: a request whose response
// was aborted (http.ErrAbortHandler) is logged and counted too.
func (g *Handler) RequestLog(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := g.now()
		r := c.Request()
		id := requestID(r)
		c.Response().Header().Set("X-Llmgate-Request-Id", id)
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			return next(c)
		}
		g.metrics.Inflight.Inc()
		s := &summary{}
		c.Set(summaryKey, s)
		r, span := g.tracer.Start(r, c.Path())
		c.SetRequest(withRouteAPI(r, c.Path()))
		var err error
		defer func() {
			g.metrics.Inflight.Dec()
			p := recover()
			end := requestEnd{id: id, err: err, aborted: p != nil, duration: g.now().Sub(start)}
			class := g.logRequest(c, s, end)
			if span != nil {
				tracing.End(span, s.span(c, end, class))
			}
			if p != nil {
				panic(p)
			}
		}()
		if err = next(c); err != nil {
			c.Error(err)
		}
		return nil
	}
}

// requestEnd is how a /v1 request ended, as requestLog's defer saw it.
type requestEnd struct {
	id       string // the request id
	err      error  // what the handler returned, if anything
	aborted  bool   // the handler panicked (http.ErrAbortHandler included)
	duration time.Duration
}

// logRequest writes the request's line and counts it, and returns the
// class it logged.
func (g *Handler) logRequest(c echo.Context, s *summary, end requestEnd) classify.Class {
	r, err, aborted, d := c.Request(), end.err, end.aborted, end.duration
	status := c.Response().Status
	class := s.class
	switch {
	case class == "" && err != nil:
		class = outcome.ErrorClass(err)
	case class == "":
		class = classify.Success
	}
	level := slog.LevelInfo
	if status >= 500 || aborted {
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("request_id", end.id),
		slog.String("method", cut(r.Method, maxLoggedMethod)),
		slog.String("path", LogPath(r.URL.Path)),
		slog.String("client", ClientOf(r)),
		slog.String("model", s.model),
		slog.String("upstream", s.upstream),
		slog.Int("status", status),
		slog.String("class", string(class)),
		slog.Int("attempts", s.attempts),
		slog.Duration("duration", d),
	}
	if s.idemKey != "" {
		attrs = append(attrs, slog.String("idempotency_key", s.idemKey), slog.Bool("replayed", s.replayed))
	}
	if s.keySource != "" {
		attrs = append(attrs, slog.String("idempotency_key_source", s.keySource))
	}
	if s.cache != "" {
		attrs = append(attrs, slog.String("cache", s.cache))
	}
	if s.committed != "" {
		attrs = append(attrs, slog.String("committed", s.committed))
	}
	if aborted {
		attrs = append(attrs, slog.Bool("aborted", true))
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		// What the client was told, and the cause behind it (echo's own
		// errors as echo says them).
		logged := err
		if he := (*echo.HTTPError)(nil); !errors.As(err, &he) {
			logged = apierror.Wire(err)
		}
		attrs = append(attrs, slog.String("err", cut(logged.Error(), maxLoggedErr)))
	}
	g.log.LogAttrs(context.Background(), level, "request", attrs...)
	if s.endpoint != "" {
		model := g.metrics.ModelLabel(ClientOf(r), s.model, s.routed, status >= 200 && status < 300)
		up := s.upstream
		if up == "" {
			up = "none"
		}
		g.metrics.Request(metrics.RequestDone{Endpoint: s.endpoint, Model: model, Upstream: up,
			Status: status, Outcome: string(class), Duration: d})
		// The retries the answering upstream took; an upstream the request
		// fell back from counts its own in llmgate_upstream_retries_total.
		g.timeline.Request(s.upstream, string(class), d, s.attempts-1)
	}
	return class
}

// span is what the request's span records: what its log line says.
func (s *summary) span(c echo.Context, end requestEnd, class classify.Class) tracing.Request {
	return tracing.Request{RequestID: end.id, Client: ClientOf(c.Request()), Model: s.model, Upstream: s.upstream,
		Status: c.Response().Status, Class: string(class), Attempts: s.attempts, IdempotencyKeyHash: s.idemKey,
		IdempotencyEvent: s.idemEvent, Cache: s.cache, Aborted: end.aborted}
}

// post adapts a handler of plain net/http types to echo, giving it the
// request's summary.
func (g *Handler) post(h func(w http.ResponseWriter, r *http.Request, s *summary) error) echo.HandlerFunc {
	return func(c echo.Context) error {
		s, ok := c.Get(summaryKey).(*summary)
		if !ok {
			s = &summary{}
		}
		return h(c.Response(), c.Request(), s)
	}
}

// requestID takes a client's X-Request-Id when it is short and tame, else
// makes one.
func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 {
		ok := true
		for i := 0; i < len(id); i++ {
			if c := id[i]; c < 0x21 || c > 0x7e {
				ok = false
				break
			}
		}
		if ok {
			return id
		}
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// What a log line keeps of what a client sent or an error echoes: a path
// may carry an object id up to the header limit (64 KiB), a method
// anything up to it, and an error may quote an id from a body (500 KB) or
// a multipart part's header; one tenant's requests must not write log
// lines that long.
const (
	maxLoggedPath   = 512
	maxLoggedMethod = 32
	maxLoggedErr    = 2 << 10
)

// LogPath is path as a log line keeps it: whole up to 512 bytes, else its
// first 512 and its length.
func LogPath(path string) string { return cut(path, maxLoggedPath) }

// cut is s whole up to n bytes, else its first n and its length; a
// character the limit would split is left out whole.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && i > n-utf8.UTFMax && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}
