package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/gateway/deadletter"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

// FuzzParseRouting: the scanner that routes a request never panics, and
// agrees with encoding/json on what is a valid JSON object and on the
// fields it reads; a field it reads that appears twice is refused.
func FuzzParseRouting(f *testing.F) {
	for _, s := range []string{
		chatBody, streamBody, `{}`, `{"model":"a\"b\u00e9"}`, `{"model":1}`, `{"stream":"yes"}`,
		`{"model":"m","x":[1,2.5e-3,-0,true,false,null,{"a":[]}]}`, `[1]`, `{"model":"m"} x`, `{"a":}`, ` { "model" : "m" , "stream" : true } `,
		`{"model":"gpt-4o-mini","mod\u0065l":"o1-pro"}`, `{"store":false,"background":1,"conversation":{"id":"c"},"previous_response_id":"r"}`,
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
		for _, k := range []string{"model", "stream", "stream_options", "previous_response_id", "background", "store", "conversation"} {
			if counts[k] > 1 {
				t.Fatalf("accepted %q with %s %d times", body, k, counts[k])
			}
		}
		if m, ok := ref["model"]; ok {
			var want string
			if json.Unmarshal(m, &want) == nil && want != rt.Model {
				t.Fatalf("model %q, encoding/json says %q", rt.Model, want)
			}
		}
		if want := string(ref["stream"]) == "true"; rt.Stream != want {
			t.Fatalf("stream %v, encoding/json says %s", rt.Stream, ref["stream"])
		}
		for _, f := range []struct {
			name string
			raw  []byte
		}{
			{"stream_options", rt.Raw.StreamOptions}, {"previous_response_id", rt.Raw.PreviousResponseID},
			{"background", rt.Raw.Background}, {"store", rt.Raw.Store}, {"conversation", rt.Raw.Conversation},
		} {
			if !bytes.Equal(f.raw, ref[f.name]) {
				t.Fatalf("%s %s, encoding/json says %s", f.name, f.raw, ref[f.name])
			}
		}
		var id string
		if json.Unmarshal(ref["previous_response_id"], &id) == nil && id != rt.PreviousResponseID {
			t.Fatalf("previous_response_id %q, encoding/json says %q", rt.PreviousResponseID, id)
		}
		var opts map[string]json.RawMessage
		_ = json.Unmarshal(ref["stream_options"], &opts)
		if want := string(opts["include_usage"]) == "true"; rt.IncludeUsage != want {
			t.Fatalf("include_usage %v, encoding/json says %s", rt.IncludeUsage, opts["include_usage"])
		}
		if want := string(ref["background"]) == "true"; rt.Background != want {
			t.Fatalf("background %v, encoding/json says %s", rt.Background, ref["background"])
		}
		if want := map[string]optBool{"true": optTrue, "false": optFalse}[string(ref["store"])]; rt.Store != want {
			t.Fatalf("store %v, encoding/json says %s", rt.Store, ref["store"])
		}
		var conv map[string]json.RawMessage // not a struct: those match keys case-insensitively
		var convID string
		if json.Unmarshal(ref["conversation"], &convID) != nil && json.Unmarshal(ref["conversation"], &conv) == nil {
			_ = json.Unmarshal(conv["id"], &convID)
		}
		if convID != rt.ConversationID {
			t.Fatalf("conversation %q, encoding/json says %q", rt.ConversationID, convID)
		}
		_ = idempotency.Fingerprint(body) // must not panic on anything parseRouting accepts
	})
}

// keyCounts counts the top-level keys of a JSON object as encoding/json
// decodes them, repeats included; nil if body is not one.
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
		counts[tok.(string)]++
	}
	return counts
}

// FuzzFingerprint: whitespace and key order never change a fingerprint.
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
		if idempotency.Fingerprint([]byte(body)) != idempotency.Fingerprint(indented.Bytes()) {
			t.Fatalf("indentation changed the fingerprint of %q", body)
		}
		var roundTrip any
		d2 := json.NewDecoder(bytes.NewReader(re))
		d2.UseNumber()
		if d2.Decode(&roundTrip) == nil && sameStrings(body, string(re)) && idempotency.Fingerprint([]byte(body)) != idempotency.Fingerprint(re) {
			t.Fatalf("key order changed the fingerprint: %q vs %q", body, re)
		}
	})
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
