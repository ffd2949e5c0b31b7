package proxy

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/headers"
	"github.com/llmgate/llmgate/gateway/sse"
	"github.com/llmgate/llmgate/gateway/tracing"
)

// maxErrorBody bounds what is read of an upstream error response.
const maxErrorBody = 1 << 20

// attempt sends one request to u. It never retries.
func (p *Proxy) attempt(ctx context.Context, c *Call, hop Hop) *Response {
	u := hop.Upstream
	resp := &Response{Upstream: u, Hop: hop}
	actx, cancel := context.WithCancelCause(ctx)
	// One timer bounds the attempt until its response (for a stream, its
	// first event) and then, for a stream, the gap between events.
	timer := time.AfterFunc(u.timeout, func() { cancel(errAttemptTimeout) })
	// The key as it goes out: net/http trims a header value's surrounding
	// whitespace, and an upstream quotes what it received.
	a := &inAttempt{resp: resp, ctx: ctx, actx: actx, cancel: cancel, timer: timer, key: newSecret(strings.TrimSpace(hop.key))}
	body, n, err := c.body()
	if err != nil {
		return a.fail(err)
	}
	if hop.body != nil {
		body, n = bytes.NewReader(hop.body), int64(len(hop.body))
	}
	req, err := u.newUpstreamRequest(actx, c.In, outgoing{suffix: c.Suffix, query: c.Query, key: hop.key, idemKey: c.IdemKey}, body, n)
	if err != nil {
		return a.fail(err)
	}
	if c.Tenant != "" {
		req.Header.Set("X-Llmgate-Tenant", c.Tenant)
	}
	res, err := u.client.Do(req)
	if err != nil {
		// Before fail, which cancels actx: a cause now is the attempt's
		// timeout.
		conn := a.ctx.Err() == nil && context.Cause(a.actx) == nil && connectionLevel(err)
		resp = a.fail(err)
		resp.connFailure = conn
		return resp
	}
	resp.Status = res.StatusCode
	resp.billed = res.StatusCode >= 200 && res.StatusCode <= 299
	if failed := decodeBody(res); failed != "" {
		res.Body.Close()
		return a.failWith(classify.Outcome{Class: classify.Transient, Reason: failed})
	}
	resp.Header = headers.Response(res.Header)
	redactHeaderKey(resp.Header, a.key)
	if res.StatusCode < 200 || res.StatusCode > 299 {
		// Read past the limit by a key's longest form less one, so that a
		// key the upstream quotes across it is seen whole (cutRedacted).
		body, err := io.ReadAll(io.LimitReader(res.Body, maxErrorBody+int64(max(a.key.reach-1, 0))))
		res.Body.Close()
		if err != nil && len(body) == 0 {
			return a.fail(err)
		}
		a.end()
		resp.Body = redactDecoded(cutRedacted(body, maxErrorBody, a.key), a.key)
		resp.Outcome = classify.FromResponse(res.StatusCode, res.Header, resp.Body, p.now())
		return resp
	}
	if c.Stream && strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		return p.startStream(a, c.api(), res.Body)
	}
	return p.readBody(a, c, res.Body)
}

// decodeBody undoes a Content-Encoding the transport left on res: the
// transport asks for gzip and decodes "gzip", but an upstream may label it
// "x-gzip" (RFC 9110 takes the two for one), which is decoded here. Any
// other encoding was not asked for: relayed as it came, it would reach
// the client undecodable (its Content-Encoding is not relayed) and past
// the key's redaction. A 2xx in one is no answer (the reason is returned:
// the attempt fails); an error status keeps its status, without its body.
func decodeBody(res *http.Response) (failed string) {
	ce := strings.TrimSpace(res.Header.Get("Content-Encoding"))
	if ce == "" || strings.EqualFold(ce, "identity") {
		return ""
	}
	res.Header.Del("Content-Encoding")
	res.Header.Del("Content-Length")
	res.ContentLength = -1
	var zr *gzip.Reader
	var err error
	if strings.EqualFold(ce, "x-gzip") {
		zr, err = gzip.NewReader(res.Body)
	}
	switch {
	case zr != nil:
		res.Body = readCloser{zr, res.Body}
		return ""
	case errors.Is(err, io.EOF): // no body at all
	case res.StatusCode >= 200 && res.StatusCode <= 299:
		return fmt.Sprintf("a body in content encoding %.40q it could not decode", ce)
	}
	res.Body = readCloser{strings.NewReader(""), res.Body}
	return ""
}

// minRedactedKey is the shortest key redactKey looks for: a shorter one
// (a local server's "EMPTY" or "none") guards nothing, and replacing it
// could cut an ordinary word, even a JSON field name, out of the body.
const minRedactedKey = 8

// redactKey replaces every copy of key, the credential the attempt sent,
// in what an upstream answered with [redacted]: an error body, a buffered
// 2xx body, a stream's event. Some OpenAI-compatible servers quote the key
// they were sent in their errors (LiteLLM's proxy: "Received API Key =
// sk-…"), also in an error event of a 200 stream; the gateway's key must
// reach no client, log, record or dead letter. The rest is left as it
// came. A body relayed as it comes (unbuffered, or past its buffered
// prefix) goes through keyRedactor. A copy JSON-escaped (secret.esc) is
// replaced too.
func redactKey(body []byte, k secret) []byte {
	key := k.key
	if len(key) < minRedactedKey || len(body) < len(key) {
		return body
	}
	// A read-only view of body, not a copy of either: this runs on every
	// event of every stream ([]byte(key) would allocate for a key over 32
	// bytes).
	if strings.Contains(view(body), key) {
		body = bytes.ReplaceAll(body, []byte(key), redacted)
	}
	if k.esc != nil && bytes.IndexByte(body, '\\') >= 0 && k.esc.Match(body) {
		body = k.esc.ReplaceAllLiteral(body, redacted)
	}
	return body
}

// redacted is what replaces a copy of the key.
var redacted = []byte("[redacted]")

// view is b as a string, read-only, not copied: for searching it.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// redactHeaderKey is redactKey for the upstream headers the gateway
// relays and commits (an upstream may quote the key in x-request-id):
// every copy in a value is replaced. A value slice is copied before it
// changes, since h's share their arrays with the upstream response's.
func redactHeaderKey(h http.Header, k secret) {
	if len(k.key) < minRedactedKey {
		return
	}
	for name, vs := range h {
		cloned := false
		for i, v := range vs {
			if !strings.Contains(v, k.key) && (k.esc == nil || !k.esc.MatchString(v)) {
				continue
			}
			if !cloned {
				vs, cloned = slices.Clone(vs), true
				h[name] = vs
			}
			vs[i] = string(redactKey([]byte(v), k))
		}
	}
}

// cutRedacted is b cut to limit bytes with every copy of key in them
// replaced (redactKey). The cut never splits a copy of the key: one that
// starts before it is kept whole, to be replaced, so b must hold up to
// limit+reach-1 bytes where there are that many (reach: the key's longest
// written form, secret.reach). Cut first and
// redacted after, the first bytes of a key straddling the cut would pass.
func cutRedacted(b []byte, limit int, k secret) []byte {
	return redactKey(b[:cutEnd(b, limit, k)], k)
}

// cutEnd is where cutRedacted cuts b: at limit, or past it at the end of
// a copy of key that starts before it.
func cutEnd(b []byte, limit int, k secret) int {
	key := k.key
	end := min(len(b), limit)
	if len(key) >= minRedactedKey {
		// Only a copy that starts within a key's length of the cut can
		// straddle it (or one that overlaps such a copy).
		for from := max(0, end-len(key)+1); from < end; {
			i := strings.Index(view(b[from:]), key)
			if i < 0 || from+i >= end {
				break
			}
			end = max(end, from+i+len(key))
			from += i + 1
		}
		// The same for an escaped copy, up to its longest form.
		if k.esc != nil {
			from := max(0, end-k.reach+1)
			for _, m := range k.esc.FindAllIndex(b[from:], -1) {
				if from+m[0] >= end {
					break
				}
				end = max(end, from+m[1])
			}
		}
	}
	return end
}

// keyRedactor is redactKey for a body relayed as it comes: what it reads
// from r it returns with every copy of key replaced, holding back only
// an end of what it has that could begin a copy (keyStart) until more
// come or r ends, so that a copy split across reads is found whole and
// everything else goes out as it arrives.
type keyRedactor struct {
	r          io.Reader
	key        secret
	buf        []byte // buf[off:ready] may go out; buf[ready:] is held back
	off, ready int
	err        error
	empty      int // reads in a row that returned nothing and no error
}

func (k *keyRedactor) Read(p []byte) (int, error) {
	for k.off == k.ready {
		if k.err != nil {
			return 0, k.err
		}
		k.buf = append(k.buf[:0], k.buf[k.off:]...)
		k.off, k.ready = 0, 0
		if cap(k.buf)-len(k.buf) < 16<<10 {
			k.buf = slices.Grow(k.buf, 32<<10)
		}
		n, err := k.r.Read(k.buf[len(k.buf):cap(k.buf)])
		k.buf = redactKey(k.buf[:len(k.buf)+n], k.key)
		switch {
		case n > 0 || err != nil:
			k.empty = 0
		case k.empty < 99:
			k.empty++
		default:
			err = io.ErrNoProgress // as bufio gives up on a reader that never reads
		}
		k.err = err
		k.ready = len(k.buf)
		if err == nil {
			k.ready -= keyStart(k.buf, k.key)
		}
	}
	n := copy(p, k.buf[k.off:k.ready])
	k.off += n
	return n, nil
}

// keyStart is the length of the longest end of b, shorter than key,
// that key starts with (for a key with escaped forms, that one of them
// may start with: startsForm): the bytes that may be the first of a copy
// split across reads.
func keyStart(b []byte, k secret) int {
	key := k.key
	if k.esc != nil {
		for n := min(len(b), k.reach-1); n > 0; n-- {
			if startsForm(b[len(b)-n:], key) {
				return n
			}
		}
		return 0
	}
	for n := min(len(b), len(key)-1); n > 0; n-- {
		if string(b[len(b)-n:]) == key[:n] {
			return n
		}
	}
	return 0
}

// readCloser reads from one reader and closes another.
type readCloser struct {
	io.Reader
	io.Closer
}

// traced hands the attempt's span to the response: ended now, or, for a
// live stream, when the stream ends.
func (r *Response) traced(span tracing.Attempt) {
	if r.Stream != nil {
		r.Stream.span = span
		return
	}
	body := r.Body
	if r.Rest != nil {
		body = nil // a prefix: its usage is in the part not read yet
	}
	span.End(r.Status, r.Outcome, body)
}

// inAttempt is one attempt's context and timer, ended once.
type inAttempt struct {
	resp   *Response
	ctx    context.Context // the request's
	actx   context.Context // the attempt's
	cancel context.CancelCauseFunc
	timer  *time.Timer
	// key is the credential the attempt sent, which no answer relays
	// (redactKey).
	key secret
}

func (a *inAttempt) end() {
	a.timer.Stop()
	a.cancel(context.Canceled)
}

// fail ends the attempt with err classified; whatever status came before
// the failure is not the answer.
func (a *inAttempt) fail(err error) *Response {
	a.end()
	resp := a.resp
	resp.Status, resp.Header, resp.Body = 0, nil, nil
	if cause := context.Cause(a.actx); cause == errAttemptTimeout || cause == errIdleTimeout {
		err = cause
	}
	if a.ctx.Err() != nil {
		err = a.ctx.Err()
	}
	resp.Outcome = classify.FromError(err)
	return resp
}

// failWith ends a 2xx attempt with o, the failure its stream reported
// before any of it reached the client: a 2xx that is no answer, as a
// malformed body is (after the retries, the client gets 502
// upstream_bad_response, never the 200).
func (a *inAttempt) failWith(o classify.Outcome) *Response {
	a.end()
	resp := a.resp
	resp.Body = nil
	resp.Outcome = o
	resp.Outcome.Status = resp.Status
	return resp
}

// startStream waits for a stream's first event: until then the attempt can
// still be retried. For an API with a preamble, the first events that only
// announce the answer (Responses' response.created, response.in_progress;
// Messages' message_start, ping, content_block_start) are held back with
// the event after them: when that one is a retryable failure (an error
// event, response.failed with server_error), the client has seen nothing
// and the attempt is retried.
func (p *Proxy) startStream(a *inAttempt, api *API, body io.ReadCloser) *Response {
	up := &upstreamReads{r: body, timer: a.timer, idle: p.cfg.Limits.StreamIdleTimeout.D()}
	rd := sse.NewReader(up, p.maxEventBytes())
	var first [][]byte
	for {
		ev, err := rd.Next()
		if err != nil {
			body.Close()
			rd.Release()
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return a.fail(err)
		}
		first = append(first, redactKey(append([]byte(nil), ev...), a.key))
		if api.stream.preamble == nil || len(first) == maxPreamble || !api.stream.preamble(sse.Data(ev)) {
			break
		}
	}
	if api.stream.preamble != nil {
		if o, failed := failedStart(api, first); failed {
			body.Close()
			rd.Release()
			return a.failWith(o)
		}
	}
	resp := a.resp
	resp.Stream = &LiveStream{body: body, rd: rd, up: up, first: first, api: api,
		timer: a.timer, cancel: a.cancel, ctx: a.actx, drainWait: p.drainWait, key: a.key}
	resp.Outcome = classify.Outcome{Class: classify.Success, Status: resp.Status}
	return resp
}

// failedStart reports whether a stream's held-back start ends in a
// failure worth another attempt, and what it came to, as the API's own
// observer reads it.
func failedStart(api *API, first [][]byte) (classify.Outcome, bool) {
	var held observers
	obs := held.of(api.stream.observer)
	for _, ev := range first {
		obs.Observe(sse.Data(ev))
	}
	o := obs.Outcome()
	return o, obs.SawError() && o.Class.Retryable()
}

// readBody buffers a 2xx body up to the record limit and classifies it.
func (p *Proxy) readBody(a *inAttempt, c *Call, body io.ReadCloser) *Response {
	resp := a.resp
	limit := p.cfg.Idempotency.MaxRecordBytes
	switch {
	case c.Unbuffered:
		limit = 0 // relayed as it arrives, from its first byte
	case c.RecordLimit > 0:
		limit = c.RecordLimit
	}
	b, err := io.ReadAll(io.LimitReader(body, limit+1))
	if err != nil {
		body.Close()
		return a.fail(err)
	}
	if int64(len(b)) > limit {
		// Too large to buffer: relay the prefix and copy the rest as it
		// comes. It is not classified from its content, nor committed.
		// The prefix ends where no copy of the key straddles its end; the
		// rest, from there, is redacted as it streams (keyRedactor).
		resp.Body, resp.Rest = b, &cancelOnClose{ReadCloser: body, cancel: a.end}
		if len(a.key.key) >= minRedactedKey {
			end := cutEnd(b, max(0, len(b)-(a.key.reach-1)), a.key)
			resp.Body = redactKey(b[:end], a.key)
			rest := &keyRedactor{r: io.MultiReader(bytes.NewReader(b[end:]), body), key: a.key}
			resp.Rest = &cancelOnClose{ReadCloser: readCloser{rest, body}, cancel: a.end}
		}
		resp.Outcome = classify.Outcome{Class: classify.Success, Status: resp.Status}
		return resp
	}
	body.Close()
	a.end()
	resp.Body = redactKey(b, a.key)
	resp.Outcome = c.api().Classify(resp.Body, resp.Header, p.now())
	resp.Outcome.Status = resp.Status
	return resp
}

// maxEventBytes bounds one SSE event: one larger than a whole record could
// never be committed; it also bounds the memory one stream can pin.
func (p *Proxy) maxEventBytes() int {
	if m := p.cfg.Idempotency.MaxRecordBytes; m > 0 && m < 16<<20 {
		return int(m)
	}
	return 16 << 20
}

type cancelOnClose struct {
	io.ReadCloser
	cancel func()
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

var (
	errAttemptTimeout = timeoutError("upstream timed out")
	errIdleTimeout    = timeoutError("upstream stream idle timeout")
)

// timeoutError is a net.Error-shaped timeout, so classify sees a timeout.
type timeoutError string

func (e timeoutError) Error() string   { return string(e) }
func (e timeoutError) Timeout() bool   { return true }
func (e timeoutError) Temporary() bool { return true }

// connectionLevel reports whether err, from sending a request (no response
// came), is the connection's rather than the request's: the dial failed
// (refused, unreachable, DNS), TLS failed or timed out, or the connection
// closed before any response. Such a failure says the upstream as a whole
// is unreachable, whatever the model. The attempt's own timeout and the
// client's cancellation are not (the caller checks them first): a model
// that thinks too long says nothing of its neighbours.
func connectionLevel(err error) bool {
	var (
		opErr   *net.OpError
		dnsErr  *net.DNSError
		tlsRec  tls.RecordHeaderError
		tlsCert *tls.CertificateVerificationError
		tlsAl   tls.AlertError
		unkCA   x509.UnknownAuthorityError
		host    x509.HostnameError
		inval   x509.CertificateInvalidError
		ne      net.Error
	)
	switch {
	case errors.As(err, &opErr) && opErr.Op == "dial", errors.As(err, &dnsErr):
		return true
	case errors.As(err, &tlsRec), errors.As(err, &tlsCert), errors.As(err, &tlsAl),
		errors.As(err, &unkCA), errors.As(err, &host), errors.As(err, &inval):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		// With no response-header timeout on the transport, a timeout of
		// its own is the dial's or the TLS handshake's.
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return true // closed before any response
	}
	return false
}
