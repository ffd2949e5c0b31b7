package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
)

// Operator sessions of the admin page (admin.SessionStore), shared by every
// replica: a browser signed in on one replica stays signed in whichever
// replica its next request reaches, and signing out on one ends the
// session on all. key is already the hex SHA-256 of the session id (a
// dump of the store reveals no live cookie); value is opaque.

func (s *Store) sessionKey(key string) string { return s.prefix + redisSessionNS + key }

// PutSession stores value under key for ttl, replacing value and TTL.
func (s *Store) PutSession(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("put session: ttl %v must be positive", ttl)
	}
	return s.client.Set(ctx, s.sessionKey(key), value, ttl).Err()
}

// GetSession returns the value under key, or an error wrapping
// cache.ErrNotFound when it is absent or expired.
func (s *Store) GetSession(ctx context.Context, key string) ([]byte, error) {
	b, err := s.client.Get(ctx, s.sessionKey(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("session: %w", cache.ErrNotFound)
	}
	return b, err
}

// DeleteSession removes key; an absent key is not an error.
func (s *Store) DeleteSession(ctx context.Context, key string) error {
	return s.client.Del(ctx, s.sessionKey(key)).Err()
}
