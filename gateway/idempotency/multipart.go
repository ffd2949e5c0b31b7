package idempotency

import (
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
	mr := multipart.NewReader(r, boundary)
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
		// A provider's parser may take a part's name whatever its
		// disposition says: a file id in a part Go reads no name from (not
		// form-data, a malformed or repeated parameter) is refused, never
		// passed on unchecked.
		if err := plainPartHeader(p.Header); err != nil {
			return "", nil, nil, fmt.Errorf("multipart body: part %.100q: %w", name, err)
		}
		rawName, err := dispositionName(p.Header.Get("Content-Disposition"))
		if err != nil {
			return "", nil, nil, fmt.Errorf("multipart body: %w", err)
		}
		isID := strings.Contains(strings.ToLower(rawName), "file_id")
		if isID && p.FileName() != "" {
			return "", nil, nil, fmt.Errorf("multipart body: part %.100q names a file id but carries a file (filename %.100q)", rawName, p.FileName())
		}
		if isID && name != rawName {
			return "", nil, nil, fmt.Errorf("multipart body: part %.100q names a file id but is not a form-data field", rawName)
		}
		if (isID || wanted(fields, name)) && p.FileName() == "" {
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

// plainPartHeader refuses a part header another parser could read a
// different field name from than Go does, so that the name the ownership
// check and the fingerprint see is the one the provider reads:
//   - two Content-Disposition headers: Go reads the first, Starlette
//     (FastAPI, LiteLLM's proxy, vLLM) the last;
//   - an RFC 2231 name (name*=): Go prefers it, python-multipart from
//     0.0.30 ignores it, earlier ones decode charsets Go skips (a
//     filename*= is let through: a file id part with a file name is
//     refused on its own, and other parts are named by name=);
//   - "name" in any other header's value: a bare LF ends a header line
//     for Go but not for python-multipart, which reads the next line as
//     part of the disposition (and takes its last name); such a line is a
//     header of its own to Go. No SDK sends a name outside the
//     disposition.
func plainPartHeader(h textproto.MIMEHeader) error {
	for k, vs := range h {
		switch {
		case k == "Content-Disposition" && len(vs) > 1:
			return fmt.Errorf("%d Content-Disposition headers; send one", len(vs))
		case k == "Content-Disposition" && extendedParam(vs[0], "name"):
			return errors.New("an RFC 2231 name (name*=) in its Content-Disposition; send a plain name=")
		case k == "Content-Disposition":
		default:
			for _, v := range vs {
				if strings.Contains(strings.ToLower(v), "name") {
					return fmt.Errorf("a name in its %s header; a field's name belongs in its Content-Disposition alone", k)
				}
			}
		}
	}
	return nil
}

// extendedParam reports an RFC 2231 parameter (name*=, name*0=) in a
// header value, outside its quoted strings (a file name may hold "*="):
// one named param, or any when param is "".
func extendedParam(v, param string) bool {
	quoted := false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == '*':
			rest := strings.TrimLeft(v[i+1:], " \t")
			if !strings.HasPrefix(rest, "=") && (rest == "" || rest[0] < '0' || rest[0] > '9') {
				continue
			}
			name := v[:i]
			if j := strings.LastIndexAny(name, "; \t"); j >= 0 {
				name = name[j+1:]
			}
			if param == "" || strings.EqualFold(name, param) {
				return true
			}
		}
	}
	return false
}

// ExtendedParam reports an RFC 2231 parameter (boundary*=) in a request's
// Content-Type: Go prefers it to a plain one, other parsers do not, so two
// would split the body at different boundaries.
func ExtendedParam(contentType string) bool { return extendedParam(contentType, "") }

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
