package jsonscan

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// member is one top-level member as encoding/json's Decoder reads it: the
// decoded key and the value as written.
type member struct {
	key string
	raw []byte
}

// refMembers reads a top-level object with encoding/json, in order, keeping
// repeated keys (which Unmarshal into a map folds into the last).
func refMembers(body []byte) ([]member, bool) {
	d := json.NewDecoder(bytes.NewReader(body))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	var out []member
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return nil, false
		}
		var raw json.RawMessage
		if err := d.Decode(&raw); err != nil {
			return nil, false
		}
		out = append(out, member{t.(string), raw})
	}
	return out, true
}

// FuzzScanObject holds the Scanner to encoding/json: it accepts any JSON
// text exactly when json.Valid does, and on a top-level object it accepts exactly what json.Unmarshal into map[string]json.RawMessage
// accepts (when the text is an object); Members yields every key, decoded
// by Unquote as encoding/json decodes it, with its value as written;
// Fields yields every member whose key it reads (exactly or folded),
// flags each repeat, and its last value for a name is the one
// encoding/json keeps (in a map, or in a struct).
func FuzzScanObject(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"model":"gpt-4o-mini","mod\u0065l":"o1-pro"}`, `{"a":1,"a":2,"b":[1,{"a":3}]}`,
		`{"\u00e9":"é","\ud83d\ude00":null,"x":"\ud800"}`, "{\"\xff\":1,\"\\ufffd\":2}", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`,
		`{"a":-0.5e+3,"b":[true,false,null],"c":{}}`, `{"a":1}x`, `{"a":}`, `[{"a":1}]`, `null`, ` {"A":1,"a":2} `, `{"a":"\u12"}`,
		`{"MODEL":1,"\u017ftore":2,"ſTORE":3,"bac\u212aground":4}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// Any JSON text: valid exactly when encoding/json says so.
		s := New(body, 0)
		s.Skip()
		if valid := s.Err() == nil && s.AtEnd(); valid != json.Valid(body) {
			t.Fatalf("scanner: %q valid %v (%v); encoding/json: %v", body, valid, s.Err(), !valid)
		}

		var ref map[string]json.RawMessage
		refErr := json.Unmarshal(body, &ref)
		isObject := refErr == nil && bytes.TrimLeft(body, " \t\r\n")[0] == '{'

		// Members: every key and value, in order.
		s = New(body, 0)
		var got []member
		object := s.Peek() == '{'
		for key := range s.Members() {
			if v := s.Value(); v != nil {
				got = append(got, member{Unquote(key), v})
			}
		}
		accepted := object && s.Err() == nil && s.AtEnd()
		if accepted != isObject {
			t.Fatalf("scanner accepts %q: %v (%v); encoding/json: %v (%v)", body, accepted, s.Err(), isObject, refErr)
		}
		if !accepted {
			return
		}
		want, ok := refMembers(body)
		if !ok {
			t.Fatalf("encoding/json's Decoder rejects what Unmarshal accepts: %q", body)
		}
		if !slices.EqualFunc(got, want, func(a, b member) bool { return a.key == b.key && bytes.Equal(a.raw, b.raw) }) {
			t.Fatalf("members of %q:\n got %q\nwant %q", body, got, want)
		}

		// Fields, reading every key encoding/json saw (up to 64) and one
		// that may be absent: matched exactly, and folded as encoding/json
		// matches a struct field's name, under strings.EqualFold
		// (TestFoldAsEncodingJSON holds Keys to the decoder itself).
		checkFields(t, body, want, NewExactKeys, func(a, b string) bool { return a == b })
		checkFields(t, body, want, NewKeys, strings.EqualFold)

		// String values decode as encoding/json decodes them.
		for _, m := range want {
			if m.raw[0] != '"' {
				continue
			}
			var str string
			if err := json.Unmarshal(m.raw, &str); err != nil {
				t.Fatal(err)
			}
			if u := Unquote(m.raw); u != str || !Equal(m.raw, str) {
				t.Fatalf("Unquote(%s) = %q, encoding/json %q", m.raw, u, str)
			}
		}
	})
}

// checkFields reads body, an object whose members are want, with Fields
// and a set of its keys (one of each that same says are alike, up to 64,
// and model): each name is yielded as often as a member's key is the same
// as it, every time after the first flagged, its last value the last such
// member's, which encoding/json keeps.
func checkFields(t *testing.T, body []byte, want []member, newKeys func(...string) *Keys, same func(a, b string) bool) {
	t.Helper()
	names := []string{"model"}
	for _, m := range want {
		if len(names) < 64 && !slices.ContainsFunc(names, func(n string) bool { return same(n, m.key) }) {
			names = append(names, m.key)
		}
	}
	s := New(body, 0)
	seen := map[string]int{}
	last := map[string][]byte{}
	for key, dup := range s.Fields(newKeys(names...)) {
		seen[key]++
		if dup != (seen[key] > 1) {
			t.Fatalf("%q: key %q occurrence %d reported dup=%v", body, key, seen[key], dup)
		}
		last[key] = s.Value()
	}
	if s.Err() != nil || !s.AtEnd() {
		t.Fatalf("second scan of %q failed: %v", body, s.Err())
	}
	for _, k := range names {
		count, value := 0, []byte(nil)
		for _, m := range want {
			if same(m.key, k) {
				count, value = count+1, m.raw
			}
		}
		if seen[k] != count {
			t.Fatalf("%q: key %q yielded %d times, present %d times", body, k, seen[k], count)
		}
		if count > 0 && !bytes.Equal(last[k], value) {
			t.Fatalf("%q: key %q: scanner found %s, encoding/json %s", body, k, last[k], value)
		}
	}
}
