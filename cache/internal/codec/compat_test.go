package codec

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
)

// Records across versions. testdata/v1/*.bin are records as the previous
// release (commit 298fc4d, cache/codec.go's encodeRecord) wrote them, one
// per fixtureRecords entry: its codec and Record type were copied into a
// scratch module with these same records and each encodeRecord result
// written out. Badger and Redis hold exactly these bytes (Redis in the
// record hash's data field), so they are what a store upgraded in place,
// or shared by a fleet in a rolling upgrade, hands this release.
//
// Do not regenerate them with this release's encoder: their point is that
// they were not written by it.

var fixtureAt = time.Date(2026, 11, 30, 15, 0, 0, 123456789, time.UTC)

func fixtureRecords() map[string]*cache.Record {
	return map[string]*cache.Record{
		"committed-json": {
			State: cache.Committed, Fingerprint: "5d41402abc4b2a76b9719d911017c592", Status: 200,
			Header:   map[string][]string{"Content-Type": {"application/json"}, "X-Request-Id": {"req-4711"}},
			Body:     []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`),
			Upstream: "openai", CreatedAt: fixtureAt, ExpiresAt: fixtureAt.Add(24 * time.Hour),
		},
		"committed-stream": {
			State: cache.Committed, Fingerprint: "7d793037a0760186574b0282f2f435e7", Status: 200, Stream: true,
			Header: map[string][]string{"Content-Type": {"text/event-stream"}},
			Events: [][]byte{
				[]byte("data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n"),
				[]byte("data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi.\"},\"finish_reason\":null}]}\n\n"),
				[]byte("data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"),
				[]byte("data: [DONE]\n\n"),
			},
			Upstream: "azure", CreatedAt: fixtureAt, ExpiresAt: fixtureAt.Add(time.Hour),
		},
		"in-flight": {
			State: cache.InFlight, Fingerprint: "9e107d9d372bb6826bd81d3542a419d6", Owner: "Q2FKX7ZJ3LJ4TQ6M5W2B",
			LeaseUntil: fixtureAt.Add(30 * time.Second), CreatedAt: fixtureAt,
		},
		"not-stored-marker": {
			State: cache.Committed, Fingerprint: "e4d909c290d0fb1ca068ffaddf22cbd0", Status: 410,
			Header:   map[string][]string{"Content-Type": {"application/json"}, "X-Should-Retry": {"false"}, "X-Llmgate-Outcome": {"not_stored"}},
			Body:     []byte(`{"error":{"message":"The answer was served but not stored.","type":"invalid_request_error","param":null,"code":"idempotency_result_not_stored"}}`),
			Upstream: "openai", CreatedAt: fixtureAt, ExpiresAt: fixtureAt.Add(24 * time.Hour),
		},
	}
}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "v1", name+".bin"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The previous release's records decode to what it encoded.
func TestDecodesPreviousRelease(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("testdata", "v1", "*.bin"))
	if len(files) != len(fixtureRecords()) {
		t.Fatalf("%d fixtures in testdata/v1, %d records", len(files), len(fixtureRecords()))
	}
	for name, want := range fixtureRecords() {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeRecord(readFixture(t, name))
			if err != nil {
				t.Fatalf("a record of the previous release does not decode: %v", err)
			}
			for _, tm := range []struct{ got, want time.Time }{
				{got.LeaseUntil, want.LeaseUntil}, {got.CreatedAt, want.CreatedAt}, {got.ExpiresAt, want.ExpiresAt},
			} {
				if !tm.got.Equal(tm.want) {
					t.Fatalf("time %v, want %v", tm.got, tm.want)
				}
			}
			got.LeaseUntil, got.CreatedAt, got.ExpiresAt = want.LeaseUntil, want.CreatedAt, want.ExpiresAt
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

// What this release writes uncompressed, the previous one reads: the same
// version byte (its decoder refuses any other) and the very bytes it wrote
// for the same record, so its decoder reads them as it reads its own —
// from EncodeRecordV1 always (store.redis.write_v1_records), and from
// EncodeRecord for records too small to compress, as these fixtures are.
// A large compressible record is version 2, which the previous release
// refuses (README, upgrading a fleet). A layout change must add a version
// and fail this test on purpose.
func TestEncodesAsPreviousRelease(t *testing.T) {
	for name, r := range fixtureRecords() {
		t.Run(name, func(t *testing.T) {
			for enc, b := range map[string][]byte{"EncodeRecord": EncodeRecord(r), "EncodeRecordV1": EncodeRecordV1(r)} {
				if b[0] != 1 {
					t.Fatalf("%s: version byte %d: the previous release reads version 1 only", enc, b[0])
				}
				if old := readFixture(t, name); !bytes.Equal(b, old) {
					t.Fatalf("%s: this release encodes the record differently from the previous one:\n%x\n%x", enc, b, old)
				}
			}
		})
	}
	big := chatStreamRecord(40)
	if b := EncodeRecordV1(big); b[0] != recordV1 {
		t.Fatalf("EncodeRecordV1 of a large stream: version %d", b[0])
	}
	if b := EncodeRecord(big); b[0] != recordV2 {
		t.Fatalf("EncodeRecord of a large stream: version %d, want %d", b[0], recordV2)
	}
}
