package admin

import "time"

// NewMemSessions lets the external test package run sessiontest on the
// in-memory store.
func NewMemSessions(now func() time.Time) SessionStore { return newMemSessions(now) }
