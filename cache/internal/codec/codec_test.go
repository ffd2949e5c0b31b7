package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
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
	b[0] = 3
	_, err := DecodeRecord(b)
	if !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("decode version 3: err = %v, want ErrUnknownVersion", err)
	}
	if _, err := DecodeRecord(nil); err == nil {
		t.Fatal("decode empty value: no error")
	}
}

func TestDecodeRejectsEveryTruncation(t *testing.T) {
	for _, r := range []*cache.Record{sampleRecord(), chatStreamRecord(20)} {
		b := EncodeRecord(r)
		for n := range len(b) {
			if _, err := DecodeRecord(b[:n]); err == nil {
				t.Fatalf("version %d: decode of the first %d of %d bytes: no error", b[0], n, len(b))
			}
		}
		if _, err := DecodeRecord(append(b, 0)); err == nil {
			t.Fatalf("version %d: decode with a trailing byte: no error", b[0])
		}
	}
}

// chatStreamRecord is a committed chat stream of n content chunks as
// providers send them: each chunk repeats the id, model and framing.
func chatStreamRecord(n int) *cache.Record {
	r := sampleRecord()
	r.Events = nil
	words := []string{"The", " gateway", " commits", " every", " answer", " under", " its", " key", ",", " once", "."}
	for i := range n {
		r.Events = append(r.Events, fmt.Appendf(nil, `data: {"id":"chatcmpl-Bx7k2QmZr9","object":"chat.completion.chunk","created":1764942000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_b8bc95a0ac","choices":[{"index":0,"delta":{"content":%q},"logprobs":null,"finish_reason":null}]}`+"\n\n", fmt.Sprint(words[i%len(words)], i)))
	}
	r.Events = append(r.Events, []byte("data: [DONE]\n\n"))
	return r
}

// A stream's events are written compressed (version 2), a few times
// smaller, and read back as they were; what does not shrink by an eighth,
// or is too small to bother, is written as version 1, which every release
// reads.
func TestCompressWherePays(t *testing.T) {
	stream := chatStreamRecord(40)
	raw := len(appendSection(nil, stream))
	b := EncodeRecord(stream)
	if b[0] != recordV2 {
		t.Fatalf("a 40-chunk stream record: version %d, want %d", b[0], recordV2)
	}
	if len(b)*4 > raw {
		t.Fatalf("a 40-chunk stream record of %d section bytes took %d stored", raw, len(b))
	}
	got, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	storetest.AssertSameRecord(t, got, stream)

	rng := rand.New(rand.NewPCG(3, 4))
	noise := sampleRecord()
	noise.Events = nil
	noise.Body = make([]byte, 4096)
	for i := range noise.Body {
		noise.Body[i] = byte(rng.IntN(256))
	}
	small := chatStreamRecord(1)
	for name, r := range map[string]*cache.Record{"incompressible": noise, "small": small} {
		if b := EncodeRecord(r); b[0] != recordV1 {
			t.Errorf("%s: version %d, want %d", name, b[0], recordV1)
		}
	}
}

// A corrupt compressed section is an error, never other bytes: a flipped
// bit anywhere after the header, and a block that claims to expand past
// maxExpansion (refused before it is allocated).
func TestCompressedCorruptionIsAnError(t *testing.T) {
	r := chatStreamRecord(20)
	b := EncodeRecord(r)
	head := len(appendHeader(nil, recordV2, r))
	for i := head; i < len(b); i++ {
		for bit := range 8 {
			c := bytes.Clone(b)
			c[i] ^= 1 << bit
			if got, err := DecodeRecord(c); err == nil {
				t.Fatalf("bit %d of byte %d flipped: decoded without error (%d events)", bit, i, len(got.Events))
			}
		}
	}
	for _, claim := range []struct {
		size, block uint64
		tail        int
	}{
		{1 << 30, 1 << 30, 16},                    // 1 GiB from 16 bytes
		{maxSection + 1, maxSection + 1, 1 << 20}, // under maxExpansion, over maxSection
		{1 << 10, 200 << 20, 1 << 20},             // the block's length flipped: the size disagrees
	} {
		huge := appendHeader(nil, recordV2, r)
		huge = binary.AppendUvarint(huge, claim.size)
		huge = append(huge, 0, 0, 0, 0)
		huge = binary.AppendUvarint(huge, claim.block)
		huge = append(huge, make([]byte, claim.tail)...)
		if _, err := DecodeRecord(huge); err == nil || !strings.Contains(err.Error(), "claims") {
			t.Fatalf("size %d, a block of %d bytes claiming %d: err = %v", claim.size, claim.tail, claim.block, err)
		}
	}
}

// A large stream record that flips one bit of its S2 length is refused
// before the length is allocated.
func TestCompressedFlippedLengthAllocatesNothing(t *testing.T) {
	r := chatStreamRecord(20000)
	b := EncodeRecord(r)
	if b[0] != recordV2 {
		t.Fatalf("version %d, want %d", b[0], recordV2)
	}
	at := len(appendHeader(nil, recordV2, r))
	_, n := binary.Uvarint(b[at:])
	lengthAt := at + n + 4
	for bit := range 7 {
		c := bytes.Clone(b)
		c[lengthAt+2] ^= 1 << bit
		allocs := testing.AllocsPerRun(1, func() {
			if _, err := DecodeRecord(c); err == nil {
				t.Fatalf("bit %d of the block's length flipped: no error", bit)
			}
		})
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		DecodeRecord(c)
		runtime.ReadMemStats(&ms)
		if grew := ms.TotalAlloc - before; grew > 1<<20 {
			t.Fatalf("bit %d of the block's length flipped: decoding allocated %d bytes (%v allocs)", bit, grew, allocs)
		}
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
	if rng.IntN(3) == 0 {
		// Compressible: written as version 2.
		chunk := []byte(str(200))
		for range rng.IntN(40) {
			r.Events = append(r.Events, chunk)
		}
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
	f.Add(EncodeRecord(chatStreamRecord(20)))
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

// TestEncodeManyHeadersIsDeterministic: a record with more header names
// than appendHeader sorts on its stack encodes to the same bytes every time
// (map iteration order differs from call to call) and decodes whole.
func TestEncodeManyHeadersIsDeterministic(t *testing.T) {
	r := sampleRecord()
	r.Header = make(map[string][]string)
	for i := range 40 {
		r.Header[fmt.Sprintf("X-H-%02d", 39-i)] = []string{fmt.Sprint(i)}
	}
	first := EncodeRecord(r)
	for range 20 {
		if again := EncodeRecord(r); !bytes.Equal(again, first) {
			t.Fatal("a record with 40 header names encoded to different bytes")
		}
	}
	got, err := DecodeRecord(first)
	if err != nil {
		t.Fatal(err)
	}
	storetest.AssertSameRecord(t, got, r)
}
