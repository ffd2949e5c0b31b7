package codec

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

func sampleRecord() *cache.Record {
	at := time.Date(2025, 11, 29, 13, 54, 0, 123456789, time.UTC)
	return &cache.Record{
		State:       cache.Committed,
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
	b := EncodeRecord(sampleRecord())
	if b[0] != recordV1 {
		t.Fatalf("first byte = %d, want version %d", b[0], recordV1)
	}
}

func TestDecodeUnknownVersion(t *testing.T) {
	b := EncodeRecord(sampleRecord())
	b[0] = 2
	_, err := DecodeRecord(b)
	if !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("decode version 2: err = %v, want ErrUnknownVersion", err)
	}
	if _, err := DecodeRecord(nil); err == nil {
		t.Fatal("decode empty value: no error")
	}
}

func TestDecodeRejectsEveryTruncation(t *testing.T) {
	b := EncodeRecord(sampleRecord())
	for n := range len(b) {
		if _, err := DecodeRecord(b[:n]); err == nil {
			t.Fatalf("decode of the first %d of %d bytes: no error", n, len(b))
		}
	}
	if _, err := DecodeRecord(append(b, 0)); err == nil {
		t.Fatal("decode with a trailing byte: no error")
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		want := randomRecord(rng)
		b := EncodeRecord(want)
		got, err := DecodeRecord(b)
		if err != nil {
			t.Fatalf("case %d: decode: %v", i, err)
		}
		storetest.AssertSameRecord(t, got, want)
		if again := EncodeRecord(got); !bytes.Equal(again, b) {
			t.Fatalf("case %d: re-encoding differs", i)
		}
	}
}

func randomRecord(rng *rand.Rand) *cache.Record {
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
	r := &cache.Record{
		State:       cache.State(1 + rng.IntN(2)),
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

func FuzzDecodeRecord(f *testing.F) {
	f.Add(EncodeRecord(sampleRecord()))
	f.Add(EncodeRecord(&cache.Record{State: cache.InFlight, Fingerprint: "f", Owner: "o"}))
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{2, 2, 0})
	f.Add([]byte{1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRecord(bytes.Clone(b))
		if err != nil {
			return
		}
		// Whatever decodes re-encodes to a value that decodes the same.
		r2, err := DecodeRecord(EncodeRecord(r))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		storetest.AssertSameRecord(t, r2, r)
	})
}

func BenchmarkEncodeDecode(b *testing.B) {
	r := sampleRecord()
	r.Body = bytes.Repeat([]byte("x"), 1024)
	b.ReportAllocs()
	for b.Loop() {
		v := EncodeRecord(r)
		if _, err := DecodeRecord(v); err != nil {
			b.Fatal(err)
		}
	}
}
