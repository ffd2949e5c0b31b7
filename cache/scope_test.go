package cache

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

func TestStoredSize(t *testing.T) {
	r := &Record{
		Fingerprint: "fp12",                                                    // 4
		Upstream:    "openai",                                                  // 6
		Header:      map[string][]string{"Content-Type": {"application/json"}}, // 12 + 16
		Body:        []byte("0123456789"),                                      // 10
	}
	if got, want := r.StoredSize(), int64(RecordOverhead+4+6+12+16+10); got != want {
		t.Fatalf("StoredSize = %d, want %d", got, want)
	}
	s := &Record{Stream: true, Events: [][]byte{[]byte("data: 1\n\n"), []byte("data: [DONE]\n\n")}}
	if got, want := s.StoredSize(), int64(RecordOverhead+9+14); got != want {
		t.Fatalf("stream StoredSize = %d, want %d", got, want)
	}
}

// TestDeadLetterIDStable: a dead letter's id is stored with it and given to
// operators, so it is the hash it always was: sha256 of scope, endpoint and
// id, NUL-separated, first 12 bytes in hex.
func TestDeadLetterIDStable(t *testing.T) {
	long := strings.Repeat("k", MaxIDLen)
	for _, k := range []Key{
		{ID: "order-1"},
		{Scope: "alice", Endpoint: "/v1/chat/completions", ID: "order-1"},
		{Scope: strings.Repeat("s", 600), Endpoint: "/v1/messages", ID: long}, // past the stack buffer
	} {
		h := sha256.New()
		h.Write([]byte(k.Scope + "\x00" + k.Endpoint + "\x00" + k.ID))
		if got, want := DeadLetterID(k), hex.EncodeToString(h.Sum(nil)[:12]); got != want {
			t.Errorf("DeadLetterID(%.40v) = %s, want %s", k, got, want)
		}
	}
	if DeadLetterID(Key{Scope: "a", ID: "b"}) == DeadLetterID(Key{Scope: "ab"}) {
		t.Error("scope and id run together")
	}
}
