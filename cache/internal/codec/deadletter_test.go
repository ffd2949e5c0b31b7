package codec

import (
	"testing"

	"github.com/llmgate/llmgate/cache"
)

// A dead letter keeps saying that its body was not kept across the store,
// and a letter written before that flag existed still reads, as kept.
func TestDeadLetterBodyNotKept(t *testing.T) {
	in := &cache.DeadLetter{ID: "a1", Client: "team-a", Endpoint: "/v1/files", Key: "upload-1", BodySize: 2048, BodyNotKept: true}
	b, err := EncodeDeadLetter(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeDeadLetter(b)
	if err != nil {
		t.Fatal(err)
	}
	if !out.BodyNotKept || out.BodySize != 2048 || len(out.Body) != 0 {
		t.Fatalf("round trip: %+v", out)
	}

	// As the previous release wrote it: no body_not_kept.
	old := append([]byte{deadLetterV1}, `{"id":"b2","client":"team-a","endpoint":"/v1/chat/completions","idempotency_key":"k","body_size":5,"upstreams":["primary"],"attempts":2,"failures":1,"class":"transient","message":"m","first_at":"2026-01-02T03:04:05Z","last_at":"2026-01-02T03:04:05Z","expires_at":"2026-01-09T03:04:05Z","body":"aGVsbG8="}`...)
	d, err := DecodeDeadLetter(old)
	if err != nil {
		t.Fatal(err)
	}
	if d.BodyNotKept || string(d.Body) != "hello" || d.Key != "k" {
		t.Fatalf("previous release's letter: %+v", d)
	}
}

// A dead letter keeps its request's query across the store; one written
// before the query was kept reads with none (it replays to its path, as
// it did).
func TestDeadLetterQuery(t *testing.T) {
	in := &cache.DeadLetter{ID: "a1", Endpoint: "/v1/images/generations", Key: "k", Query: "api-version=2024-10-21"}
	b, err := EncodeDeadLetter(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeDeadLetter(b)
	if err != nil || out.Query != in.Query {
		t.Fatalf("round trip: %+v %v", out, err)
	}
	old := append([]byte{deadLetterV1}, `{"id":"b2","client":"","endpoint":"/v1/images/generations","idempotency_key":"k","body_size":5,"upstreams":["primary"],"attempts":1,"failures":1,"class":"transient","message":"m","first_at":"2026-01-02T03:04:05Z","last_at":"2026-01-02T03:04:05Z","expires_at":"2026-01-09T03:04:05Z","body":"aGVsbG8="}`...)
	d, err := DecodeDeadLetter(old)
	if err != nil || d.Query != "" || string(d.Body) != "hello" {
		t.Fatalf("previous release's letter: %+v %v", d, err)
	}
}
