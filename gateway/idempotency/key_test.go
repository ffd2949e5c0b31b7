package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/llmgate/llmgate/classify/jsonscan"
)

// referenceFingerprint is Fingerprint as it was first written (a buffer per
// nested value, a slice of members per object). Fingerprints are stored with
// idempotency records, so the canonical form must never change: a record
// committed by an older gateway must still match the same body on a newer
// one, or a crashed workflow's retry would get a 422 after an upgrade. The
// one change since: an object with keys spelled apart that an upstream
// reads as one ("messages", "\u006dessages", "Messages") is ordered as
// they are read and marked, so that two bodies differing only in their
// order differ (TestFingerprintKeysReadAlike); no other body's form moved.
func referenceFingerprint(body []byte) string {
	var canon bytes.Buffer
	referenceCanonical(jsonscan.New(body, 0), &canon)
	sum := sha256.Sum256(canon.Bytes())
	return hex.EncodeToString(sum[:])
}

func referenceCanonical(s *jsonscan.Scanner, out *bytes.Buffer) {
	switch s.Peek() {
	case '{':
		type member struct{ key, val []byte }
		var members []member
		for key := range s.Members() {
			var val []byte
			if c := s.Peek(); c == '{' || c == '[' {
				var v bytes.Buffer
				referenceCanonical(s, &v)
				val = v.Bytes()
			} else {
				val = s.Value()
			}
			members = append(members, member{key, val})
		}
		// Keys an upstream reads alike though spelled apart (escapes,
		// case): ordered as read, the order among them kept, and marked.
		read := func(raw []byte) string {
			var k string
			if json.Unmarshal(raw, &k) != nil {
				return string(raw)
			}
			// bytes.EqualFold's equality (encoding/json's), by folding
			// each rune to the least of its orbit.
			return strings.Map(func(r rune) rune {
				for {
					r2 := unicode.SimpleFold(r)
					if r2 <= r {
						return r2
					}
					r = r2
				}
			}, k)
		}
		alike := false
		for i := range members {
			for j := range i {
				if !bytes.Equal(members[i].key, members[j].key) && read(members[i].key) == read(members[j].key) {
					alike = true
				}
			}
		}
		if alike {
			slices.SortStableFunc(members, func(a, b member) int { return strings.Compare(read(a.key), read(b.key)) })
		} else {
			slices.SortStableFunc(members, func(a, b member) int { return bytes.Compare(a.key, b.key) })
		}
		out.WriteByte('{')
		if alike {
			out.WriteByte(0)
		}
		for i, m := range members {
			if i > 0 {
				out.WriteByte(',')
			}
			out.Write(m.key)
			out.WriteByte(':')
			out.Write(m.val)
		}
		out.WriteByte('}')
	case '[':
		out.WriteByte('[')
		for i := range s.Elements() {
			if i > 0 {
				out.WriteByte(',')
			}
			referenceCanonical(s, out)
		}
		out.WriteByte(']')
	default:
		out.Write(s.Value())
	}
}

var canonicalCases = []string{
	`{}`, `[]`, `1`, `"x"`, `null`,
	`{"b":1,"a":2}`,
	`{"a":1,"a":2,"A":0,"a":3}`, // repeated keys keep their order
	`{"b":{"d":[1,{"z":0,"y":"x"}],"c":null},"a":[[],{},[{}]]}`,
	` { "model" : "gpt-4o" , "messages" : [ { "role" : "user", "content" : "héllo \u00e9 \" } ]" } ] } `,
	`{"\u0061":1,"a":2,"é":3,"e":4}`,
	`{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"ka":10,"kb":11,"kc":12,"kd":13,"ke":14,"kf":15,"kg":16,"kh":{"z":1,"y":{"x":[3,2,1]}}}`,
	`{"x":1.0,"y":-0,"z":1e10,"w":true,"v":false}`,
}

// TestFingerprintMatchesReference: the one-buffer canonicaliser gives the
// reference's fingerprint for every shape, including objects with more
// members than its stack array, repeated keys and deep nesting, and a
// pooled canonicaliser reused after a large body still does.
func TestFingerprintMatchesReference(t *testing.T) {
	deep := strings.Repeat(`{"b":[1,{"a":`, 200) + `0` + strings.Repeat(`}]}`, 200)
	cases := append(slices.Clone(canonicalCases), deep)
	var big strings.Builder
	big.WriteString(`{"z":"`)
	big.WriteString(strings.Repeat("x", 2*maxPooledCanon))
	big.WriteString(`","a":1}`)
	cases = append(cases, big.String())
	for round := range 2 {
		for _, body := range cases {
			if !json.Valid([]byte(body)) {
				t.Fatalf("case is not valid JSON: %.80s", body)
			}
			if got, want := fingerprintOf(t, []byte(body)), referenceFingerprint([]byte(body)); got != want {
				t.Errorf("round %d: Fingerprint(%.80s) = %s, reference %s", round, body, got, want)
			}
		}
	}
}

// TestFingerprintKeysReadAlike: two bodies whose keys an upstream reads as
// one key (escaped, or in another case) in another order are different
// requests — the upstream reads the last — and differ; the same body with
// its members reordered, or keys merely repeated as written, still
// matches; and a body without such keys canonicalises as it always did.
func TestFingerprintKeysReadAlike(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{`{"model":"claude-x","messages":[{"role":"user","content":"Say A"}],"\u006dessages":[{"role":"user","content":"Say B"}]}`,
			`{"model":"claude-x","\u006dessages":[{"role":"user","content":"Say B"}],"messages":[{"role":"user","content":"Say A"}]}`, false},
		{`{"user":"a","\u0075ser":"b"}`, `{"\u0075ser":"b","user":"a"}`, false},
		{`{"messages":[1],"Messages":[2]}`, `{"Messages":[2],"messages":[1]}`, false},
		{`{"x":{"messages":[1],"MESSAGES":[2]}}`, `{"x":{"MESSAGES":[2],"messages":[1]}}`, false},
		{`{"messages":[1],"Messages":[2],"model":"m"}`, `{"model":"m","messages":[1],"Messages":[2]}`, true},
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`, true},
		{`{"Model":"m","userId":1}`, `{"userId":1,"Model":"m"}`, true},
		{`{"a":1,"a":2}`, `{"a":2,"a":1}`, false},
		{`{"store":false,"ſtore":true}`, `{"ſtore":true,"store":false}`, false},
		{`{"bac\u212aground":true,"background":false}`, `{"background":false,"bac\u212aground":true}`, false},
	} {
		if got := fingerprintOf(t, []byte(tc.a)) == fingerprintOf(t, []byte(tc.b)); got != tc.same {
			t.Errorf("same fingerprint = %v for %s and %s, want %v", got, tc.a, tc.b, tc.same)
		}
	}
	// As first written: the body with its keys sorted by their bytes.
	sum := sha256.Sum256([]byte(`{"Model":"m","messages":[{"content":"hi","role":"user"}]}`))
	if got := fingerprintOf(t, []byte(`{"messages":[{"role":"user","content":"hi"}],"Model":"m"}`)); got != hex.EncodeToString(sum[:]) {
		t.Errorf("a body without keys read alike changed its fingerprint: %s", got)
	}
}

// FuzzFingerprintMatchesReference: on any valid JSON, the fingerprint is
// the reference's.
func FuzzFingerprintMatchesReference(f *testing.F) {
	for _, c := range canonicalCases {
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, body string) {
		if !json.Valid([]byte(body)) {
			return
		}
		if got, want := fingerprintOf(t, []byte(body)), referenceFingerprint([]byte(body)); got != want {
			t.Fatalf("Fingerprint(%q) = %s, reference %s", body, got, want)
		}
	})
}

func BenchmarkFingerprintObject(b *testing.B) {
	body := []byte(canonicalCases[len(canonicalCases)-2])
	b.ReportAllocs()
	for b.Loop() {
		_, _ = Fingerprint(body)
	}
}

// fingerprintOf is Fingerprint of a body within its bound.
func fingerprintOf(t testing.TB, body []byte) string {
	t.Helper()
	fp, err := Fingerprint(body)
	if err != nil {
		t.Fatalf("Fingerprint(%.80s): %v", body, err)
	}
	return fp
}

// manyMembers is an object of n members "K<i>":1 (upper case: the keys
// are checked for spellings read alike), inside depth objects.
func manyMembers(n, depth int) []byte {
	var b bytes.Buffer
	for range depth {
		b.WriteString(`{"x":`)
	}
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"K%d":1`, i)
	}
	b.WriteByte('}')
	for range depth {
		b.WriteByte('}')
	}
	return b.Bytes()
}

// A body whose objects hold more than MaxMembers members at once is
// refused, within a bounded memory: a 30 MB object of 2.4 million keys
// took ~0.5 GB to sort (the members' positions, the maps of keys read
// alike, a copy of the body's form), enough for one keyed request to end
// a 256 MiB gateway (found by the hostile-tenant run). Up to the bound a
// body is fingerprinted as before, nested objects counting their parents'
// members.
func TestFingerprintMembersBounded(t *testing.T) {
	body := manyMembers(1_000_000, 0) // 12 MB
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := Fingerprint(body); !errors.Is(err, ErrTooManyMembers) {
		t.Fatalf("1,000,000 members: %v, want ErrTooManyMembers", err)
	}
	runtime.ReadMemStats(&after)
	t.Logf("refusing %d bytes allocated %d", len(body), after.TotalAlloc-before.TotalAlloc)
	// The form's buffer (the body's size) and the members' positions; the
	// race detector's own allocations take up to as much again.
	if got, limit := after.TotalAlloc-before.TotalAlloc, 3*uint64(len(body))+16<<20; got > limit {
		t.Fatalf("refusing %d bytes allocated %d, want at most %d", len(body), got, limit)
	}
	for _, tc := range []struct {
		body []byte
		ok   bool
	}{
		{manyMembers(MaxMembers, 0), true},
		{manyMembers(MaxMembers+1, 0), false},
		{manyMembers(MaxMembers-3, 3), true},  // each parent holds one member ("x")
		{manyMembers(MaxMembers-2, 3), false}, // ... which counts
	} {
		if fp, err := Fingerprint(tc.body); tc.ok != (err == nil) {
			t.Errorf("%d bytes: %q, %v (want ok %v)", len(tc.body), fp, err, tc.ok)
		}
	}
	// Siblings do not add up: members of a finished object are not held.
	var b bytes.Buffer
	b.WriteByte('[')
	for i := range 3 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(manyMembers(MaxMembers/2, 0))
	}
	b.WriteByte(']')
	if _, err := Fingerprint(b.Bytes()); err != nil {
		t.Fatalf("three objects of %d members each: %v", MaxMembers/2, err)
	}
}
