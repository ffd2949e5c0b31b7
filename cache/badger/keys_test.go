package badgerstore

import (
	"bytes"
	"testing"

	"github.com/llmgate/llmgate/cache"
)

func TestStorageKeyLayout(t *testing.T) {
	k := cache.Key{Scope: "acme", Endpoint: "/v1/chat/completions", ID: "abc-123"}
	got := storageKey(k)
	want := []byte("i\x00acme\x00/v1/chat/completions\x00abc-123")
	if !bytes.Equal(got, want) {
		t.Fatalf("storageKey = %q, want %q", got, want)
	}
	if got := deadLetterKey("abc"); !bytes.Equal(got, []byte("d\x00abc")) {
		t.Fatalf("deadLetterKey = %q", got)
	}
}
