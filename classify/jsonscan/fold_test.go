package jsonscan

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// Keys match as encoding/json matches a struct field's name: after
// unescaping, case-insensitively under Unicode simple folding, so that
// 'ſ' (U+017F) is s and the Kelvin sign 'K' (U+212A) is k. A Go upstream
// reads "MODEL" as model; the gateway must too.

var foldKeys = NewKeys("model", "store", "background", "previous_response_id", "é", "ǆ")

func TestFieldsFold(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{"MODEL":1}`, `model=1`},
		{`{"Model":1,"mOdEl":2}`, `model=1 model!=2`},
		{`{"model":"a","MODEL":"b"}`, `model="a" model!="b"`},
		{`{"MOD\u0045L":1}`, `model=1`},
		{`{"\u017ftore":1}`, `store=1`},
		{`{"ſtore":1,"STORE":2}`, `store=1 store!=2`},
		{`{"bac\u212aground":1}`, `background=1`},
		{`{"bacKground":1,"BACKGROUND":2}`, `background=1 background!=2`},
		{`{"PREVIOUS_RESPONSE_ID":"r","previou\u017f_response_id":"s"}`, `previous_response_id="r" previous_response_id!="s"`},
		{`{"É":1,"\u00c9":2}`, `é=1 é!=2`},
		{`{"ǅ":1,"Ǆ":2,"\u01c6":3}`, `ǆ=1 ǆ!=2 ǆ!=3`},
		// Not folds: dotted capital I, dotless i, a space, a different length.
		{`{"modeİ":1,"ıodel":2,"model ":3,"mode":4,"PREVIOUS-RESPONSE-ID":5,"previousresponseid":6}`, ``},
	}
	for _, c := range cases {
		s := New([]byte(c.in), 0)
		var got []string
		for key, dup := range s.Fields(foldKeys) {
			if dup {
				key += "!"
			}
			got = append(got, key+"="+string(s.Value()))
		}
		if g := strings.Join(got, " "); g != c.want || s.Err() != nil {
			t.Errorf("%s: fields %s (%v), want %s", c.in, g, s.Err(), c.want)
		}
	}
}

// TestFoldAsEncodingJSON holds the matching to encoding/json itself: a
// one-member object {key:1} sets the struct field whose tag is name
// exactly when Keys matches key to name. Every rune up to U+2FFF (the
// Kelvin sign is U+212A) is tried in place of each letter of each name,
// as written and escaped.
func TestFoldAsEncodingJSON(t *testing.T) {
	names := []string{"model", "stream", "input_file_id", "vector_store_ids", "é", "ǆ", "ω"}
	keys := NewKeys(names...)
	fields := make([]reflect.StructField, len(names))
	for i, n := range names {
		fields[i] = reflect.StructField{Name: fmt.Sprintf("F%d", i), Type: reflect.TypeFor[*int](), Tag: reflect.StructTag(`json:"` + n + `"`)}
	}
	typ := reflect.StructOf(fields)
	decoded := func(body string) int {
		v := reflect.New(typ)
		if err := json.Unmarshal([]byte(body), v.Interface()); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		for i := range names {
			if !v.Elem().Field(i).IsNil() {
				return i
			}
		}
		return -1
	}
	checked := 0
	for _, n := range names {
		for j, c := range n {
			for r := rune(0); r <= 0x2fff; r++ {
				if !utf8.ValidRune(r) || r < 0x20 || r == '"' || r == '\\' || !strings.EqualFold(string(r), string(c)) && r != c+1 {
					continue // only the runes that fold to c, and one that does not
				}
				key := n[:j] + string(r) + n[j+utf8.RuneLen(c):]
				for _, tok := range []string{`"` + key + `"`, `"` + n[:j] + fmt.Sprintf(`\u%04x`, r) + n[j+utf8.RuneLen(c):] + `"`} {
					want := decoded(`{` + tok + `:1}`)
					if got := keys.Index([]byte(tok)); got != want {
						t.Errorf("key %s: Keys says %d, encoding/json %d", tok, got, want)
					}
					s := New([]byte(`{`+tok+`:1}`), 0)
					got := -1
					for k := range s.Fields(keys) {
						got = keys.Index([]byte(`"` + k + `"`))
					}
					if got != want {
						t.Errorf("key %s: Fields says %d, encoding/json %d", tok, got, want)
					}
					checked++
				}
			}
		}
	}
	if checked < 100 {
		t.Fatalf("only %d keys checked", checked)
	}
}

func TestNewKeysFoldedTwice(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("NewKeys accepted two names that fold to one")
		}
	}()
	NewKeys("store", "STORE")
}

// TestExactKeys: NewExactKeys matches after unescaping, exactly.
func TestExactKeys(t *testing.T) {
	keys := NewExactKeys("model", "store", "é")
	s := New([]byte(`{"Model":1,"MODEL":2,"mod\u0065l":3,"\u017ftore":4,"ſtore":5,"É":6,"\u00e9":7,"model":8}`), 0)
	var got []string
	for key, dup := range s.Fields(keys) {
		if dup {
			key += "!"
		}
		got = append(got, key+"="+string(s.Value()))
	}
	if g := strings.Join(got, " "); g != `model=3 é=7 model!=8` || s.Err() != nil {
		t.Errorf("fields %s (%v)", g, s.Err())
	}
	if keys.Index([]byte(`"STORE"`)) != -1 || keys.Index([]byte(`"st\u006fre"`)) != 1 {
		t.Error("Index of an exact set folds")
	}
	NewExactKeys("store", "STORE") // two names, exactly
}

// FuzzMayMatch holds mayMatch, the length and first-byte test that spares
// most keys the full match, to match itself: it may let a key through that
// does not match, never turn one away that does. The sets are ASCII, as
// the gateway's and classify's are (a set with a name that is not turns
// the test off), and hold names that begin with the letters 'ſ' and the
// Kelvin sign fold to.
func FuzzMayMatch(f *testing.F) {
	for _, k := range []string{
		`model`, `MODEL`, `ſtore`, `\u017ftore`, `STORE`, `\u212aind`, `Kind`, `kInd`, `\u006bind`,
		`choices`, `created`, `content`, `_x`, `_X`, ``, `\u0000`, "\xc5\xbftore", "\xe2\x84\xaaind", "\xffmodel",
	} {
		f.Add(k)
	}
	sets := []*Keys{
		NewKeys("model", "store", "kind", "_x", ""),
		NewExactKeys("model", "store", "kind", "_x", ""),
		NewExactKeys("choices", "error", "usage"),
		NewKeys("s", "k", "Stream_Options"),
	}
	f.Fuzz(func(t *testing.T, inner string) {
		tok := []byte(`"` + inner + `"`)
		s := New(tok, 0)
		s.Skip()
		if s.Err() != nil || !s.AtEnd() {
			return // not one string token
		}
		escaped := strings.Contains(inner, `\`)
		for _, keys := range sets {
			if i := keys.match([]byte(inner), escaped); i >= 0 && !keys.mayMatch([]byte(inner), escaped) {
				t.Fatalf("%q matches %q, but mayMatch turns it away", tok, keys.names[i])
			}
		}
	})
}
