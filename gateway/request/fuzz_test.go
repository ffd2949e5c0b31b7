package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/classify/jsonscan"
	"github.com/llmgate/llmgate/gateway/deadletter"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

// FuzzParseRouting: the scanner that routes a request never panics, and
// agrees with encoding/json on what is a valid JSON object and on the
// fields it reads (as a Go upstream decoding into a struct reads them,
// keys folded); a field it reads that appears twice, in any case, is
// refused.
// chatBody is a small chat request.
const streamBody = `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hello"}]}`

const chatBody = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello"}]}`

func FuzzParseRouting(f *testing.F) {
	for _, s := range []string{
		chatBody, streamBody, `{}`, `{"model":"a\"b\u00e9"}`, `{"model":1}`, `{"stream":"yes"}`,
		`{"model":"m","x":[1,2.5e-3,-0,true,false,null,{"a":[]}]}`, `[1]`, `{"model":"m"} x`, `{"a":}`, ` { "model" : "m" , "stream" : true } `,
		`{"model":"gpt-4o-mini","mod\u0065l":"o1-pro"}`, `{"MODEL":"m","\u017ftream":true,"Conversation":{"ID":"c"}}`, `{"store":false,"background":1,"conversation":{"id":"c"},"previous_response_id":"r"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rt, err := parseRouting(body, 64)
		var ref map[string]json.RawMessage
		refErr := json.Unmarshal(body, &ref)
		if err == nil && refErr != nil {
			t.Fatalf("accepted what encoding/json rejects: %q (%v)", body, refErr)
		}
		var se *syntaxError
		// encoding/json decodes a JSON null into a map without error (the
		// map stays nil); it is not an object, and the scanner refuses it.
		if errors.As(err, &se) && refErr == nil && ref != nil && json.Valid(body) {
			t.Fatalf("rejected valid JSON %q: %v", body, err)
		}
		// A duplicate is refused where the scan meets it, before the rest
		// of the body is checked (as a field of the wrong type is).
		counts := keyCounts(body)
		var fe *fieldError
		if errors.As(err, &fe) && fe.Code == "duplicate_field" && counts != nil && counts[fe.Param] < 2 {
			t.Fatalf("%q: %v, but encoding/json sees %s %d times", body, err, fe.Param, counts[fe.Param])
		}
		if err != nil {
			return
		}
		for _, k := range routingNames {
			if counts[k] > 1 {
				t.Fatalf("accepted %q with %s %d times", body, k, counts[k])
			}
		}
		checkRouting(t, body, rt)
		_, _ = idempotency.Fingerprint(body) // must not panic on anything parseRouting accepts
	})
}

// routingNames are the fields parseRouting reads.
var routingNames = []string{"model", "stream", "stream_options", "previous_response_id", "background", "store", "conversation"}

// routingRef is what a Go upstream reads of the fields parseRouting
// reads: encoding/json matches a struct field's name case-insensitively
// (under Unicode simple folding) and keeps the last of a repeat.
type routingRef struct {
	Model              json.RawMessage `json:"model"`
	Stream             json.RawMessage `json:"stream"`
	StreamOptions      json.RawMessage `json:"stream_options"`
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	Background         json.RawMessage `json:"background"`
	Store              json.RawMessage `json:"store"`
	Conversation       json.RawMessage `json:"conversation"`
}

// checkRouting holds what parseRouting read of body, which it accepted,
// to what encoding/json reads into routingRef.
func checkRouting(t *testing.T, body []byte, rt routing) {
	t.Helper()
	var ref routingRef
	if err := json.Unmarshal(body, &ref); err != nil {
		t.Fatalf("%q: %v", body, err)
	}
	var model string
	if json.Unmarshal(ref.Model, &model) == nil && model != rt.Model {
		t.Fatalf("model %q, encoding/json says %q", rt.Model, model)
	}
	if want := string(ref.Stream) == "true"; rt.Stream != want {
		t.Fatalf("stream %v, encoding/json says %s", rt.Stream, ref.Stream)
	}
	for _, f := range []struct {
		name      string
		raw, want []byte
	}{
		{"stream_options", rt.Raw.StreamOptions, ref.StreamOptions}, {"previous_response_id", rt.Raw.PreviousResponseID, ref.PreviousResponseID},
		{"background", rt.Raw.Background, ref.Background}, {"store", rt.Raw.Store, ref.Store}, {"conversation", rt.Raw.Conversation, ref.Conversation},
	} {
		if !bytes.Equal(f.raw, f.want) {
			t.Fatalf("%s %s, encoding/json says %s", f.name, f.raw, f.want)
		}
	}
	var id string
	if json.Unmarshal(ref.PreviousResponseID, &id) == nil && id != rt.PreviousResponseID {
		t.Fatalf("previous_response_id %q, encoding/json says %q", rt.PreviousResponseID, id)
	}
	var opts struct {
		IncludeUsage json.RawMessage `json:"include_usage"`
	}
	_ = json.Unmarshal(ref.StreamOptions, &opts)
	if want := string(opts.IncludeUsage) == "true"; rt.IncludeUsage != want {
		t.Fatalf("include_usage %v, encoding/json says %s", rt.IncludeUsage, opts.IncludeUsage)
	}
	if want := string(ref.Background) == "true"; rt.Background != want {
		t.Fatalf("background %v, encoding/json says %s", rt.Background, ref.Background)
	}
	if want := map[string]optBool{"true": optTrue, "false": optFalse}[string(ref.Store)]; rt.Store != want {
		t.Fatalf("store %v, encoding/json says %s", rt.Store, ref.Store)
	}
	var conv struct {
		ID json.RawMessage `json:"id"`
	}
	var convID string
	if json.Unmarshal(ref.Conversation, &convID) != nil && json.Unmarshal(ref.Conversation, &conv) == nil {
		_ = json.Unmarshal(conv.ID, &convID)
	}
	if convID != rt.ConversationID {
		t.Fatalf("conversation %q, encoding/json says %q", rt.ConversationID, convID)
	}
}

// keyCounts counts the top-level keys of a JSON object as encoding/json
// decodes them, repeats included, a key that folds to one of
// routingNames (strings.EqualFold, as encoding/json matches a struct
// field) counted as that name; nil if body is not one.
func keyCounts(body []byte) map[string]int {
	d := json.NewDecoder(bytes.NewReader(body))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	counts := map[string]int{}
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil
		}
		var skip json.RawMessage
		if d.Decode(&skip) != nil {
			return nil
		}
		key := tok.(string)
		if i := slices.IndexFunc(routingNames, func(n string) bool { return strings.EqualFold(n, key) }); i >= 0 {
			key = routingNames[i]
		}
		counts[key]++
	}
	return counts
}

// FuzzFingerprint: whitespace never changes a fingerprint, nor does key
// order in an object without keys read alike ("b" and "B", which Go's
// encoding/json reads as one: such an object is fingerprinted in the order
// its keys are written, since an upstream reads the last of them).
func FuzzFingerprint(f *testing.F) {
	f.Add(chatBody)
	f.Add(`{"b":1,"a":{"d":[1,{"z":0,"y":"x"}],"c":null}}`)
	f.Fuzz(func(t *testing.T, body string) {
		var v any
		d := json.NewDecoder(strings.NewReader(body))
		d.UseNumber()
		if d.Decode(&v) != nil || d.More() {
			return
		}
		if _, ok := v.(map[string]any); !ok {
			return
		}
		if _, err := parseRouting([]byte(body), 0); err != nil {
			return
		}
		// Re-encode: keys sorted, whitespace gone. Same fingerprint.
		// (Strings may be re-escaped by encoding/json, so only compare
		// when they came out the same.)
		re, err := json.Marshal(v)
		if err != nil {
			return
		}
		var indented bytes.Buffer
		if json.Indent(&indented, []byte(body), "", "  ") != nil {
			return
		}
		if fingerprintOf(t, []byte(body)) != fingerprintOf(t, indented.Bytes()) {
			t.Fatalf("indentation changed the fingerprint of %q", body)
		}
		var roundTrip any
		d2 := json.NewDecoder(bytes.NewReader(re))
		d2.UseNumber()
		if d2.Decode(&roundTrip) == nil && sameStrings(body, string(re)) && !keysReadAlike(v) && fingerprintOf(t, []byte(body)) != fingerprintOf(t, re) {
			t.Fatalf("key order changed the fingerprint: %q vs %q", body, re)
		}
	})
}

// keysReadAlike reports whether an object anywhere in v has two keys that
// fold alike (jsonscan.FoldedKey), whose order the fingerprint keeps.
func keysReadAlike(v any) bool {
	switch v := v.(type) {
	case map[string]any:
		seen := map[string]bool{}
		for k, e := range v {
			tok, _ := json.Marshal(k)
			f := jsonscan.FoldedKey(tok)
			if seen[f] || keysReadAlike(e) {
				return true
			}
			seen[f] = true
		}
	case []any:
		return slices.ContainsFunc(v, keysReadAlike)
	}
	return false
}

// sameStrings reports whether two JSON texts hold the same string tokens as
// written (so that only key order and spacing differ).
func sameStrings(a, b string) bool {
	tok := func(s string) []string {
		var out []string
		d := json.NewDecoder(strings.NewReader(s))
		for {
			t, err := d.Token()
			if err != nil {
				break
			}
			if str, ok := t.(string); ok {
				out = append(out, str)
			}
		}
		return out
	}
	ta, tb := tok(a), tok(b)
	if len(ta) != len(tb) {
		return false
	}
	count := map[string]int{}
	for _, s := range ta {
		count[s]++
	}
	for _, s := range tb {
		count[s]--
	}
	for _, n := range count {
		if n != 0 {
			return false
		}
	}
	// encoding/json re-escapes (&, <, >, U+2028...) and replaces invalid
	// UTF-8 with U+FFFD; the fingerprint counts strings as written.
	return utf8.ValidString(a) && !strings.Contains(a, `\`) && !strings.Contains(b, `\`)
}

// FuzzIdempotencyKey: the parser never panics, accepts only 1–255
// printable ASCII characters, and a key quoted as an sf-string parses back
// to itself.
func FuzzIdempotencyKey(f *testing.F) {
	for _, s := range []string{"order-4711/summarize", `"quoted \"key\""`, `""`, `"unterminated`, strings.Repeat("k", 256), "tab\tkey", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		k, err := idempotency.ParseKey(h)
		if err != nil {
			return
		}
		if len(k) == 0 || len(k) > cache.MaxIDLen {
			t.Fatalf("accepted key of length %d", len(k))
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x20 || k[i] > 0x7e {
				t.Fatalf("accepted non-printable byte %q", k[i])
			}
		}
		back, err := idempotency.ParseKey(deadletter.QuoteKey(k))
		if err != nil || back != k {
			t.Fatalf("quoted round trip of %q: %q, %v", k, back, err)
		}
	})
}
