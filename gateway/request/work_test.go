package request

import (
	"context"
	"testing"
	"time"
)

// The detached count goes down once per detached call, even when the call
// ends before the handler gets to detach it.
func TestDetachedCountCannotLeak(t *testing.T) {
	s := newWorkSet(2)
	for range 5 {
		_, it, done := s.start(context.Background(), time.Time{})
		done()
		if !s.detach(it) {
			t.Fatal("detaching a finished call cancelled it")
		}
	}
	_, it, done := s.start(context.Background(), time.Time{})
	s.detach(it)
	done()
	if n := s.detached.Load(); n != 0 {
		t.Fatalf("detached = %d with nothing running", n)
	}
}
