package proxy

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// An upstream that quotes the key it was sent may quote it JSON-escaped:
// PHP's json_encode writes "/" as `\/`, Go's encoding/json "<", ">" and
// "&" as `\u003c`…, .NET's System.Text.Json those and "+", "'" as
// `\u002B`…, and an encoder may escape any byte outside letters and
// digits so; an error wrapped in another JSON string is escaped twice
// (`\\\/`, `\\u002f`). A key made only of letters, digits, "-", "_" and
// "." (most providers' keys) has no escaped form any encoder writes, and
// the plain search in redactKey finds every copy (an error body, which
// the gateway itself decodes, is also checked decoded: redactDecoded);
// for any other ASCII key, secret.esc matches each of its other bytes
// written as itself or as an escape, up to maxEscapeDepth times escaped,
// whatever the encoder chose for each byte. A key with a byte outside
// ASCII is looked for as it is only.

// maxEscapeDepth bounds how many times over an escaped copy may be
// escaped: the backslashes before an escape (1 to 4; a backslash itself
// is 1 to 8 of them).
const maxEscapeDepth = 4

// plainKeyByte reports a byte no JSON encoder escapes.
func plainKeyByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '-' || c == '_' || c == '.'
}

// secret is the credential an attempt sent, as redaction looks for it.
type secret struct {
	key string
	// esc matches key in any of its JSON-escaped forms (the plain one
	// too); nil when key has none.
	esc *regexp.Regexp
	// reach is the length of key's longest written form: each byte an
	// encoder may escape as up to nine (`\\\\u00XX`).
	reach int
}

// secrets caches newSecret's answers by key: keys are the configured
// credentials, so it holds a few.
var secrets sync.Map // string → secret

// newSecret is key as redaction looks for it.
func newSecret(key string) secret {
	if s, ok := secrets.Load(key); ok {
		return s.(secret)
	}
	s := secret{key: key, reach: len(key)}
	ascii, escapable := true, false
	for i := range len(key) {
		ascii = ascii && key[i] < 0x80
		escapable = escapable || !plainKeyByte(key[i])
	}
	if ascii && escapable {
		var b strings.Builder
		for i := range len(key) {
			c := key[i]
			lit := regexp.QuoteMeta(key[i : i+1])
			if plainKeyByte(c) {
				b.WriteString(lit)
				continue
			}
			s.reach += maxEscapeDepth + len("u00XX") - 1
			esc := `\\{1,` + strconv.Itoa(maxEscapeDepth) + `}`
			uhex := esc + `u00` + hexEitherCase(c>>4) + hexEitherCase(c&0xf)
			switch c {
			case '\\':
				b.WriteString(`(?:\\{1,` + strconv.Itoa(2*maxEscapeDepth) + `}|` + uhex + `)`)
			case '/', '"':
				b.WriteString(`(?:` + lit + `|` + uhex + `|` + esc + lit + `)`)
			default:
				b.WriteString(`(?:` + lit + `|` + uhex + `)`)
			}
		}
		s.esc = regexp.MustCompile(b.String())
	}
	secrets.Store(key, s)
	return s
}

// startsForm reports whether b could be the start of a written form of
// key (one secret.esc matches) that goes on past b's end.
func startsForm(b []byte, key string) bool {
	i := 0
	for k := 0; k < len(key) && i < len(b); k++ {
		c := key[k]
		if b[i] == c && c != '\\' {
			i++
			continue
		}
		if plainKeyByte(c) || b[i] != '\\' {
			return false
		}
		run := 0
		for i < len(b) && b[i] == '\\' && run < 2*maxEscapeDepth {
			i++
			run++
		}
		if i == len(b) {
			return true
		}
		switch {
		case b[i] == 'u' && run <= maxEscapeDepth:
			i++
			want := "00" + hexByte(c)
			for j := range len(want) {
				if i == len(b) {
					return true
				}
				if b[i]|0x20 != want[j] && b[i] != want[j] {
					return false
				}
				i++
			}
		case c == '\\':
			// The run of backslashes is the form.
		case (c == '/' || c == '"') && b[i] == c && run <= maxEscapeDepth:
			i++
		default:
			return false
		}
	}
	return true
}

const hexDigits = "0123456789abcdef"

// hexByte is c in two lower-case hex digits.
func hexByte(c byte) string { return string([]byte{hexDigits[c>>4], hexDigits[c&0xf]}) }

// hexEitherCase is a pattern for the hex digit d in either case.
func hexEitherCase(d byte) string {
	if d < 10 {
		return hexDigits[d : d+1]
	}
	return "[" + hexDigits[d:d+1] + strings.ToUpper(hexDigits[d:d+1]) + "]"
}

// redactDecoded is an error body with the key redacted from what its JSON
// strings decode to. An encoder may write any character as \u00XX,
// letters too: no honest one does so, and the searches of redactKey look
// for what encoders write. But an error body is decoded — by the client's
// SDK, and by the gateway itself into its own message
// (upstream_retries_exhausted) and log line — so a string that decodes to
// the key is written again, encoded with the key redacted. Only error
// bodies (small, and rare): an answer's body, and a stream, are left as
// the upstream wrote them (as a base64 copy of the key is). A body that is
// not JSON, holds no escape of an ASCII character, or decodes to no copy
// of the key is returned as it is.
func redactDecoded(body []byte, k secret) []byte {
	if len(k.key) < minRedactedKey || !bytes.Contains(body, escapedASCII) {
		return body
	}
	// A byte-order mark first is no JSON, but Python's json.loads (and
	// with it requests' and httpx's .json()) skips it: so does this.
	bom := len(body) - len(bytes.TrimPrefix(body, utf8BOM))
	var v any
	dec := json.NewDecoder(bytes.NewReader(body[bom:]))
	dec.UseNumber() // numbers written again as they came
	if dec.Decode(&v) != nil {
		return body
	}
	v, found := redactStrings(v, k.key)
	if !found {
		return body
	}
	out, err := json.Marshal(v)
	if err != nil {
		return body
	}
	return append(body[:bom:bom], out...)
}

// utf8BOM is the byte-order mark some encoders write first.
var utf8BOM = []byte("\xef\xbb\xbf")

// escapedASCII starts the escape of an ASCII character (\u00XX): a body
// without one has no copy of the key that its bytes do not show.
var escapedASCII = []byte(`\u00`)

// redactStrings replaces key in every string within v (a decoded JSON
// value), object keys too, and reports whether it found any.
func redactStrings(v any, key string) (any, bool) {
	switch t := v.(type) {
	case string:
		if strings.Contains(t, key) {
			return strings.ReplaceAll(t, key, string(redacted)), true
		}
	case []any:
		found := false
		for i, e := range t {
			var f bool
			t[i], f = redactStrings(e, key)
			found = found || f
		}
		return t, found
	case map[string]any:
		found := false
		for name, e := range t {
			e, f := redactStrings(e, key)
			if strings.Contains(name, key) {
				delete(t, name)
				name, f = strings.ReplaceAll(name, key, string(redacted)), true
			}
			t[name] = e
			found = found || f
		}
		return t, found
	}
	return v, false
}
