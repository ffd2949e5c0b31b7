package storetest

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
)

// OwnerStore is what RunOwners exercises: the ownership entries of
// provider objects (see cache.Owner).
type OwnerStore interface {
	PutOwner(ctx context.Context, scope, id string, o cache.Owner, ttl time.Duration) error
	GetOwner(ctx context.Context, scope, id string) (cache.Owner, error)
	PurgeScope(ctx context.Context, scope string) (cache.Purged, error)
	ScanOwners(ctx context.Context, scope string, fn func(cache.CommittedRecord) error) error
}

// RunOwners runs the ownership behaviour every store must share, each case
// on a fresh, empty store that open returns on the given clock.
func RunOwners(t *testing.T, open func(t *testing.T, now func() time.Time) OwnerStore) {
	runOwnerPutGet(t, open)
	runOwnerScopes(t, open)
	runOwnerExpiry(t, open)
	runOwnerReplace(t, open)
	runOwnerPurge(t, open)
	runOwnerInvalid(t, open)
	runOwnerScan(t, open)
}

// ownerOpener is RunOwners' open.
type ownerOpener = func(t *testing.T, now func() time.Time) OwnerStore

const day = 24 * time.Hour

// sampleOwner is an entry to put.
var sampleOwner = cache.Owner{Upstream: "openai", Kind: "response"}

// runOwnerPutGet checks that a put entry is read back with its client and
// times.
func runOwnerPutGet(t *testing.T, open ownerOpener) {
	t.Run("put then get", func(t *testing.T) {
		clock := NewClock()
		s := open(t, clock.Now)
		if err := s.PutOwner(ctx, "acme", "resp_1", sampleOwner, 30*day); err != nil {
			t.Fatalf("PutOwner: %v", err)
		}
		got, err := s.GetOwner(ctx, "acme", "resp_1")
		if err != nil {
			t.Fatalf("GetOwner: %v", err)
		}
		want := cache.Owner{Client: "acme", Upstream: "openai", Kind: "response",
			CreatedAt: clock.Now(), ExpiresAt: clock.Now().Add(30 * day)}
		if !got.CreatedAt.Equal(want.CreatedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) {
			t.Fatalf("times = %v, %v; want %v, %v", got.CreatedAt, got.ExpiresAt, want.CreatedAt, want.ExpiresAt)
		}
		got.CreatedAt, got.ExpiresAt, want.CreatedAt, want.ExpiresAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if got != want {
			t.Fatalf("GetOwner = %+v, want %+v", got, want)
		}
	})
}

// runOwnerScopes checks that an entry is seen only in its own scope, under
// its own id.
func runOwnerScopes(t *testing.T, open ownerOpener) {
	t.Run("another scope does not see it", func(t *testing.T) {
		s := open(t, NewClock().Now)
		if err := s.PutOwner(ctx, "acme", "file-1", cache.Owner{Upstream: "openai", Kind: "file"}, day); err != nil {
			t.Fatal(err)
		}
		for _, scope := range []string{"globex", "", "acm", "acme:"} {
			if _, err := s.GetOwner(ctx, scope, "file-1"); !errors.Is(err, cache.ErrNotFound) {
				t.Errorf("GetOwner(%q) err = %v, want ErrNotFound", scope, err)
			}
		}
		if _, err := s.GetOwner(ctx, "acme", "file-2"); !errors.Is(err, cache.ErrNotFound) {
			t.Errorf("unknown id: err = %v, want ErrNotFound", err)
		}
	})
}

// runOwnerExpiry checks that an entry expires at its ttl by the store's
// clock.
func runOwnerExpiry(t *testing.T, open ownerOpener) {
	t.Run("expires by the store's clock", func(t *testing.T) {
		clock := NewClock()
		s := open(t, clock.Now)
		if err := s.PutOwner(ctx, "acme", "batch_1", cache.Owner{Upstream: "openai", Kind: "batch"}, day); err != nil {
			t.Fatal(err)
		}
		clock.Advance(day - time.Second)
		if _, err := s.GetOwner(ctx, "acme", "batch_1"); err != nil {
			t.Fatalf("before its ttl: %v", err)
		}
		clock.Advance(time.Second)
		if _, err := s.GetOwner(ctx, "acme", "batch_1"); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("at its ttl: err = %v, want ErrNotFound", err)
		}
	})
}

// runOwnerReplace checks that a second put of an id replaces the first.
func runOwnerReplace(t *testing.T, open ownerOpener) {
	t.Run("put replaces", func(t *testing.T) {
		s := open(t, NewClock().Now)
		if err := s.PutOwner(ctx, "acme", "vs_1", cache.Owner{Upstream: "a", Kind: "vector_store"}, day); err != nil {
			t.Fatal(err)
		}
		if err := s.PutOwner(ctx, "acme", "vs_1", cache.Owner{Upstream: "b", Kind: "vector_store"}, day); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetOwner(ctx, "acme", "vs_1"); err != nil || got.Upstream != "b" {
			t.Fatalf("GetOwner = %+v, %v; want upstream b", got, err)
		}
	})
}

// runOwnerPurge checks that PurgeScope removes one scope's entries and only
// those.
func runOwnerPurge(t *testing.T, open ownerOpener) {
	t.Run("purged with its scope", func(t *testing.T) {
		s := open(t, NewClock().Now)
		for _, e := range []struct{ scope, id string }{{"acme", "resp_1"}, {"acme", "file-1"}, {"acme:x", "resp_2"}, {"globex", "resp_1"}} {
			if err := s.PutOwner(ctx, e.scope, e.id, sampleOwner, day); err != nil {
				t.Fatal(err)
			}
		}
		p, err := s.PurgeScope(ctx, "acme")
		if err != nil || p != (cache.Purged{Owners: 2}) {
			t.Fatalf("PurgeScope = %+v, %v; want 2 owners", p, err)
		}
		for _, e := range []struct {
			scope, id string
			kept      bool
		}{{"acme", "resp_1", false}, {"acme", "file-1", false}, {"acme:x", "resp_2", true}, {"globex", "resp_1", true}} {
			if _, err := s.GetOwner(ctx, e.scope, e.id); (err == nil) != e.kept {
				t.Errorf("after purge, GetOwner(%q, %q) err = %v, kept want %v", e.scope, e.id, err, e.kept)
			}
		}
	})
}

// runOwnerInvalid checks that an empty id, a bad scope or id and a zero ttl
// are refused.
func runOwnerInvalid(t *testing.T, open ownerOpener) {
	t.Run("invalid arguments", func(t *testing.T) {
		s := open(t, NewClock().Now)
		for _, tc := range []struct {
			scope, id string
			ttl       time.Duration
		}{{"acme", "", day}, {"ac\x00me", "x", day}, {"acme", "id\n", day}, {"acme", "x", 0}} {
			if err := s.PutOwner(ctx, tc.scope, tc.id, sampleOwner, tc.ttl); err == nil {
				t.Errorf("PutOwner(%q, %q, %v): no error", tc.scope, tc.id, tc.ttl)
			}
		}
		if _, err := s.GetOwner(ctx, "acme", ""); !errors.Is(err, cache.ErrNotFound) {
			t.Errorf("GetOwner of an empty id: err = %v, want ErrNotFound", err)
		}
	})
}

// runOwnerScan checks that ScanOwners reports each live entry of its
// scope once, with a size that grows with the id and its expiry, and no
// expired entry and none of another scope.
func runOwnerScan(t *testing.T, open ownerOpener) {
	t.Run("scan", func(t *testing.T) {
		clock := NewClock()
		s := open(t, clock.Now)
		for _, e := range []struct {
			scope, id string
			ttl       time.Duration
		}{{"acme", "resp_1", 30 * day}, {"acme", "file-" + strings.Repeat("x", 100), 30 * day},
			{"acme", "conv_1", time.Hour}, {"acme2", "resp_2", 30 * day}, {"ac*", "resp_3", 30 * day}} {
			if err := s.PutOwner(ctx, e.scope, e.id, sampleOwner, e.ttl); err != nil {
				t.Fatalf("PutOwner(%s, %s): %v", e.scope, e.id, err)
			}
		}
		scanned := func() []cache.CommittedRecord {
			var got []cache.CommittedRecord
			if err := s.ScanOwners(ctx, "acme", func(r cache.CommittedRecord) error { got = append(got, r); return nil }); err != nil {
				t.Fatalf("ScanOwners: %v", err)
			}
			slices.SortFunc(got, func(a, b cache.CommittedRecord) int { return cmp.Compare(a.Size, b.Size) })
			return got
		}
		got := scanned()
		if len(got) != 3 {
			t.Fatalf("ScanOwners(acme) = %v, want its 3 entries", got)
		}
		if got[0].Size < int64(len("resp_1")) || got[2].Size < got[0].Size+95 {
			t.Fatalf("sizes %v: the long id's entry should be ~95 bytes larger", got)
		}
		if long := got[2]; !long.ExpiresAt.Equal(clock.Now().Add(30 * day)) {
			t.Fatalf("expiry %v, want %v", long.ExpiresAt, clock.Now().Add(30*day))
		}
		clock.Advance(2 * time.Hour)
		if got := scanned(); len(got) != 2 {
			t.Fatalf("after the hour entry expired: %v, want 2 entries", got)
		}
	})
}
