package admin

// Sign-in sessions of the page. The cookie carries a random session id,
// never the admin token: a copied cookie is worth at most one session,
// which signing out (or its expiry) ends for every replica that shares the
// store.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/llmgate/llmgate/cache"
)

// SessionStore keeps the page's sign-in sessions. A store that several
// replicas share (Redis) implements it, so a session begun on one replica
// is valid on all and signing out on one ends it on all; with any other
// store Admin keeps sessions in this process's memory.
//
// The contract, for an implementation (sessiontest.Run checks it):
//   - key is the hex SHA-256 of a session id (64 characters), never the
//     id itself, so a dump of the store reveals no usable cookie. Store it
//     under its own namespace (a prefix), as given.
//   - value is opaque (a small JSON document); store and return it as is.
//   - PutSession stores value under key, replacing any value there, to be
//     forgotten after ttl (> 0). It may be kept a little longer (Admin
//     checks expiry from the value itself), never shorter.
//   - GetSession returns the value, or an error wrapping cache.ErrNotFound
//     when there is none or its ttl has passed. Any other error means the
//     store could not answer; the page then treats the browser as signed
//     out.
//   - DeleteSession removes key; removing an absent key is not an error.
//     Once it returns, no replica's GetSession may return the value.
//
// It is declared here with standard types only, so that the stores below
// gateway can implement it without importing it.
type SessionStore interface {
	PutSession(ctx context.Context, key string, value []byte, ttl time.Duration) error
	GetSession(ctx context.Context, key string) ([]byte, error)
	DeleteSession(ctx context.Context, key string) error
}

// Session lifetimes.
const (
	// sessionTTL bounds a session from its sign-in: the operator signs in
	// again after it, however busy.
	sessionTTL = 8 * time.Hour
	// sessionIdle ends a session that has not been used for this long.
	// The page refreshes itself every few seconds, so only a session whose
	// page was closed goes idle.
	sessionIdle = time.Hour
	// sessionTouch is how stale a session's last-use time may get before a
	// request writes it back: the page's refresh every five seconds reads
	// the store, and writes to it once a minute.
	sessionTouch = time.Minute
)

// session is the value stored for a session.
type session struct {
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
	Seen    time.Time `json:"seen"`
}

// sessions issues, checks and revokes sign-in sessions in a SessionStore.
type sessions struct {
	store SessionStore
	now   func() time.Time
}

// sessionIDLen is the length of a session id: 32 random bytes, base64url.
var sessionIDLen = base64.RawURLEncoding.EncodedLen(32)

// sessionKey is the store key of a session id.
func sessionKey(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

// create begins a session and returns its id, for the cookie.
func (s *sessions) create(ctx context.Context) (string, error) {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it crashes the program instead)
	id := base64.RawURLEncoding.EncodeToString(b[:])
	now := s.now()
	v, err := json.Marshal(session{Created: now, Expires: now.Add(sessionTTL), Seen: now})
	if err != nil {
		return "", err
	}
	if err := s.store.PutSession(ctx, sessionKey(id), v, min(sessionTTL, sessionIdle)); err != nil {
		return "", fmt.Errorf("store session: %w", err)
	}
	return id, nil
}

// valid reports whether id names a live session, and marks it used. An
// error means the store could not say.
func (s *sessions) valid(ctx context.Context, id string) (bool, error) {
	if len(id) != sessionIDLen {
		return false, nil // not one of ours: the store need not be asked
	}
	key := sessionKey(id)
	b, err := s.store.GetSession(ctx, key)
	if errors.Is(err, cache.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read session: %w", err)
	}
	var v session
	now := s.now()
	if err := json.Unmarshal(b, &v); err != nil || !now.Before(v.Expires) || now.Sub(v.Seen) >= sessionIdle {
		_ = s.store.DeleteSession(ctx, key)
		return false, nil
	}
	if now.Sub(v.Seen) >= sessionTouch {
		v.Seen = now
		if b, err := json.Marshal(v); err == nil {
			// A failed write only shortens the session's idle time.
			_ = s.store.PutSession(ctx, key, b, min(v.Expires.Sub(now), sessionIdle))
		}
	}
	return true, nil
}

// revoke ends the session id names, on every replica sharing the store.
func (s *sessions) revoke(ctx context.Context, id string) error {
	if err := s.store.DeleteSession(ctx, sessionKey(id)); err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	return nil
}

// maxMemSessions bounds the in-memory store. Sessions begin only with the
// admin token, so it is reached only by a script signing in in a loop;
// then the session nearest its end is dropped.
const maxMemSessions = 10000

// memSessions is the SessionStore of a process whose store does not keep
// sessions: they last until they expire or the process ends.
type memSessions struct {
	mu  sync.Mutex
	now func() time.Time
	m   map[string]memSession
}

type memSession struct {
	value   []byte
	expires time.Time
}

func newMemSessions(now func() time.Time) *memSessions {
	return &memSessions{now: now, m: map[string]memSession{}}
}

// PutSession implements SessionStore.
func (m *memSessions) PutSession(_ context.Context, key string, value []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("session ttl %s: must be > 0", ttl)
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.m[key]; !ok && len(m.m) >= maxMemSessions {
		m.evict(now)
	}
	m.m[key] = memSession{value: append([]byte(nil), value...), expires: now.Add(ttl)}
	return nil
}

// evict drops every expired session, or if none has, the one nearest its
// end.
func (m *memSessions) evict(now time.Time) {
	var soonest string
	for k, s := range m.m {
		if !now.Before(s.expires) {
			delete(m.m, k)
			continue
		}
		if soonest == "" || s.expires.Before(m.m[soonest].expires) {
			soonest = k
		}
	}
	if len(m.m) >= maxMemSessions {
		delete(m.m, soonest)
	}
}

// GetSession implements SessionStore.
func (m *memSessions) GetSession(_ context.Context, key string) ([]byte, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.m[key]
	if !ok || !now.Before(s.expires) {
		delete(m.m, key)
		return nil, cache.ErrNotFound
	}
	return append([]byte(nil), s.value...), nil
}

// DeleteSession implements SessionStore.
func (m *memSessions) DeleteSession(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, key)
	return nil
}
