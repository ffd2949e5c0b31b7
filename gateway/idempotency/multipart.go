package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
)

// maxFieldValue bounds a form field value MultipartFingerprint returns.
const maxFieldValue = 1 << 10

// MultipartFingerprint reads a multipart/form-data body from r to its end
// and fingerprints its parsed parts, not its raw bytes: SDKs choose a new
// random boundary on every retry, so the same upload must match whatever
// its boundary. What counts, in order: each part's form name, file name,
// Content-Type and bytes. Part bytes stream through a hash and are never
// held. It also returns the values of the named fields (up to 1 KiB each),
// e.g. the model an audio transcription names, and under FileIDs the
// values of every field whose name holds "file_id" in any case
// (images[][file_id], mask[file_id]): stored objects the form names, for
// the ownership check. A named field over 1 KiB, or there twice, is an
// error (the gateway would route by a value other than the one the
// provider reads), as is a file id that long (it could not be checked).
func MultipartFingerprint(r io.Reader, boundary string, fields ...string) (string, map[string]string, []string, error) {
	mr := multipart.NewReader(io.TeeReader(r, newFormLines(boundary)), boundary)
	outer := sha256.New()
	var values map[string]string
	var ids []string
	inner := sha256.New()
	for parts := 0; ; parts++ {
		p, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) && parts > 0 {
			break
		}
		if errors.Is(err, io.EOF) {
			return "", nil, nil, errors.New("multipart body: no parts (is the boundary in Content-Type the body's?)")
		}
		if err != nil {
			return "", nil, nil, fmt.Errorf("multipart body: %w", err)
		}
		name := p.FormName()
		for _, s := range []string{name, p.FileName(), p.Header.Get("Content-Type")} {
			writeString(outer, s)
		}
		inner.Reset()
		var w io.Writer = inner
		var val *limitedBuf
		isID, want, err := partKind(p, name, fields)
		if err != nil {
			return "", nil, nil, fmt.Errorf("multipart body: %w", err)
		}
		if (isID || want) && p.FileName() == "" {
			val = &limitedBuf{max: maxFieldValue}
			w = io.MultiWriter(inner, val)
		}
		n, err := io.Copy(w, p)
		if err != nil {
			return "", nil, nil, fmt.Errorf("multipart body: part %.100q: %w", name, err)
		}
		if isID && val.over {
			return "", nil, nil, fmt.Errorf("multipart body: part %.100q: a file id over %d bytes", name, maxFieldValue)
		}
		if isID {
			ids = append(ids, string(val.b))
		}
		_ = binary.Write(outer, binary.BigEndian, n)
		outer.Write(inner.Sum(nil))
		if val != nil && !isID {
			if val.over {
				return "", nil, nil, fmt.Errorf("multipart body: field %.100q over %d bytes", name, maxFieldValue)
			}
			if _, twice := values[name]; twice {
				return "", nil, nil, fmt.Errorf("multipart body: field %.100q appears more than once", name)
			}
			if values == nil {
				values = map[string]string{}
			}
			values[name] = string(val.b)
		}
	}
	return hex.EncodeToString(outer.Sum(nil)), values, ids, nil
}

// partKind says whether part p (Go's name for it: name) names a file id,
// or is one of the wanted fields, and refuses it where a provider's
// parser could read it otherwise. A provider's parser may take a part's
// name whatever its disposition says: a file id in a part Go reads no
// name from (not form-data, a malformed or repeated parameter) is
// refused, never passed on unchecked.
func partKind(p *multipart.Part, name string, fields []string) (isID, want bool, err error) {
	if err := plainPartHeader(p.Header); err != nil {
		return false, false, fmt.Errorf("part %.100q: %w", name, err)
	}
	rawName, err := dispositionName(p.Header.Get("Content-Disposition"))
	if err != nil {
		return false, false, err
	}
	if strings.ContainsRune(rawName, '\\') {
		// Go keeps a backslash before a character that is no tspecial
		// (file\_id); busboy (Node) and others drop it (file_id).
		return false, false, fmt.Errorf("part %.100q: a backslash in a field name, which form parsers read differently", rawName)
	}
	isID = strings.Contains(strings.ToLower(rawName), "file_id")
	switch {
	case isID && p.FileName() != "":
		return false, false, fmt.Errorf("part %.100q names a file id but carries a file (filename %.100q)", rawName, p.FileName())
	case isID && name != rawName:
		return false, false, fmt.Errorf("part %.100q names a file id but is not a form-data field", rawName)
	}
	want = wanted(fields, name)
	if want && p.FileName() != "" {
		// Go takes a part with filename*= for a file, python-multipart
		// for a field: Starlette would read this one as the field.
		return false, false, fmt.Errorf("field %.100q sent as a file", name)
	}
	return isID, want, nil
}

// plainPartHeader refuses a part header another parser could read a
// different field name from than Go does, so that the name the ownership
// check and the fingerprint see is the one the provider reads:
//   - two Content-Disposition headers: Go reads the first, Starlette
//     (FastAPI, LiteLLM's proxy, vLLM) the last;
//   - a disposition plainParams refuses: one whose parameters, and so
//     whose name, two parsers could split apart differently.
//
// Its lines are split alike: formLines refuses a header line not ended
// by CRLF (a bare LF ended a line for Go, not for python-multipart).
func plainPartHeader(h textproto.MIMEHeader) error {
	cd := h["Content-Disposition"]
	if len(cd) > 1 {
		return fmt.Errorf("%d Content-Disposition headers; send one", len(cd))
	}
	if len(cd) == 1 {
		if err := plainParams(cd[0], "filename"); err != nil {
			return fmt.Errorf("%w in its Content-Disposition", err)
		}
	}
	return nil
}

// plainParams refuses what lets two parsers read a header's parameters
// apart: Go's mime package and python-multipart's parse_options_header
// (Starlette, FastAPI, LiteLLM's proxy, vLLM) read such a header alike
// only without
//   - backslashes in pairs before a quote, or one outside quotes: inside
//     quotes Go reads \\ as one backslash and the " after it as the
//     end, while Python's quote count takes the last backslash and that
//     quote for an escaped quote, so the two split the parameters at
//     different semicolons. Any other run both count alike (Go's SDK and
//     httpx write \" for a quote in a file name and \\ for a backslash,
//     Node's a backslash as it is);
//   - a control character, or a byte outside ASCII, outside a quoted
//     string: Go skips any Unicode space around a parameter (a no-break
//     space), Python only ASCII ones (inside quotes, where a file name
//     may hold them, neither changes how the quotes count);
//   - an RFC 2231 parameter (name*=, boundary*=, name*0=), other than
//     allowed's: Go prefers it to the plain one, python-multipart ignores
//     it (from 0.0.30; earlier ones decode charsets Go skips). A
//     filename*= names no field: a file id part with a file name is
//     refused on its own.
//
// No SDK sends any of these: Go's and Node's write plain quoted names
// (a file name in UTF-8 inside its quotes, which passes).
func plainParams(v, allowed string) error {
	quoted := false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case quoted && c == '\\':
			run := len(v[i:]) - len(strings.TrimLeft(v[i:], "\\"))
			if run%2 == 0 && i+run < len(v) && v[i+run] == '"' {
				return errors.New(`backslashes in pairs before a quote (\\"); Go ends the string there, other parsers do not`)
			}
			i += run - 1 + run%2 // the run, and the byte an odd one escapes
		case c == '\\':
			return errors.New("a backslash outside a quoted string")
		case c == '"':
			quoted = !quoted
		case quoted:
		case c < ' ' && c != '\t' || c == 0x7f:
			return fmt.Errorf("a control character (%#02x) outside its quoted strings", c)
		case c >= 0x80:
			return errors.New("a byte outside ASCII outside its quoted strings")
		case c == '*':
			rest := strings.TrimLeft(v[i+1:], " \t")
			if !strings.HasPrefix(rest, "=") && (rest == "" || rest[0] < '0' || rest[0] > '9') {
				continue
			}
			name := v[:i]
			if j := strings.LastIndexAny(name, "; \t"); j >= 0 {
				name = name[j+1:]
			}
			if allowed == "" || !strings.EqualFold(name, allowed) {
				return fmt.Errorf("an RFC 2231 parameter (%.40s*=); send a plain %.40s=", name, name)
			}
		}
	}
	return nil
}

// FormContentType parses a request's Content-Type (its values; the
// first is the one read) and, when it names multipart, checks it before
// the body is read: a form is read for the file ids it names (the
// ownership check) only when Go reads its boundary, and the provider's
// parser must read the same one, and the same names. So such a
// Content-Type is refused when it is sent twice, does not parse, is a
// multipart/form-data with no boundary, has a parameter other than the
// boundary and a UTF-8 or ASCII charset, or has parameters plainParams
// refuses (one Go could not parse used to pass unread: Go found no
// boundary, Python ignored the stray parameter and read the form).
// Any other Content-Type is returned as parsed, errors ignored.
func FormContentType(values []string) (mediaType string, params map[string]string, err error) {
	var v string
	if len(values) > 0 {
		v = values[0]
	}
	mt, params, perr := mime.ParseMediaType(v)
	if !slices.ContainsFunc(values, func(v string) bool { return strings.Contains(strings.ToLower(v), "multipart") }) {
		return mt, params, nil
	}
	switch {
	case len(values) > 1:
		return "", nil, fmt.Errorf("%d Content-Type headers; send one", len(values))
	case perr != nil:
		return "", nil, fmt.Errorf("a multipart Content-Type that does not parse (%v); send multipart/form-data; boundary=…", perr)
	case mt == "multipart/form-data" && params["boundary"] == "":
		return "", nil, errors.New("a multipart/form-data Content-Type with no boundary; send multipart/form-data; boundary=…")
	}
	for k, v := range params {
		switch {
		case k == "boundary":
		case k == "charset" && (strings.EqualFold(v, "utf-8") || strings.EqualFold(v, "us-ascii")):
		default:
			// Starlette decodes every part's name and value with the
			// charset (charset=utf-7 turned file+AF8-id into file_id);
			// Go reads the bytes.
			return "", nil, fmt.Errorf("a parameter other than boundary (or charset=utf-8) in the multipart Content-Type: %.40s", k)
		}
	}
	if err := plainParams(v, ""); err != nil {
		return "", nil, fmt.Errorf("%w in the multipart Content-Type", err)
	}
	return mt, params, nil
}

// formLines checks the raw bytes of a multipart/form-data body as Go's
// parser reads them, for line ends and delimiters Go and python-multipart
// take differently (Go is the more lenient: it reads what Python does
// not, and the two name different parts):
//   - the body must start with its first delimiter line, ended by CRLF,
//     after nothing but CRLFs (Go skips any preamble, and a first line
//     ended by a bare LF switches it to bare-LF line ends throughout);
//   - a delimiter line ends in CRLF right after the boundary, or "--"
//     (Go also takes one padded with spaces or tabs, Python data);
//   - every line of a part's headers ends in CRLF, down to the blank line
//     that ends them (a bare LF ends a header line for Go, while Python
//     keeps it in the header's value and reads the next line as a header
//     of the same part: a bare LF before the blank line ended Go's
//     headers early and hid a second disposition from it).
//
// Its Write fails on the first such byte, which fails Go's read of the
// body. What follows the closing delimiter is not looked at.
type formLines struct {
	delim []byte // CRLF "--" boundary
	state int
	bol   bool   // in a part's headers, at the start of a line
	carry []byte // bytes held until the next Write decides them
}

const (
	formStart = iota
	formHeaders
	formBody
	formEnd
)

func newFormLines(boundary string) *formLines {
	return &formLines{delim: []byte("\r\n--" + boundary)}
}

func (f *formLines) Write(p []byte) (int, error) {
	if f.state == formEnd {
		return len(p), nil
	}
	b := p
	if len(f.carry) > 0 {
		f.carry = append(f.carry, p...)
		b = f.carry
	}
	n, err := f.scan(b)
	if err != nil {
		return 0, err
	}
	f.carry = append(f.carry[:0], b[n:]...)
	return len(p), nil
}

// scan reads b from the current state and returns how much of it is
// decided; the rest waits for more bytes.
func (f *formLines) scan(b []byte) (int, error) {
	i := 0
	for i < len(b) {
		var next int
		var err error
		switch f.state {
		case formStart:
			next, err = f.start(b, i)
		case formHeaders:
			next, err = f.header(b, i)
		case formBody:
			next, err = f.body(b, i)
		default:
			return len(b), nil
		}
		if err != nil || next == i {
			return next, err // an error, or more bytes wanted
		}
		i = next
	}
	return i, nil
}

// start reads the first delimiter line, which must begin the body after
// nothing but CRLFs (both parsers skip those).
func (f *formLines) start(b []byte, i int) (int, error) {
	if b[i] == '\r' {
		switch {
		case i+1 == len(b):
			return i, nil
		case b[i+1] == '\n':
			return i + 2, nil
		}
	}
	dash := f.delim[2:]
	first := len(dash) + 2
	if len(b)-i < first {
		if !bytes.HasPrefix(append(dash[:len(dash):len(dash)], '\r', '\n'), b[i:]) {
			return 0, errors.New("the body does not start with its first boundary line")
		}
		return i, nil
	}
	if !bytes.Equal(b[i:i+len(dash)], dash) || b[i+len(dash)] != '\r' || b[i+len(dash)+1] != '\n' {
		return 0, errors.New("the body does not start with its first boundary line, ended by CRLF")
	}
	f.state, f.bol = formHeaders, true
	return i + first, nil
}

// header reads one byte of a part's headers (two for a CRLF).
func (f *formLines) header(b []byte, i int) (int, error) {
	switch b[i] {
	case '\r':
		if i+1 == len(b) {
			return i, nil
		}
		if b[i+1] != '\n' {
			return 0, errors.New("a CR without an LF in a part's headers")
		}
		if f.bol {
			f.state = formBody // the blank line
		}
		f.bol = true
		return i + 2, nil
	case '\n':
		return 0, errors.New("a line of a part's headers ends in a bare LF; end it with CRLF")
	}
	f.bol = false
	return i + 1, nil
}

// body skips a part's bytes to its next delimiter line and reads how that
// line goes on.
func (f *formLines) body(b []byte, i int) (int, error) {
	j := bytes.Index(b[i:], f.delim)
	if j < 0 {
		return max(i, len(b)-len(f.delim)+1), nil
	}
	k := i + j + len(f.delim)
	if len(b)-k < 2 {
		return i + j, nil
	}
	switch {
	case b[k] == '\r' && b[k+1] == '\n':
		f.state, f.bol = formHeaders, true
		return k + 2, nil
	case b[k] == '-' && b[k+1] == '-':
		f.state = formEnd
		return len(b), nil
	case b[k] == ' ' || b[k] == '\t':
		return 0, errors.New("a boundary line padded with spaces; end it with CRLF right after the boundary")
	}
	return i + j + 1, nil // data that starts like a delimiter
}

// writeString writes s to h prefixed with its length, so that no two lists
// of strings hash alike.
func writeString(h hash.Hash, s string) {
	_ = binary.Write(h, binary.BigEndian, uint64(len(s)))
	h.Write([]byte(s))
}

func wanted(fields []string, name string) bool {
	for _, f := range fields {
		if f == name {
			return true
		}
	}
	return false
}

// limitedBuf keeps up to max bytes; over marks a value longer than that.
type limitedBuf struct {
	b    []byte
	max  int
	over bool
}

func (l *limitedBuf) Write(p []byte) (int, error) {
	if len(l.b)+len(p) > l.max {
		l.over = true
	} else {
		l.b = append(l.b, p...)
	}
	return len(p), nil
}

// WithQuery folds a request's query string into a body fingerprint: the
// same key with another query is another request.
func WithQuery(fingerprint, query string) string {
	if query == "" {
		return fingerprint
	}
	h := sha256.New()
	writeString(h, fingerprint)
	writeString(h, query)
	return hex.EncodeToString(h.Sum(nil))
}

// WithHeaders folds the request headers names (canonical) into a body
// fingerprint, each as written, its values in order: the same key with
// another anthropic-beta is another request, since the headers change the
// answer. A request with none of them keeps its body's fingerprint.
func WithHeaders(fingerprint string, hdr http.Header, names []string) string {
	h := sha256.New()
	writeString(h, fingerprint)
	seen := false
	for _, name := range names {
		vs := hdr[name]
		if len(vs) == 0 {
			continue
		}
		seen = true
		writeString(h, name)
		writeString(h, strconv.Itoa(len(vs)))
		for _, v := range vs {
			writeString(h, v)
		}
	}
	if !seen {
		return fingerprint
	}
	return hex.EncodeToString(h.Sum(nil))
}

// dispositionName is the name parameter of a part's Content-Disposition,
// whatever its type; an error if the header does not parse (a repeated
// parameter, say), which Go's FormName reads as no name at all.
func dispositionName(cd string) (string, error) {
	if cd == "" {
		return "", nil
	}
	_, params, err := mime.ParseMediaType(cd)
	if err != nil {
		return "", fmt.Errorf("a part's Content-Disposition %.100q does not parse: %v", cd, err)
	}
	return params["name"], nil
}
