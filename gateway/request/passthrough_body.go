package request

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/llmgate/llmgate/gateway/admission"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/idempotency"
	"github.com/llmgate/llmgate/gateway/proxy"
)

// passBody is a passthrough request's body as read: where it is, the model
// it names, and its fingerprint.
type passBody struct {
	src         *proxy.Body
	json        []byte // the body, when it is JSON (held in memory)
	mediaType   string // its Content-Type's media type
	mem         []byte // a body not read as JSON or multipart, when held in memory
	once        bool   // streamed to the upstream unread
	model       string
	fingerprint string
	// fileIDs are the stored files a multipart form names by id
	// (images[][file_id]), for the ownership check.
	fileIDs []string
}

// readPassBody reads a passthrough body. A JSON body is held in memory, as
// chat's is (capped by limits.max_body_bytes, or the route's lower limit),
// and fingerprinted like chat's. Any other body (multipart, binary) is
// held in memory up to passthrough.memory_body_bytes and spooled to a file
// beyond, up to the route's max_body_bytes, so a retry resends it from
// the file; a multipart body is parsed on the way for its model field and
// fingerprinted over its parts. A body that declares more than
// passthrough.spool_max_bytes is not read first at all: it streams to the
// upstream once (keyed, it is refused: its fingerprint needs it whole).
func (g *Handler) readPassBody(r *http.Request, rt passRoute, keyed bool, held *admission.Reservation) (passBody, error) {
	if err := encodedBody(r); err != nil {
		return passBody{}, err
	}
	if r.ContentLength > rt.maxBody {
		return passBody{}, &apierror.TooLarge{Limit: rt.maxBody}
	}
	mt, params, err := idempotency.FormContentType(r.Header.Values("Content-Type"))
	if err != nil {
		return passBody{}, apierror.Invalid("", "The request's Content-Type: "+err.Error()+".")
	}
	if m := g.cfg.Passthrough.SpoolMaxBytes; m > 0 && r.ContentLength > m {
		if keyed {
			return passBody{}, &apierror.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
				Message: fmt.Sprintf("A request with an Idempotency-Key may be at most %d bytes here (passthrough.spool_max_bytes); send it without one.", m)}
		}
		return passBody{src: proxy.OnceBody(r.Body, r.ContentLength), mediaType: mt, once: true}, nil
	}
	if mt == "application/json" {
		return g.readPassJSON(r, rt, held)
	}
	// What is held in memory counts against limits.max_inflight_bytes (a
	// declared length is reserved before the body is read); what is
	// written to the file, against passthrough.spool_max_total_bytes.
	sp := &spool{dir: g.spoolDir(), mem: g.memoryBodyBytes(ClientOf(r)), ctx: r.Context(), memBound: g.admit, memHeld: held, disk: g.spooled,
		diskHeld: admission.Reservation{Client: ClientOf(r)}}
	if err := sp.reserve(max(r.ContentLength, 0)); err != nil {
		return passBody{}, refusal(err)
	}
	pb, err := readSpooled(r.Body, sp, rt.maxBody, mt, params["boundary"])
	if err != nil {
		sp.discard()
		return passBody{}, err
	}
	pb.mediaType = mt
	if sp.f == nil && mt != "multipart/form-data" {
		pb.mem = sp.buf.Bytes() // for the ownership check (owners.go, passBodyJSON)
	}
	return pb, nil
}

// readPassJSON reads and parses a JSON passthrough body.
func (g *Handler) readPassJSON(r *http.Request, rt passRoute, held *admission.Reservation) (passBody, error) {
	body, err := g.readBodyUpTo(r, held, min(rt.maxBody, g.cfg.Limits.MaxBodyBytes))
	if err != nil {
		return passBody{}, err
	}
	pb := passBody{src: proxy.MemoryBody(body), json: body}
	if len(body) == 0 {
		return pb, nil
	}
	rt2, err := parseRouting(body, g.cfg.Limits.MaxJSONDepth)
	if err != nil {
		return passBody{}, g.routingError(err)
	}
	pb.model = rt2.Model
	return pb, nil
}

// keyFingerprint is the body's fingerprint, for a keyed request: a JSON
// body's (an empty one's too) is taken only then (a 400 when over its
// bound); any other body's was taken as it was read. (A body streamed
// unread has none, and is never keyed.)
func (pb passBody) keyFingerprint() (string, error) {
	if pb.fingerprint != "" {
		return pb.fingerprint, nil
	}
	fp, err := idempotency.Fingerprint(pb.json)
	if err != nil {
		return "", fingerprintError(err)
	}
	return fp, nil
}

// readSpooled copies a non-JSON body into sp, parsing a multipart one on
// the way, and fingerprints it.
func readSpooled(body io.Reader, sp *spool, limit int64, mediaType, boundary string) (passBody, error) {
	in := &readErr{r: &io.LimitedReader{R: body, N: limit + 1}}
	tee := io.TeeReader(in, sp)
	var pb passBody
	var err error
	if mediaType == "multipart/form-data" && boundary != "" {
		var fields map[string]string
		pb.fingerprint, fields, pb.fileIDs, err = idempotency.MultipartFingerprint(tee, boundary, "model")
		if err == nil {
			_, err = io.Copy(io.Discard, tee) // the epilogue, if any: the spool must hold every byte
		}
		pb.model = fields["model"]
	} else {
		h := idempotency.RawFingerprint(mediaType)
		_, err = io.Copy(h, tee)
		pb.fingerprint = hex.EncodeToString(h.Sum(nil))
	}
	switch {
	case sp.refused != nil:
		return passBody{}, refusal(sp.refused)
	case in.n > limit:
		return passBody{}, &apierror.TooLarge{Limit: limit}
	case sp.err != nil:
		return passBody{}, &apierror.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "spool_failed",
			Message: "The gateway could not spool the request body to disk; see its log.", Err: sp.err}
	case in.err != nil:
		return passBody{}, apierror.InvalidCode("", "", "Could not read the request body.", in.err)
	case err != nil:
		return passBody{}, apierror.Invalid("", "The multipart/form-data body could not be parsed: "+err.Error()+".")
	}
	pb.src = sp.body()
	return pb, nil
}

// readErr counts what is read and keeps a read error other than EOF: the
// client's failure, told apart from a malformed body.
type readErr struct {
	r   io.Reader
	n   int64
	err error
}

func (e *readErr) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	e.n += int64(n)
	if err != nil && !errors.Is(err, io.EOF) {
		e.err = err
	}
	return n, err
}

// memoryBodyBytes is the most of a non-JSON body held in memory for
// client, past which it goes to the spool file: passthrough.memory_body_bytes
// (1 MiB), but never more than the client's share of
// limits.max_inflight_bytes, which a smaller body could not fit in either.
func (g *Handler) memoryBodyBytes(client string) int64 {
	m := int64(1 << 20)
	if c := g.cfg.Passthrough.MemoryBodyBytes; c > 0 {
		m = c
	}
	if share := g.admit.ShareOf(client); share > 0 {
		m = min(m, share)
	}
	return m
}

func (g *Handler) spoolDir() string {
	if d := g.cfg.Passthrough.SpoolDir; d != "" {
		return d
	}
	return os.TempDir()
}

// spool holds a body in memory up to mem bytes, then in a temp file in dir.
// The file is unlinked as soon as it is created: it lives while it is
// open, and nothing is left behind even by a crash. The bytes in memory
// are reserved in memHeld (limits.max_inflight_bytes) before they are
// buffered, and given back when they move to the file; the bytes in the
// file are reserved in diskHeld (passthrough.spool_max_total_bytes) before
// they are written, and given back when the file is closed.
type spool struct {
	dir      string
	mem      int64
	buf      bytes.Buffer
	f        *os.File
	n        int64
	err      error
	ctx      context.Context
	memBound *admission.Bound
	memHeld  *admission.Reservation
	disk     *admission.Bound
	diskHeld admission.Reservation
	refused  error // a reservation's error (memory or disk), which stopped the spool
}

// reserve makes memHeld cover n bytes in memory (at most mem), a chunk ahead.
func (s *spool) reserve(n int64) error {
	if s.memHeld == nil || s.f != nil {
		return nil
	}
	if n = min(n, s.mem); n <= s.memHeld.Held() {
		return nil
	}
	return s.memHeld.Reserve(s.ctx, s.memBound, min(max(n, s.memHeld.Held()+64<<10), s.mem)-s.memHeld.Held())
}

// reserveDisk reserves n more bytes of the file under
// passthrough.spool_max_total_bytes.
func (s *spool) reserveDisk(n int64) error {
	err := s.diskHeld.Reserve(s.ctx, s.disk, n)
	if err != nil {
		s.refused = err
	}
	return err
}

func (s *spool) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if s.f == nil && int64(s.buf.Len()+len(p)) > s.mem {
		if s.err = s.toFile(); s.err != nil {
			return 0, s.err
		}
	}
	if err := s.reserve(int64(s.buf.Len() + len(p))); err != nil {
		s.err, s.refused = err, err
		return 0, err
	}
	var err error
	if s.f != nil {
		if s.err = s.reserveDisk(int64(len(p))); s.err != nil {
			return 0, s.err
		}
		_, err = s.f.Write(p)
	} else {
		s.buf.Write(p)
	}
	if err != nil {
		s.err = fmt.Errorf("spool request body: %w", err)
		return 0, s.err
	}
	s.n += int64(len(p))
	return len(p), nil
}

// toFile moves what is held so far into a new unlinked temp file.
func (s *spool) toFile() error {
	if err := s.reserveDisk(int64(s.buf.Len())); err != nil {
		return err
	}
	f, err := os.CreateTemp(s.dir, "llmgate-body-*")
	if err != nil {
		return fmt.Errorf("spool request body: %w", err)
	}
	_ = os.Remove(f.Name())
	if _, err := f.Write(s.buf.Bytes()); err != nil {
		f.Close()
		return fmt.Errorf("spool request body: %w", err)
	}
	s.buf = bytes.Buffer{}
	s.f = f
	s.memHeld.Release() // nothing of the body is in memory any more
	return nil
}

// body is what was spooled, for the proxy to send (and resend).
func (s *spool) body() *proxy.Body {
	if s.f != nil {
		return proxy.FileBody(s.f, s.n, s.diskHeld.Release)
	}
	return proxy.MemoryBody(s.buf.Bytes())
}

// discard drops a spool that will not be sent.
func (s *spool) discard() {
	if s.f != nil {
		s.f.Close()
	}
	s.diskHeld.Release()
}
