package proxy

import (
	"regexp"
	"strings"
	"sync"
)

// An upstream that quotes the key it was sent may quote it JSON-escaped:
// PHP's json_encode writes "/" as `\/`, Go's encoding/json "<", ">" and
// "&" as `\u003c`…, .NET's System.Text.Json those and "+", "'" as
// `\u002B`…, and an encoder may escape any byte outside letters and
// digits so. A key made only of letters, digits, "-", "_" and "." (most
// providers' keys) has no escaped form, and the plain search in redactKey
// finds every copy; for any other key, secret.esc matches each of its
// other bytes written as itself or as an escape, whatever the encoder
// chose for each (secret.esc).

// plainKeyByte reports a byte no JSON encoder escapes.
func plainKeyByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '-' || c == '_' || c == '.' || c >= 0x80
}

// secret is the credential an attempt sent, as redaction looks for it.
type secret struct {
	key string
	// esc matches key in any of its JSON-escaped forms (the plain one
	// too); nil when key has none.
	esc *regexp.Regexp
	// reach is the length of key's longest written form: each byte an
	// encoder may escape as six (`\u00XX`).
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
	var b strings.Builder
	for i := range len(key) {
		c := key[i]
		lit := regexp.QuoteMeta(string(c))
		if plainKeyByte(c) {
			b.WriteString(lit)
			continue
		}
		s.reach += 5
		b.WriteString(`(?:` + lit + `|\\u00` + hexEitherCase(c>>4) + hexEitherCase(c&0xf))
		if c == '/' || c == '"' || c == '\\' {
			b.WriteString(`|\\` + lit)
		}
		b.WriteString(`)`)
	}
	if s.reach > len(key) {
		s.esc = regexp.MustCompile(b.String())
	}
	secrets.Store(key, s)
	return s
}

// hexEitherCase is a pattern for the hex digit d in either case.
func hexEitherCase(d byte) string {
	const digits = "0123456789abcdef"
	if d < 10 {
		return digits[d : d+1]
	}
	return "[" + digits[d:d+1] + strings.ToUpper(digits[d:d+1]) + "]"
}
