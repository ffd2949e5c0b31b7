package admin

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// clock is a fake clock for the tests.
type clock struct{ t time.Time }

func newClock() *clock                   { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }
func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

// countingStore counts the calls that reach a SessionStore, and can fail
// them.
type countingStore struct {
	SessionStore
	gets, puts int
	fail       error
}

func (s *countingStore) GetSession(ctx context.Context, key string) ([]byte, error) {
	s.gets++
	if s.fail != nil {
		return nil, s.fail
	}
	return s.SessionStore.GetSession(ctx, key)
}

func (s *countingStore) PutSession(ctx context.Context, key string, v []byte, ttl time.Duration) error {
	s.puts++
	if s.fail != nil {
		return s.fail
	}
	return s.SessionStore.PutSession(ctx, key, v, ttl)
}

func TestSessionLifetime(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	mem := newMemSessions(c.now)
	store := &countingStore{SessionStore: mem}
	s := &sessions{store: store, now: c.now}
	valid := func(id string) bool {
		t.Helper()
		ok, err := s.valid(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	id, err := s.create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(id) != 43 || strings.ContainsAny(id, "+/=") {
		t.Fatalf("session id %q is not 32 bytes of unpadded base64url", id)
	}
	// The store knows the session by its id's SHA-256 only.
	for k, v := range mem.m {
		if k != sessionKey(id) || strings.Contains(k, id) || strings.Contains(string(v.value), id) {
			t.Fatalf("store key %q value %q: want only the id's SHA-256 as key", k, v.value)
		}
	}
	if !valid(id) {
		t.Fatal("a new session is not valid")
	}

	// Used every 50 minutes it stays valid, however long that goes on,
	// until 8 hours after the sign-in.
	for elapsed := 50 * time.Minute; elapsed < sessionTTL; elapsed += 50 * time.Minute {
		c.advance(50 * time.Minute)
		if !valid(id) {
			t.Fatalf("session in use ended after %s", elapsed)
		}
	}
	c.t = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).Add(sessionTTL)
	if valid(id) {
		t.Fatal("session valid 8 hours after sign-in")
	}

	// Left alone for an hour, it ends.
	id, _ = s.create(ctx)
	c.advance(sessionIdle - time.Second)
	if !valid(id) {
		t.Fatal("session ended before its idle time")
	}
	c.advance(sessionIdle)
	if valid(id) {
		t.Fatal("session valid after an hour unused")
	}

	// Uses within a minute read the store and do not write it.
	id, _ = s.create(ctx)
	puts := store.puts
	for range 10 {
		c.advance(5 * time.Second)
		valid(id)
	}
	if store.puts != puts {
		t.Errorf("%d writes for 10 uses within a minute, want none", store.puts-puts)
	}

	// Revoked, it ends.
	if err := s.revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	if valid(id) {
		t.Fatal("session valid after revoke")
	}

	// What is not a session id does not reach the store.
	gets := store.gets
	for _, junk := range []string{"", "admin-secret-token", strings.Repeat("x", 4096)} {
		if valid(junk) {
			t.Fatalf("%q is a valid session", junk)
		}
	}
	if store.gets != gets {
		t.Errorf("junk ids read the store %d times", store.gets-gets)
	}

	// A store that cannot answer: not valid, and an error to log.
	id, _ = s.create(ctx)
	store.fail = errors.New("connection refused")
	if ok, err := s.valid(ctx, id); ok || err == nil {
		t.Fatalf("valid with a failing store = %v, %v", ok, err)
	}
	if _, err := s.create(ctx); err == nil {
		t.Fatal("create with a failing store succeeded")
	}
}

func TestMemSessionsBounded(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	m := newMemSessions(c.now)
	for i := range maxMemSessions + 10 {
		c.advance(time.Millisecond)
		if err := m.PutSession(ctx, sessionKey(string(rune(i))+"x"), []byte("v"), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if len(m.m) != maxMemSessions {
		t.Fatalf("%d sessions kept, want the cap %d", len(m.m), maxMemSessions)
	}
	// The newest is kept; the oldest made room.
	if _, err := m.GetSession(ctx, sessionKey(string(rune(maxMemSessions+9))+"x")); err != nil {
		t.Fatalf("newest session: %v", err)
	}
	if _, err := m.GetSession(ctx, sessionKey(string(rune(0))+"x")); err == nil {
		t.Fatal("oldest session kept past the cap")
	}
	if err := m.PutSession(ctx, "k", []byte("v"), 0); err == nil {
		t.Fatal("a put with no ttl was accepted")
	}
}
