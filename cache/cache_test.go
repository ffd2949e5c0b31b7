package cache

import (
	"bytes"
	"errors"
	"testing"
)

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
