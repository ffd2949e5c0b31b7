package codec

import (
	"errors"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
)

func TestOwnerRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 30, 18, 0, 0, 123, time.UTC)
	o := cache.Owner{Upstream: "openai", Kind: "response", CreatedAt: at, ExpiresAt: at.Add(720 * time.Hour)}
	b := EncodeOwner(o)
	got, err := DecodeOwner(b)
	if err != nil {
		t.Fatal(err)
	}
	if got != o {
		t.Fatalf("decoded %+v, want %+v", got, o)
	}
	if len(b) > 48 {
		t.Errorf("encoded %d bytes, want a small entry (<= 48)", len(b))
	}
	if _, err := DecodeOwner(append([]byte{9}, b[1:]...)); !errors.Is(err, ErrUnknownVersion) {
		t.Errorf("other version: err = %v, want ErrUnknownVersion", err)
	}
	if _, err := DecodeOwner(b[:len(b)-2]); err == nil {
		t.Error("truncated: no error")
	}
	if _, err := DecodeOwner(append(b, 0)); err == nil {
		t.Error("trailing byte: no error")
	}
}
