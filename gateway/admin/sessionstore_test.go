package admin_test

import (
	"testing"
	"time"

	"github.com/llmgate/llmgate/gateway/admin"
	"github.com/llmgate/llmgate/gateway/admin/sessiontest"
)

func TestMemSessionsContract(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	sessiontest.Run(t, sessiontest.Options{
		New:     func(*testing.T) admin.SessionStore { return admin.NewMemSessions(func() time.Time { return now }) },
		Advance: func(d time.Duration) { now = now.Add(d) },
	})
}
