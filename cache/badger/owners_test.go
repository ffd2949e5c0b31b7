package badgerstore

import (
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

func TestBadgerOwners(t *testing.T) {
	storetest.RunOwners(t, func(t *testing.T, now func() time.Time) storetest.OwnerStore {
		s, err := Open(Options{Dir: t.TempDir(), Now: now})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestOwnersSurviveReopen: an ownership entry is in Badger, not in process
// memory, so a restarted gateway still knows whose object an id is.
func TestOwnersSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	clock := storetest.NewClock()
	s := openStore(t, dir, clock)
	if err := s.PutOwner(ctx, "acme", "resp_1", cache.Owner{Upstream: "openai", Kind: "response"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, clock)
	got, err := s.GetOwner(ctx, "acme", "resp_1")
	if err != nil || got.Upstream != "openai" || got.Kind != "response" || got.Client != "acme" {
		t.Fatalf("after reopen: %+v, %v", got, err)
	}
}
