package demo

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxBodyBytes bounds what one request may upload; larger bodies get 413.
const maxBodyBytes = 32 << 20

// rateLimitRequests is the request budget advertised in x-ratelimit-* headers.
const rateLimitRequests = 10000

type endpoint int

const (
	notFound endpoint = iota
	chatCompletions
	completions
	embeddings
	listModels
	getModel
	createResponse
	responseByID // GET/DELETE /v1/responses/{id}, .../cancel, .../input_items
)

func route(method, path string) endpoint {
	switch {
	case method == http.MethodPost && path == "/v1/chat/completions":
		return chatCompletions
	case method == http.MethodPost && path == "/v1/completions":
		return completions
	case method == http.MethodPost && path == "/v1/embeddings":
		return embeddings
	case method == http.MethodGet && path == "/v1/models":
		return listModels
	case method == http.MethodGet && strings.HasPrefix(path, "/v1/models/") && len(path) > len("/v1/models/"):
		return getModel
	case method == http.MethodPost && path == "/v1/responses":
		return createResponse
	}
	if rest, ok := strings.CutPrefix(path, "/v1/responses/"); ok {
		if _, _, ok := storedResponseRoute(method, rest); ok {
			return responseByID
		}
	}
	return notFound
}

// scripted reports whether requests to e consume a Step.
func (e endpoint) scripted() bool {
	return e == chatCompletions || e == completions || e == embeddings || e == createResponse
}

// ServeHTTP tells the Script of the request, then answers it as its Step
// says.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	// Read the whole body before telling the Script, so it sees it byte for byte,
	// even for requests that will hang.
	body, readErr := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	ep := route(r.Method, r.URL.Path)
	authorized := s.authorized(r)
	var st Step
	if authorized && ep.scripted() {
		var demo bool
		if st, demo = s.demoStep(body); !demo && s.opts.Script != nil {
			st = s.opts.Script.Next()
		}
	}
	if s.opts.Script != nil {
		s.opts.Script.Arrived(Request{
			Method: r.Method,
			Path:   r.URL.Path,
			Header: r.Header.Clone(),
			Body:   body,
			At:     start,
			Step:   st,
		})
	}
	call := int(s.calls.Add(1))

	x := &exchange{
		s:     s,
		w:     w,
		r:     r,
		rc:    http.NewResponseController(w),
		step:  st,
		start: start,
		call:  call,
		left:  -1,
	}
	if st.ResetAfter > 0 {
		x.left = st.ResetAfter
	}
	if err := x.serve(ep, body, readErr, authorized); errors.Is(err, errAbort) {
		// The standard way to drop a connection mid-response; net/http does
		// not log it.
		panic(http.ErrAbortHandler)
	}
}

// exchange is one request being answered.
type exchange struct {
	s     *Server
	w     http.ResponseWriter
	r     *http.Request
	rc    *http.ResponseController
	step  Step
	start time.Time
	call  int // arrival number, for the rate-limit headers
	left  int // body bytes still allowed before a ResetAfter reset; -1 = no limit
}

// serve answers the request. Errors only say how the exchange ended: the
// client went away, the connection was reset on purpose, or (errAbort) it
// must be dropped.
func (x *exchange) serve(ep endpoint, body []byte, readErr error, authorized bool) error {
	if readErr != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](readErr); ok {
			return x.writeError(http.StatusRequestEntityTooLarge, apiError{
				Message: fmt.Sprintf("Request body is larger than %d bytes.", maxBodyBytes),
				Type:    "invalid_request_error",
			})
		}
		return readErr // the client went away mid-upload
	}
	ctx := x.r.Context()
	st := x.step
	if st.Hang {
		return x.s.hang(ctx)
	}
	delay := st.Delay
	if delay <= 0 {
		delay = x.s.opts.Latency
	}
	if err := x.s.pause(ctx, delay); err != nil {
		return err
	}
	if st.Reset {
		return x.reset()
	}

	switch {
	case !authorized:
		msg := "Incorrect API key provided."
		if x.r.Header.Get("Authorization") == "" {
			msg = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
		}
		return x.writeError(http.StatusUnauthorized, apiError{Message: msg, Type: "invalid_request_error", Code: "invalid_api_key"})
	case ep == notFound:
		return x.writeError(http.StatusNotFound, apiError{
			Message: fmt.Sprintf("Invalid URL (%s %s)", x.r.Method, x.r.URL.Path),
			Type:    "invalid_request_error",
		})
	case ep == listModels:
		return x.models()
	case ep == getModel:
		return x.model(strings.TrimPrefix(x.r.URL.Path, "/v1/models/"))
	case ep == responseByID:
		op, id, _ := storedResponseRoute(x.r.Method, strings.TrimPrefix(x.r.URL.Path, "/v1/responses/"))
		return x.storedResponse(op, id)
	case (st.Status != 0 && st.Status != http.StatusOK) || st.Body != "":
		return x.scripted(body)
	case ep == chatCompletions:
		return x.chat(body)
	case ep == completions:
		return x.completion(body)
	case ep == createResponse:
		return x.responses(body)
	default:
		return x.embeddings(body)
	}
}

// scripted writes a Step's Status and Body, or the error object they imply.
func (x *exchange) scripted(reqBody []byte) error {
	st := x.step
	status := st.Status
	if status == 0 {
		status = http.StatusOK
	}
	if st.Body == "" && status >= 400 {
		return x.writeError(status, statusError(status, st.ErrType, st.ErrCode))
	}
	contentType := "application/json"
	var req struct {
		Stream bool `json:"stream"`
	}
	if status < 400 && json.Unmarshal(reqBody, &req) == nil && req.Stream {
		contentType = "text/event-stream"
	}
	return x.respond(status, contentType, []byte(st.Body))
}

// apiError is the body of OpenAI's error object.
type apiError struct {
	Message string
	Type    string
	Param   string
	Code    string
}

func (e apiError) MarshalJSON() ([]byte, error) {
	type body struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	b := body{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		b.Param = &e.Param
	}
	if e.Code != "" {
		b.Code = &e.Code
	}
	return json.Marshal(struct {
		Error body `json:"error"`
	}{b})
}

// statusError is the error a real provider sends with status, unless
// errType or errCode say otherwise.
func statusError(status int, errType, errCode string) apiError {
	e := apiError{
		Message: fmt.Sprintf("llmgate fake upstream: scripted HTTP %d %s.", status, http.StatusText(status)),
		Type:    errType,
		Code:    errCode,
	}
	var typ, code string
	switch {
	case status == http.StatusUnauthorized:
		typ, code = "invalid_request_error", "invalid_api_key"
	case status == http.StatusForbidden:
		typ, code = "invalid_request_error", "unsupported_country_region_territory"
	case status == http.StatusTooManyRequests:
		typ, code = "requests", "rate_limit_exceeded"
	case status >= 500:
		typ = "server_error"
	default:
		typ = "invalid_request_error"
	}
	if e.Type == "" {
		e.Type = typ
	}
	if e.Code == "" {
		e.Code = code
	}
	return e
}

func (x *exchange) badRequest(param, format string, args ...any) error {
	return x.writeError(http.StatusBadRequest, apiError{
		Message: fmt.Sprintf(format, args...),
		Type:    "invalid_request_error",
		Param:   param,
	})
}

func (x *exchange) writeError(status int, e apiError) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return x.respond(status, "application/json", b)
}

func (x *exchange) writeJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return x.respond(http.StatusOK, "application/json", b)
}

// respond writes a whole, non-streamed response.
func (x *exchange) respond(status int, contentType string, body []byte) error {
	// Content-Length is the whole body even when ResetAfter truncates it,
	// so the client knows it was cut short.
	x.w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	x.writeHeader(status, contentType)
	if err := x.write(body); err != nil {
		return err
	}
	if x.left >= 0 {
		// ResetAfter is at least the body: the body went through whole,
		// and the connection is still reset after it.
		if err := x.flush(); err != nil {
			return err
		}
		return x.reset()
	}
	return nil
}

// writeHeader sets the headers every answer carries, then the Step's, and
// writes the status line.
func (x *exchange) writeHeader(status int, contentType string) {
	h := x.w.Header()
	h.Set("Content-Type", contentType)
	h.Set("X-Request-Id", "req_"+randHex()+randHex())
	h.Set("Openai-Processing-Ms", strconv.FormatInt(time.Since(x.start).Milliseconds(), 10))
	h.Set("X-Ratelimit-Limit-Requests", strconv.Itoa(rateLimitRequests))
	h.Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(rateLimitRequests-1-(x.call-1)%rateLimitRequests))
	for k, v := range x.step.Header {
		h.Set(k, v)
	}
	x.w.WriteHeader(status)
}

// errTruncated ends an exchange whose connection ResetAfter reset.
var errTruncated = errors.New("demo: connection reset after ResetAfter bytes")

// write writes body bytes, resetting the connection once ResetAfter bytes
// have gone out.
func (x *exchange) write(p []byte) error {
	if x.left >= 0 && len(p) >= x.left {
		if _, err := x.w.Write(p[:x.left]); err != nil {
			return err
		}
		x.left = 0
		if err := x.flush(); err != nil {
			return err
		}
		if err := x.reset(); err != nil {
			return err
		}
		return errTruncated
	}
	if x.left > 0 {
		x.left -= len(p)
	}
	_, err := x.w.Write(p)
	return err
}

// flush sends what was written so far to the client. A ResponseWriter that
// cannot flush (a test recorder, say) just buffers.
func (x *exchange) flush() error {
	if err := x.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

// reset closes the connection abruptly: SO_LINGER 0 makes Close send a TCP
// RST instead of a FIN, which the client sees as ECONNRESET (or EOF if it
// was not reading yet).
func (x *exchange) reset() error {
	conn, _, err := x.rc.Hijack()
	if err != nil {
		// HTTP/2 cannot hijack; aborting the handler resets the stream.
		return errAbort
	}
	if nc, ok := conn.(interface{ NetConn() net.Conn }); ok { // TLS
		conn = nc.NetConn()
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	return conn.Close()
}

// newID returns prefix-<counter>-<random hex>: unique per answer, so tests
// can tell two upstream calls apart.
func (s *Server) newID(prefix string) string {
	return prefix + "-" + strconv.FormatUint(s.seq.Add(1), 10) + "-" + randHex()
}

func randHex() string {
	return fmt.Sprintf("%016x", rand.Uint64())
}
