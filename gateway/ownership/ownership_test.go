package ownership

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	badgerstore "github.com/llmgate/llmgate/cache/badger"
	"github.com/llmgate/llmgate/cache/storetest"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/apierror"
)

func newOwners(t *testing.T, clock *storetest.Clock) *Owners {
	t.Helper()
	s, err := badgerstore.Open(badgerstore.Options{Dir: t.TempDir(), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return New(Options{Store: s, TTL: config.OwnershipTTL{Responses: config.Duration(time.Hour)}})
}

func wantStatus(t *testing.T, err error, status int, code string) {
	t.Helper()
	var e *apierror.Error
	if !errors.As(err, &e) || e.Status != status || e.Code != code || e.Type != "invalid_request_error" {
		t.Fatalf("err = %#v, want %d %s", err, status, code)
	}
}

func TestRecordCheck(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewClock()
	o := newOwners(t, clock)
	if err := o.Record(ctx, "alice", "openai", []Ref{{Kind: Response, ID: "resp_a"}, {Kind: File, ID: "file-a"}}, nil); err != nil {
		t.Fatal(err)
	}
	up, err := o.Check(ctx, "alice", []Ref{{Kind: Response, ID: "resp_a"}, {Kind: File, ID: "file-a", Param: "file_id"}})
	if err != nil || up != "openai" {
		t.Fatalf("owner's check = %q, %v; want openai", up, err)
	}
	if up, err := o.Check(ctx, "bob", nil); err != nil || up != "" {
		t.Fatalf("no refs = %q, %v", up, err)
	}
	// Another client's id and an unknown id get the same answer.
	_, errOther := o.Check(ctx, "bob", []Ref{{Kind: Response, ID: "resp_a"}})
	_, errUnknown := o.Check(ctx, "bob", []Ref{{Kind: Response, ID: "resp_zz"}})
	wantStatus(t, errOther, http.StatusNotFound, "response_not_found")
	wantStatus(t, errUnknown, http.StatusNotFound, "response_not_found")
	_, err = o.Check(ctx, "bob", []Ref{{Kind: Response, ID: "resp_a", Param: "previous_response_id"}})
	wantStatus(t, err, http.StatusNotFound, "previous_response_not_found")
	// An id of another kind is not found either: a file id is no response.
	_, err = o.Check(ctx, "alice", []Ref{{Kind: Response, ID: "file-a"}})
	wantStatus(t, err, http.StatusNotFound, "response_not_found")
	// The ttl: responses were configured to 1h, files keep the default.
	clock.Advance(time.Hour)
	_, err = o.Check(ctx, "alice", []Ref{{Kind: Response, ID: "resp_a"}})
	wantStatus(t, err, http.StatusNotFound, "response_not_found")
	if _, err := o.Check(ctx, "alice", []Ref{{Kind: File, ID: "file-a"}}); err != nil {
		t.Fatalf("file after 1h: %v", err)
	}
}

func TestCheckTwoUpstreams(t *testing.T) {
	ctx := context.Background()
	o := newOwners(t, storetest.NewClock())
	if err := o.Record(ctx, "alice", "openai", []Ref{{Kind: Response, ID: "resp_a"}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := o.Record(ctx, "alice", "azure", []Ref{{Kind: File, ID: "file-z"}}, nil); err != nil {
		t.Fatal(err)
	}
	_, err := o.Check(ctx, "alice", []Ref{{Kind: Response, ID: "resp_a"}, {Kind: File, ID: "file-z", Param: "file_id"}})
	wantStatus(t, err, http.StatusBadRequest, "")
}

// failing is a store that is down.
type failing struct{}

func (failing) PutOwner(context.Context, string, string, cache.Owner, time.Duration) error {
	return cache.ErrClosed
}
func (failing) GetOwner(context.Context, string, string) (cache.Owner, error) {
	return cache.Owner{}, cache.ErrClosed
}

// TestStoreDownFailsClosed: without the store nothing is checked as
// allowed and no id is handed out unrecorded.
func TestStoreDownFailsClosed(t *testing.T) {
	o := New(Options{Store: failing{}})
	ctx := context.Background()
	for name, err := range map[string]error{
		"record": o.Record(ctx, "alice", "openai", []Ref{{Kind: Response, ID: "resp_a"}}, nil),
		"check": func() error {
			_, err := o.Check(ctx, "alice", []Ref{{Kind: Response, ID: "resp_a"}})
			return err
		}(),
	} {
		var e *apierror.Error
		if !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || e.RetryAfter <= 0 {
			t.Errorf("%s: err = %v, want 503 with Retry-After", name, err)
		}
	}
}

// countingStore counts GetOwner calls on a real store.
type countingStore struct {
	Store
	gets int
}

func (c *countingStore) GetOwner(ctx context.Context, scope, id string) (cache.Owner, error) {
	c.gets++
	return c.Store.GetOwner(ctx, scope, id)
}

// TestCheckLooksUpEachObjectOnce: a request naming the same object many
// times (a batch's requests naming one file, or a tenant listing its own
// file 2.2M times to burn the gateway's CPU: 5 s a request in the
// hostile-tenant run) costs one lookup per object, not per mention;
// the answer is the same.
func TestCheckLooksUpEachObjectOnce(t *testing.T) {
	base := newOwners(t, storetest.NewClock())
	cs := &countingStore{Store: base.store}
	o := &Owners{store: cs, ttl: base.ttl}
	ctx := context.Background()
	if err := o.Record(ctx, "alice", "openai", []Ref{{Kind: File, ID: "file-a"}, {Kind: File, ID: "file-b"}}, nil); err != nil {
		t.Fatal(err)
	}
	refs := make([]Ref, 0, 100_002)
	for range 100_000 {
		refs = append(refs, Ref{Kind: File, ID: "file-a", Param: "file_ids"})
	}
	refs = append(refs, Ref{Kind: File, ID: "file-b", Param: "file_id"}, Ref{Kind: File, ID: "file-a", Param: "file_id"})
	up, err := o.Check(ctx, "alice", refs)
	if err != nil || up != "openai" {
		t.Fatalf("Check = %q, %v", up, err)
	}
	if cs.gets != 2 {
		t.Fatalf("%d lookups for 2 objects named 100,002 times, want 2", cs.gets)
	}
	// Another's object among them is still the 404 naming it.
	_, err = o.Check(ctx, "bob", append(refs[:3:3], Ref{Kind: File, ID: "file-b", Param: "file_id"}))
	wantStatus(t, err, http.StatusNotFound, "file_not_found")
}
