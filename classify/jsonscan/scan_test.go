package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// scanAll consumes one value and requires the end of the input after it,
// as a caller reading a whole body does.
func scanAll(in string, maxDepth int) error {
	s := New([]byte(in), maxDepth)
	s.Skip()
	if s.Err() == nil && !s.AtEnd() {
		return errors.New("trailing data")
	}
	return s.Err()
}

func TestSyntax(t *testing.T) {
	cases := []struct{ in, err string }{
		{`{}`, ""},
		{" \t\r\n{ } \n", ""},
		{`{"a":[1,-2.5e+3,0,1E5,-0.0,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9",{},[]]}`, ""},
		{`"top"`, ""},
		{`-0`, ""},
		{`[]`, ""},
		{``, "invalid value (at byte 0)"},
		{`{`, "expected string (at byte 1)"},
		{`{"a"`, "expected ':' after object key (at byte 4)"},
		{`{"a":}`, "invalid value (at byte 5)"},
		// The outermost object reports one past the offending byte; see
		// object.
		{`{"a":1`, "expected ',' or '}' in object (at byte 7)"},
		{`{"a":1]`, "expected ',' or '}' in object (at byte 7)"},
		{`{"a":1,}`, "expected string (at byte 7)"},
		{`{"a":{"b":1 "c":2}}`, "expected ',' or closing bracket (at byte 12)"},
		{`[1 2]`, "expected ',' or closing bracket (at byte 3)"},
		{`[1,]`, "invalid value (at byte 3)"},
		{`[`, "invalid value (at byte 1)"},
		{`{"a":tru}`, "invalid literal (at byte 5)"},
		{`nul`, "invalid literal (at byte 0)"},
		{`-`, "invalid number (at byte 1)"},
		{`-x`, "invalid number (at byte 1)"},
		{`1.`, "invalid number (at byte 2)"},
		{`1e+`, "invalid number (at byte 3)"},
		{`01`, "trailing data"},
		{`.5`, "invalid value (at byte 0)"},
		{`+1`, "invalid value (at byte 0)"},
		{`"\x"`, "invalid escape (at byte 2)"},
		{`"\u12"`, "invalid escape (at byte 2)"},
		{`"\u12g4"`, "invalid escape (at byte 2)"},
		{`"\`, "invalid escape (at byte 2)"},
		{"\"abcdefgh\x01\"", "control character in string (at byte 9)"},
		{"\"abcdefghijklmnop\x1f", "control character in string (at byte 17)"},
		{`"abcdefghijklmnop`, "unterminated string (at byte 17)"},
		{"\"\x7f\xff\xfe\"", ""}, // encoding/json accepts invalid UTF-8
		{"\ufeff{}", "invalid value (at byte 0)"},
		{`{"a":1}x`, "trailing data"},
		{`[[[1]]]`, ""},
	}
	for _, c := range cases {
		err := scanAll(c.in, 0)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != c.err {
			t.Errorf("%q: error %q, want %q", c.in, got, c.err)
		}
		want := json.Valid([]byte(c.in))
		if (err == nil) != want {
			t.Errorf("%q: accepted %v, encoding/json %v", c.in, err == nil, want)
		}
	}
}

func TestDepth(t *testing.T) {
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, c := range []struct {
		in       string
		maxDepth int
		want     error
	}{
		{nest(3), 3, nil},
		{nest(4), 3, ErrTooDeep},
		{`{"a":{"b":[1]}}`, 3, nil},
		{`{"a":{"b":[[1]]}}`, 3, ErrTooDeep},
		{nest(DefaultMaxDepth), 0, nil},
		{nest(DefaultMaxDepth + 1), 0, ErrTooDeep},
	} {
		if err := scanAll(c.in, c.maxDepth); !errors.Is(err, c.want) {
			t.Errorf("%.20q depth %d: %v, want %v", c.in, c.maxDepth, err, c.want)
		}
	}
}

var testKeys = NewKeys("model", "stream", "é", "\uFFFD", "a\"b")

func TestFields(t *testing.T) {
	cases := []struct {
		in   string
		want string // key=value as written, "!" for a duplicate
		err  string
	}{
		{`{"model":"m","stream":true,"x":1}`, `model="m" stream=true`, ""},
		{`{"mod\u0065l":"o1"}`, `model="o1"`, ""},
		{`{"\u006d\u006F\u0064\u0065\u006c":1}`, `model=1`, ""},
		{`{"model ":3," model":4,"mode":5,"modeł":6}`, ``, ""},
		{`{"Model":1,"MODEL":2}`, `model=1 model!=2`, ""},
		{`{"model":"a","mod\u0065l":"b"}`, `model="a" model!="b"`, ""},
		{`{"model":1,"x":{"model":2},"model":3}`, `model=1 model!=3`, ""},
		{`{"\u00e9":1,"é":2}`, `é=1 é!=2`, ""},
		{"{\"\xff\":1,\"\\ufffd\":2,\"\\ud800\":3}", `�=1 �!=2 �!=3`, ""},
		{`{"\ud83d\ude00":1,"a\"b":2,"a\u0022b":3}`, `a"b=2 a"b!=3`, ""},
		{`{"model":[1,{"a":[]}] , "stream" : null }`, `model=[1,{"a":[]}] stream=null`, ""},
		{`{"model":"a","stream":tru}`, `model="a"`, "invalid literal (at byte 22)"},
		{`["model"]`, ``, ""},
		{`"model"`, ``, ""},
	}
	for _, c := range cases {
		s := New([]byte(c.in), 0)
		var got []string
		for key, dup := range s.Fields(testKeys) {
			v := s.Value()
			if v == nil {
				continue
			}
			if dup {
				key += "!"
			}
			got = append(got, key+"="+string(v))
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("%q: fields %s, want %s", c.in, g, c.want)
		}
		if err := fmt.Sprint(s.Err()); c.err != "" && err != c.err || c.err == "" && s.Err() != nil {
			t.Errorf("%q: error %v, want %q", c.in, s.Err(), c.err)
		}
	}
}

func TestIterators(t *testing.T) {
	// A value the loop body leaves is skipped; one it reads is not read
	// twice; nested loops work; a break stops the scan where it is.
	s := New([]byte(`{"a":[1,{"b":2},[3]],"c":{"d":"e"},"f":4}`), 0)
	var got []string
	for key := range s.Members() {
		switch string(key) {
		case `"a"`:
			for i := range s.Elements() {
				if i == 1 {
					for k := range s.Members() {
						got = append(got, string(k)+":"+string(s.Value()))
					}
				}
			}
		case `"c"`:
			got = append(got, "c="+string(s.Value()))
		}
	}
	if s.Err() != nil || !s.AtEnd() {
		t.Fatalf("scan: %v, at end %v", s.Err(), s.AtEnd())
	}
	if g := strings.Join(got, " "); g != `"b":2 c={"d":"e"}` {
		t.Errorf("got %s", g)
	}

	s = New([]byte(`[{"x":1}, 2, garbage`), 0)
	for i := range s.Elements() {
		if i == 0 {
			break
		}
	}
	if s.Err() != nil || s.Pos() != 1 {
		t.Errorf("after break: %v at %d", s.Err(), s.Pos())
	}

	// An iterator over a value of another type yields nothing and
	// consumes nothing.
	s = New([]byte(` "str" `), 0)
	for range s.Members() {
		t.Error("Members yielded for a string")
	}
	for range s.Elements() {
		t.Error("Elements yielded for a string")
	}
	if v := s.Value(); string(v) != `"str"` {
		t.Errorf("Value = %q", v)
	}
}

func TestUnquote(t *testing.T) {
	for _, tok := range []string{
		`""`, `"plain"`, `"\"\\\/\b\f\n\r\t"`, `"\u00e9\u00E9é"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00\ud83d"`,
		`"\ud83dx"`, `"\ud83d\u0041"`, `"\ud83d\ud83d\ude00"`, "\"\xff\xc3\"", "\"\xed\xa0\x80\"", `"` + strings.Repeat(`\u0041`, 30) + `"`,
	} {
		var want string
		if err := json.Unmarshal([]byte(tok), &want); err != nil {
			t.Fatalf("%s: %v", tok, err)
		}
		if got := Unquote([]byte(tok)); got != want {
			t.Errorf("Unquote(%s) = %q, want %q", tok, got, want)
		}
		if !Equal([]byte(tok), want) || Equal([]byte(tok), want+"x") {
			t.Errorf("Equal(%s, %q) wrong", tok, want)
		}
	}
	if Unquote([]byte(`12`)) != "" || Equal([]byte(`null`), "null") {
		t.Error("a non-string decoded as a string")
	}
}

// TestLongRun holds the eight-bytes-at-a-time search to a plain one.
func TestLongRun(t *testing.T) {
	slow := func(b []byte) int {
		for i, c := range b {
			if c == '"' || c == '\\' || c < 0x20 {
				return i
			}
		}
		return len(b)
	}
	check := func(b []byte) {
		t.Helper()
		if got, want := longRun(b, 0), slow(b); got != want {
			t.Fatalf("longRun(%q) = %d, want %d", b, got, want)
		}
	}
	fills := []byte{'a', 0x7f, 0x80, 0xa0, 0xff, ' ', '!', '#', '[', ']', '\\' + 1}
	for c := range 256 {
		for pos := range 12 {
			for _, fill := range fills {
				b := bytes.Repeat([]byte{fill}, 12)
				b[pos] = byte(c)
				check(b)
				// A second special byte after the first must not move it.
				for _, second := range []byte{0, '"', '\\', 0x1f} {
					if pos+1 < len(b) {
						b2 := bytes.Clone(b)
						b2[pos+1] = second
						check(b2)
					}
				}
			}
		}
	}
}

func TestAllocs(t *testing.T) {
	body := []byte(`{"model":"m","mod\u0065l":"x","MODEL":"y","messages":[{"role":"user","content":"hi"}],"stream":true,"\u017fTREAM":1,"ſtream":2}`)
	n := testing.AllocsPerRun(100, func() {
		s := New(body, 64)
		for key := range s.Fields(testKeys) {
			if key == "stream" {
				s.Skip()
			}
		}
		if s.Err() != nil || !s.AtEnd() {
			t.Fatal(s.Err())
		}
	})
	if n != 0 {
		t.Errorf("%v allocations per scan, want 0", n)
	}

	want := strings.Repeat("é", 32) // 64 bytes
	tok := []byte(`"` + strings.Repeat(`\u00e9`, 32) + `é"`)
	n = testing.AllocsPerRun(100, func() {
		if Equal(tok, want) {
			t.Fatal("Equal with a longer text")
		}
	})
	if n != 0 {
		t.Errorf("Equal: %v allocations, want 0", n)
	}
}
