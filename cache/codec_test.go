package cache

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

func sampleRecord() *Record {
	at := time.Date(2025, 11, 29, 13, 54, 0, 123456789, time.UTC)
	return &Record{
		State:       Committed,
		Fingerprint: "sha256:abc",
		Status:      200,
		Header: map[string][]string{
			"Content-Type":         {"text/event-stream"},
			"X-Request-Id":         {"r1"},
			"Openai-Processing-Ms": {"12", "13"},
		},
		Stream: true,
		Events: [][]byte{
			[]byte("data: {\"id\":\"1\"}\n\n"),
			[]byte("event: message\ndata: line one\ndata: line two\n\n"),
			[]byte("data: [DONE]\n\n"),
		},
		Upstream:  "openai",
		CreatedAt: at,
		ExpiresAt: at.Add(24 * time.Hour),
	}
}

func TestEncodeStartsWithVersionByte(t *testing.T) {
	b := encodeRecord(sampleRecord())
	if b[0] != codecV1 {
		t.Fatalf("first byte = %d, want version %d", b[0], codecV1)
	}
}

func TestDecodeUnknownVersion(t *testing.T) {
	b := encodeRecord(sampleRecord())
	b[0] = 2
	_, err := decodeRecord(b)
	if !errors.Is(err, errUnknownVersion) {
		t.Fatalf("decode version 2: err = %v, want errUnknownVersion", err)
	}
	if _, err := decodeRecord(nil); err == nil {
		t.Fatal("decode empty value: no error")
	}
}

func TestDecodeRejectsEveryTruncation(t *testing.T) {
	b := encodeRecord(sampleRecord())
	for n := range len(b) {
		if _, err := decodeRecord(b[:n]); err == nil {
			t.Fatalf("decode of the first %d of %d bytes: no error", n, len(b))
		}
	}
	if _, err := decodeRecord(append(b, 0)); err == nil {
		t.Fatal("decode with a trailing byte: no error")
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		want := randomRecord(rng)
		b := encodeRecord(want)
		got, err := decodeRecord(b)
		if err != nil {
			t.Fatalf("case %d: decode: %v", i, err)
		}
		assertSameRecord(t, got, want)
		if again := encodeRecord(got); !bytes.Equal(again, b) {
			t.Fatalf("case %d: re-encoding differs", i)
		}
	}
}

func randomRecord(rng *rand.Rand) *Record {
	str := func(max int) string {
		b := make([]byte, rng.IntN(max+1))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return string(b)
	}
	tm := func() time.Time {
		if rng.IntN(4) == 0 {
			return time.Time{}
		}
		return time.Unix(0, rng.Int64N(4e18)+1).UTC()
	}
	r := &Record{
		State:       State(1 + rng.IntN(2)),
		Fingerprint: str(64),
		Owner:       str(24),
		LeaseUntil:  tm(),
		Status:      rng.IntN(600),
		Stream:      rng.IntN(2) == 0,
		Upstream:    str(16),
		CreatedAt:   tm(),
		ExpiresAt:   tm(),
	}
	if n := rng.IntN(4); n > 0 {
		r.Header = make(map[string][]string, n)
		for range n {
			vals := make([]string, rng.IntN(3))
			for j := range vals {
				vals[j] = str(20)
			}
			r.Header[str(12)] = vals
		}
	}
	if rng.IntN(2) == 0 {
		r.Body = []byte(str(2048))
	}
	for range rng.IntN(5) {
		r.Events = append(r.Events, []byte(str(100)))
	}
	return r
}

// assertSameRecord compares what a client can observe: an empty body or
// header equals a missing one, times compare with Equal.
func assertSameRecord(t *testing.T, got, want *Record) {
	t.Helper()
	norm := func(r *Record) Record {
		c := *r
		if len(c.Body) == 0 {
			c.Body = nil
		}
		if len(c.Header) == 0 {
			c.Header = nil
		}
		for k, v := range c.Header {
			if len(v) == 0 {
				c.Header[k] = []string{}
			}
		}
		if len(c.Events) == 0 {
			c.Events = nil
		}
		c.Events = append([][]byte(nil), c.Events...)
		for i, e := range c.Events {
			if len(e) == 0 {
				c.Events[i] = nil
			}
		}
		c.LeaseUntil, c.CreatedAt, c.ExpiresAt = time.Time{}, time.Time{}, time.Time{}
		return c
	}
	g, w := norm(got), norm(want)
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("record differs:\n got %+v\nwant %+v", g, w)
	}
	for _, p := range [][2]time.Time{
		{got.LeaseUntil, want.LeaseUntil}, {got.CreatedAt, want.CreatedAt}, {got.ExpiresAt, want.ExpiresAt},
	} {
		if !p[0].Equal(p[1]) {
			t.Fatalf("time differs: got %v, want %v", p[0], p[1])
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(sampleRecord()))
	f.Add(encodeRecord(&Record{State: InFlight, Fingerprint: "f", Owner: "o"}))
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{2, 2, 0})
	f.Add([]byte{1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(bytes.Clone(b))
		if err != nil {
			return
		}
		// Whatever decodes re-encodes to a value that decodes the same.
		r2, err := decodeRecord(encodeRecord(r))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		assertSameRecord(t, r2, r)
	})
}

func TestStorageKeyLayout(t *testing.T) {
	k := Key{Scope: "acme", Endpoint: "/v1/chat/completions", ID: "abc-123"}
	got := storageKey(k)
	want := []byte("i\x00acme\x00/v1/chat/completions\x00abc-123")
	if !bytes.Equal(got, want) {
		t.Fatalf("storageKey = %q, want %q", got, want)
	}
}

func TestKeyValidate(t *testing.T) {
	long := string(bytes.Repeat([]byte("a"), MaxIDLen))
	for _, tc := range []struct {
		name string
		key  Key
		ok   bool
	}{
		{"plain", Key{Endpoint: "/v1/chat/completions", ID: "k1"}, true},
		{"max length", Key{ID: long}, true},
		{"space and tilde", Key{ID: " ~"}, true},
		{"empty id", Key{ID: ""}, false},
		{"too long", Key{ID: long + "a"}, false},
		{"control", Key{ID: "a\nb"}, false},
		{"non-ascii", Key{ID: "é"}, false},
		{"nul in scope", Key{Scope: "a\x00b", ID: "k"}, false},
		{"nul in endpoint", Key{Endpoint: "/\x00", ID: "k"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.key.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("error %v is not ErrInvalidKey", err)
			}
		})
	}
}

func BenchmarkEncodeDecode(b *testing.B) {
	r := sampleRecord()
	r.Body = bytes.Repeat([]byte("x"), 1024)
	b.ReportAllocs()
	for b.Loop() {
		v := encodeRecord(r)
		if _, err := decodeRecord(v); err != nil {
			b.Fatal(err)
		}
	}
}
