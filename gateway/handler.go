package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	openai "github.com/sashabaranov/go-openai"

	"github.com/llmgate/llmgate/classify"
)

// reqInfo collects what the request's log line and metrics say.
type reqInfo struct {
	id        string
	client    string
	endpoint  string
	model     string
	routed    bool
	upstream  string
	outcome   string
	attempts  int
	idemKey   string // hashed, never the key itself
	replayed  bool
	cache     string
	err       error
	committed string
}

const infoCtxKey = "llmgate.info"

func infoOf(c echo.Context) *reqInfo {
	i, _ := c.Get(infoCtxKey).(*reqInfo)
	return i
}

// requestLog assigns the request id and writes one structured line per
// request, plus its metrics.
func (g *Gateway) requestLog(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := g.now()
		r := c.Request()
		info := &reqInfo{id: requestID(r)}
		c.Set(infoCtxKey, info)
		c.Response().Header().Set("X-Llmgate-Request-Id", info.id)
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			return next(c)
		}
		g.metrics.inflight.Inc()
		defer g.metrics.inflight.Dec()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		d := g.now().Sub(start)
		status := c.Response().Status
		if info.outcome == "" {
			info.outcome = string(classify.Success)
		}
		level := slog.LevelInfo
		if status >= 500 {
			level = slog.LevelWarn
		}
		attrs := []slog.Attr{
			slog.String("request_id", info.id),
			slog.String("method", r.Method),
			slog.String("path", r.URL.Path),
			slog.String("client", info.client),
			slog.String("model", info.model),
			slog.String("upstream", info.upstream),
			slog.Int("status", status),
			slog.String("class", info.outcome),
			slog.Int("attempts", info.attempts),
			slog.Duration("duration", d),
		}
		if info.idemKey != "" {
			attrs = append(attrs, slog.String("idempotency_key", info.idemKey), slog.Bool("replayed", info.replayed))
		}
		if info.cache != "" {
			attrs = append(attrs, slog.String("cache", info.cache))
		}
		if info.committed != "" {
			attrs = append(attrs, slog.String("committed", info.committed))
		}
		if info.err != nil && !errors.Is(info.err, context.Canceled) {
			attrs = append(attrs, slog.Any("err", info.err))
		}
		g.log.LogAttrs(context.Background(), level, "request", attrs...)
		if info.endpoint != "" {
			model := g.metrics.modelLabel(info.model, info.routed, status >= 200 && status < 300)
			up := info.upstream
			if up == "" {
				up = "none"
			}
			g.metrics.request(info.endpoint, model, up, status, info.outcome, d)
		}
		return nil
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

// readBody reads the request body up to limit bytes.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, errTooLarge(limit)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error",
			Message: "Could not read the request body.", Err: err}
	}
	if int64(len(body)) > limit {
		return nil, errTooLarge(limit)
	}
	return body, nil
}

func errTooLarge(limit int64) *apiError {
	return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
		Message: fmt.Sprintf("Request body exceeds the gateway's limit of %d bytes.", limit)}
}

// parseRequest reads, validates and routes a POST body.
func (g *Gateway) parseRequest(r *http.Request) ([]byte, routing, *upstream, error) {
	body, err := readBody(r, g.cfg.Limits.MaxBodyBytes)
	if err != nil {
		return nil, routing{}, nil, err
	}
	rt, err := parseRouting(body, g.cfg.Limits.MaxJSONDepth)
	if err != nil {
		var fe *fieldError
		if errors.As(err, &fe) {
			e := errInvalid(fe.Param, fe.Msg+".")
			e.Code = fe.Code
			return nil, rt, nil, e
		}
		if errors.Is(err, errDepth) {
			return nil, rt, nil, errInvalid("", fmt.Sprintf("The request body is nested more than %d levels deep.", g.cfg.Limits.MaxJSONDepth))
		}
		return nil, rt, nil, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_json",
			Message: "We could not parse the JSON body of your request: " + err.Error() + ".", Err: err}
	}
	if rt.Model == "" {
		return nil, rt, nil, errInvalid("model", "You must provide a model parameter.")
	}
	u := g.router.route(rt.Model)
	if u == nil {
		return nil, rt, nil, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
			Message: fmt.Sprintf("The model `%s` is not served by this gateway: no configured upstream lists it.", rt.Model)}
	}
	return body, rt, u, nil
}

// DeadlineHeader lets a client shorten the configured total deadline for
// one request: a Go duration ("30s") or a number of seconds ("30").
const DeadlineHeader = "X-Llmgate-Deadline"

func (g *Gateway) deadline(r *http.Request, start time.Time) (time.Time, error) {
	d := g.cfg.Retry.Deadline.D()
	if h := r.Header.Get(DeadlineHeader); h != "" {
		v, err := time.ParseDuration(h)
		if err != nil {
			secs, err2 := strconv.ParseFloat(h, 64)
			if err2 != nil || secs <= 0 || secs > 1e6 {
				return time.Time{}, errInvalid("", DeadlineHeader+" must be a duration such as 30s or a number of seconds.")
			}
			v = time.Duration(secs * float64(time.Second))
		}
		if v <= 0 {
			return time.Time{}, errInvalid("", DeadlineHeader+" must be positive.")
		}
		if d <= 0 || v < d {
			d = v
		}
	}
	if d <= 0 {
		return time.Time{}, nil
	}
	return start.Add(d), nil
}

func (g *Gateway) handlePost(ep endpoint) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		info := infoOf(c)
		info.endpoint = ep.label
		start := g.now()
		body, rt, u, err := g.parseRequest(r)
		info.model = rt.Model
		if err != nil {
			return err
		}
		info.routed = true
		info.upstream = u.cfg.Name
		deadline, err := g.deadline(r, start)
		if err != nil {
			return err
		}
		cl := &call{in: r, ep: ep, body: body, rt: rt, deadline: deadline}
		kr, err := g.keyFor(c, ep, u, body)
		if err != nil {
			return err
		}
		if kr != nil {
			return g.serveKeyed(c, cl, u, kr)
		}
		return g.runUnkeyed(c, cl, u)
	}
}

// note records a response's upstream and outcome for the log line.
func (g *Gateway) note(info *reqInfo, resp *response) {
	info.upstream = resp.upstream.cfg.Name
	info.outcome = string(resp.outcome.Class)
	info.attempts = resp.attempts
}

// setGatewayHeaders adds the headers llmgate itself contributes.
func setGatewayHeaders(h http.Header, upstream string, o classify.Outcome) {
	h.Set("X-Llmgate-Upstream", upstream)
	if o.Class != classify.Success && o.Class != "" {
		h.Set("X-Llmgate-Outcome", string(o.Class))
	}
}

// writeResponse sends a buffered (or prefix-buffered) upstream response or,
// when no upstream produced one, maps the transport failure to 502/504.
func (g *Gateway) writeResponse(c echo.Context, resp *response) error {
	if resp.status == 0 {
		return transportError(resp)
	}
	w := c.Response()
	h := w.Header()
	for k, v := range resp.header {
		h[k] = v
	}
	setGatewayHeaders(h, resp.upstream.cfg.Name, resp.outcome)
	if resp.status < 200 || resp.status > 299 || (resp.rest == nil && !committable(resp.outcome)) {
		// The gateway already retried what was worth retrying.
		h.Set("X-Should-Retry", "false")
	}
	if resp.rest == nil {
		h.Set("Content-Length", strconv.Itoa(len(resp.body)))
	}
	w.WriteHeader(resp.status)
	_, _ = w.Write(resp.body)
	if resp.rest != nil {
		defer resp.rest.Close()
		if _, err := io.Copy(w, resp.rest); err != nil {
			// Headers are sent: abort, so the client sees a cut response
			// rather than a short one that looks complete.
			panic(http.ErrAbortHandler)
		}
	}
	return nil
}

// transportError is the client's answer when no upstream responded.
func transportError(resp *response) *apiError {
	o := resp.outcome
	if o.Timeout {
		return &apiError{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "upstream_timeout",
			Message: fmt.Sprintf("Upstream %s timed out.", resp.upstream.cfg.Name), Err: errors.New(o.Reason)}
	}
	if o.Class == classify.Canceled {
		return &apiError{Status: 499, Type: "invalid_request_error", Code: "client_closed_request",
			Message: "The client closed the request.", Err: context.Canceled}
	}
	return &apiError{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unreachable",
		Message: fmt.Sprintf("Upstream %s could not be reached (%s).", resp.upstream.cfg.Name, o.Reason), Err: errors.New(o.Reason)}
}

// handleModels merges GET /models from every upstream; an upstream that
// fails is left out (and logged) unless all fail.
func (g *Gateway) handleModels(c echo.Context) error {
	type result struct {
		models []openai.Model
		err    error
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), 30*time.Second)
	defer cancel()
	results := make([]result, len(g.router.upstreams))
	var wg sync.WaitGroup
	for i, u := range g.router.upstreams {
		wg.Go(func() {
			results[i].models, results[i].err = u.listModels(ctx, c.Request())
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	out := openai.ModelsList{Models: []openai.Model{}}
	var errs []error
	for i, r := range results {
		if r.err != nil {
			g.log.Warn("listing models failed", "upstream", g.router.upstreams[i].cfg.Name, "err", r.err)
			errs = append(errs, r.err)
			continue
		}
		for _, m := range r.models {
			if !seen[m.ID] {
				seen[m.ID] = true
				out.Models = append(out.Models, m)
			}
		}
	}
	if len(errs) == len(results) && len(results) > 0 {
		return &apiError{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unreachable",
			Message: "No upstream answered the models list.", Err: errors.Join(errs...)}
	}
	sort.Slice(out.Models, func(i, j int) bool { return out.Models[i].ID < out.Models[j].ID })
	body, _ := json.Marshal(struct {
		Object string         `json:"object"`
		Data   []openai.Model `json:"data"`
	}{"list", out.Models})
	return c.JSONBlob(http.StatusOK, body)
}

func (u *upstream) listModels(ctx context.Context, in *http.Request) ([]openai.Model, error) {
	ctx, cancel := context.WithTimeout(ctx, min(u.timeout, 30*time.Second))
	defer cancel()
	req, err := u.newUpstreamRequest(ctx, in, "/models", nil, "")
	if err != nil {
		return nil, err
	}
	res, err := u.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("upstream %s: GET /models: status %d", u.cfg.Name, res.StatusCode)
	}
	var list struct {
		Data []openai.Model `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 16<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("upstream %s: GET /models: %w", u.cfg.Name, err)
	}
	return list.Data, nil
}
