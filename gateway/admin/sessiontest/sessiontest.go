// Package sessiontest is the behaviour every admin.SessionStore must show,
// as one suite: the in-memory store runs it, and so should each store that
// implements the interface (Redis, for sessions shared by replicas).
package sessiontest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/gateway/admin"
)

// Options describe the store under test.
type Options struct {
	// New returns an empty store. Required.
	New func(t *testing.T) admin.SessionStore
	// Advance moves the store's clock forward by d (a fake clock, or
	// miniredis's FastForward). If nil, expiry is not tested.
	Advance func(d time.Duration)
}

// key is a store key as Admin makes them: the hex SHA-256 of a session id.
func key(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

// Run runs the suite.
func Run(t *testing.T, o Options) {
	ctx := context.Background()
	t.Run("absent", func(t *testing.T) {
		s := o.New(t)
		if _, err := s.GetSession(ctx, key("nobody")); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("GetSession of an absent key: %v, want cache.ErrNotFound", err)
		}
		if err := s.DeleteSession(ctx, key("nobody")); err != nil {
			t.Fatalf("DeleteSession of an absent key: %v, want nil", err)
		}
	})
	t.Run("put get delete", func(t *testing.T) {
		s := o.New(t)
		k, v := key("a"), []byte(`{"created":"2026-01-02T03:04:05Z"}`)
		if err := s.PutSession(ctx, k, v, time.Hour); err != nil {
			t.Fatal(err)
		}
		v[0] = 'X' // the store keeps its own copy
		got, err := s.GetSession(ctx, k)
		if err != nil || !bytes.Equal(got, []byte(`{"created":"2026-01-02T03:04:05Z"}`)) {
			t.Fatalf("GetSession = %q, %v", got, err)
		}
		if _, err := s.GetSession(ctx, key("b")); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("another key: %v", err)
		}
		if err := s.DeleteSession(ctx, k); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetSession(ctx, k); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("after DeleteSession: %v, want cache.ErrNotFound", err)
		}
	})
	t.Run("put replaces", func(t *testing.T) {
		s := o.New(t)
		k := key("a")
		for _, v := range []string{"one", "two"} {
			if err := s.PutSession(ctx, k, []byte(v), time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := s.GetSession(ctx, k); err != nil || string(got) != "two" {
			t.Fatalf("GetSession = %q, %v, want two", got, err)
		}
	})
	if o.Advance == nil {
		return
	}
	t.Run("ttl", func(t *testing.T) {
		s := o.New(t)
		short, long := key("short"), key("long")
		if err := s.PutSession(ctx, short, []byte("s"), time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.PutSession(ctx, long, []byte("l"), time.Hour); err != nil {
			t.Fatal(err)
		}
		o.Advance(59 * time.Second)
		if _, err := s.GetSession(ctx, short); err != nil {
			t.Fatalf("before its ttl: %v", err)
		}
		o.Advance(2 * time.Second)
		if _, err := s.GetSession(ctx, short); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("after its ttl: %v, want cache.ErrNotFound", err)
		}
		if _, err := s.GetSession(ctx, long); err != nil {
			t.Fatalf("the other key, before its ttl: %v", err)
		}
		// A put sets a new ttl.
		if err := s.PutSession(ctx, long, []byte("l2"), time.Minute); err != nil {
			t.Fatal(err)
		}
		o.Advance(61 * time.Second)
		if _, err := s.GetSession(ctx, long); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("after the ttl of its last put: %v, want cache.ErrNotFound", err)
		}
	})
}
