package redisstore

import (
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

func TestRedisDeadLetterBound(t *testing.T) {
	redisAddr(t)
	storetest.RunDeadLetterBound(t, func(t *testing.T, now func() time.Time, b cache.DeadLetterBound) storetest.DeadLetterStore {
		return openTestRedis(t, Options{Now: now, DeadLetters: b})
	})
}
