// Package ownership keeps tenants apart on the objects a provider stores
// (responses, conversations, files, batches, vector stores, uploads, and
// Anthropic's message batches) when
// several clients share one upstream API key, so that one client cannot
// read, delete, cancel or build on another's object by its id.
//
// The gateway calls Record with the ids an answer hands out, before the
// answer (or a stream's first event) reaches the client, and Check with the
// ids a request names (its path, previous_response_id, conversation,
// file_id and the like anywhere in its body; in an Anthropic Messages
// body its container too) before anything is forwarded. How each provider
// API's bodies name and hand out objects is its Scheme.
// Check fails closed: an id that is another client's and an id llmgate has
// no record of both get the same 404, and the upstream is never called. A
// named id also fixes the upstream: the one that created it, with no
// fallback.
//
// A client with its own API key for an upstream (config
// clients[].upstream_api_keys) is kept apart by the provider itself; the
// gateway skips Check for it, and lets it list (see TenantList).
//
// The records are cache.Owner entries in the idempotency store, under the
// client's scope, with a TTL per kind (config ownership.ttl): on Redis every
// replica sees them, on Badger they survive a restart.
package ownership

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/apierror"
)

// Kind is a kind of provider object, as its JSON "object" field names it.
type Kind string

// The kinds of object whose owner is recorded.
const (
	Response     Kind = "response"
	Conversation Kind = "conversation"
	File         Kind = "file"
	Batch        Kind = "batch"
	VectorStore  Kind = "vector_store"
	Upload       Kind = "upload"
	// Container is a code_interpreter container (cntr_...), recorded from
	// the container_id a response's answer holds. It is remembered as
	// long as responses are.
	Container Kind = "container"
	// MessageBatch is an Anthropic message batch (msgbatch_...), named
	// by the paths under /v1/messages/batches. It is remembered as long
	// as OpenAI's batches are (ownership.ttl.batches).
	MessageBatch Kind = "message_batch"
	// ItemReference is an item a Responses body names by id alone (an
	// item_reference). Item ids are not recorded: under a shared key such
	// a request is refused (ItemReferenceRefused).
	ItemReference Kind = "item_reference"
)

// Ref is one object id, and its kind, that an answer hands out or a request
// names. Param is where a request named it ("previous_response_id",
// "file_id", "" for the path), for the error.
type Ref struct {
	Kind  Kind
	ID    string
	Param string
}

// Store is what ownership needs of the idempotency store (cache.Owner
// documents the contract).
type Store interface {
	PutOwner(ctx context.Context, scope, id string, o cache.Owner, ttl time.Duration) error
	GetOwner(ctx context.Context, scope, id string) (cache.Owner, error)
}

// Options configure New. Store is required.
type Options struct {
	Store Store
	// TTL is how long each kind's owner is remembered. A zero field takes
	// config.DefaultOwnership's value.
	TTL config.OwnershipTTL
}

// Owners records and checks who created which object.
type Owners struct {
	store Store
	ttl   map[Kind]time.Duration
}

// New returns Owners over o.Store.
func New(o Options) *Owners {
	def := config.DefaultOwnership().TTL
	pick := func(v, d config.Duration) time.Duration {
		if v > 0 {
			return v.D()
		}
		return d.D()
	}
	t := o.TTL
	return &Owners{store: o.Store, ttl: map[Kind]time.Duration{
		Response:     pick(t.Responses, def.Responses),
		Conversation: pick(t.Conversations, def.Conversations),
		File:         pick(t.Files, def.Files),
		Batch:        pick(t.Batches, def.Batches),
		VectorStore:  pick(t.VectorStores, def.VectorStores),
		Upload:       pick(t.Uploads, def.Uploads),
		Container:    pick(t.Responses, def.Responses),
		MessageBatch: pick(t.Batches, def.Batches),
	}}
}

// Record stores client as the owner of every object in created, held by
// upstream, and reports each entry it stored to stored (if not nil): its
// client, EntrySize and ttl, for the client's stored-bytes quota. The
// caller hands the ids to the client only if it succeeds: an id handed
// out without its record would be refused to its own owner.
func (o *Owners) Record(ctx context.Context, client, upstream string, created []Ref, stored func(client string, size int64, ttl time.Duration)) error {
	for _, r := range created {
		ttl, ok := o.ttl[r.Kind]
		if !ok {
			return fmt.Errorf("record owner of %s: unknown kind %q", r.ID, r.Kind)
		}
		entry := cache.Owner{Upstream: upstream, Kind: string(r.Kind)}
		if err := o.store.PutOwner(ctx, client, r.ID, entry, ttl); err != nil {
			return &apierror.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "ownership_store_unavailable",
				Message:    "The object was created upstream, but the gateway could not record that it is yours, so its id is not handed out. Retry later.",
				RetryAfter: time.Second, Err: fmt.Errorf("record owner of %s %s: %w", r.Kind, r.ID, err)}
		}
		if stored != nil {
			stored(client, EntrySize(client, r.ID, entry), ttl)
		}
	}
	return nil
}

// EntrySize is about what the ownership entry of id, o, takes in the
// store under client: its key (scope and id, a few bytes of namespace)
// and its value (upstream, kind, two times in nanoseconds). The stores'
// ScanOwners report the exact size at the next count.
func EntrySize(client, id string, o cache.Owner) int64 {
	return int64(len(client) + len(id) + len(o.Upstream) + len(o.Kind) + 24)
}

// Checked is what Verify found: the objects a request names are its
// client's, held by one upstream (or it names none). Its zero value allows
// nothing, and only Verify makes one that allows anything, so a hop under
// a shared key (proxy.SharedHop) cannot be made without the check.
type Checked struct {
	ok bool
	// holder is the upstream that holds the named objects; "" when the
	// request names none.
	holder string
}

// Holder is the upstream that holds the objects the request names, and
// whether it names any.
func (c Checked) Holder() (upstream string, named bool) { return c.holder, c.holder != "" }

// Allows reports whether the request may go to upstream under the key
// clients share: it was checked, and names no objects or only objects held
// there.
func (c Checked) Allows(upstream string) bool {
	return c.ok && (c.holder == "" || c.holder == upstream)
}

// Verify is Check with its answer as a Checked.
func (o *Owners) Verify(ctx context.Context, client string, refs []Ref) (Checked, error) {
	holder, err := o.Check(ctx, client, refs)
	if err != nil {
		return Checked{}, err
	}
	return Checked{ok: true, holder: holder}, nil
}

// Check returns the upstream that holds the objects refs names, all of
// which must be client's and on one upstream; "" when refs is empty. An
// object that is not client's — another client's, or one llmgate has no
// record of, or of another kind — is a 404 naming it, the same in every
// case, so that nothing tells one tenant about another's ids.
func (o *Owners) Check(ctx context.Context, client string, refs []Ref) (upstream string, err error) {
	for _, r := range refs {
		if r.Kind == ItemReference {
			return "", ItemReferenceRefused(r)
		}
	}
	var seen map[Ref]bool // past a few refs: each object is looked up once
	if len(refs) > 8 {
		seen = make(map[Ref]bool, min(len(refs), 1024))
	}
	for i, r := range refs {
		if checkedBefore(refs[:i], r, seen) {
			continue
		}
		ow, err := o.store.GetOwner(ctx, client, r.ID)
		switch {
		case errors.Is(err, cache.ErrNotFound):
			return "", NotFound(r)
		case err != nil:
			return "", &apierror.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "ownership_store_unavailable",
				Message:    "The gateway could not check that the objects this request names are yours, so it was not sent. Retry later.",
				RetryAfter: time.Second, Err: fmt.Errorf("check owner of %s %s: %w", r.Kind, r.ID, err)}
		case Kind(ow.Kind) != r.Kind:
			return "", NotFound(r)
		case upstream != "" && ow.Upstream != upstream:
			return "", apierror.Invalid(r.Param, fmt.Sprintf(
				"The objects this request names are held by different upstreams (%s is not where the others are), so no one upstream can serve it.", r.ID))
		}
		upstream = ow.Upstream
	}
	return upstream, nil
}

// checkedBefore reports whether an object r names, by kind and id, was
// among earlier (in seen, when there is one), and notes it there. A
// body may name one object many times (a batch's requests naming one
// file); one lookup answers for all.
func checkedBefore(earlier []Ref, r Ref, seen map[Ref]bool) bool {
	k := Ref{Kind: r.Kind, ID: r.ID}
	if seen != nil {
		if seen[k] {
			return true
		}
		seen[k] = true
		return false
	}
	for _, e := range earlier {
		if e.Kind == r.Kind && e.ID == r.ID {
			return true
		}
	}
	return false
}

// NotFound is the 404 for an object the client may not see, shaped as
// OpenAI's for a missing object of that kind.
func NotFound(r Ref) *apierror.Error {
	if r.Param == "previous_response_id" {
		return apierror.NotFound("previous_response_not_found", r.Param,
			fmt.Sprintf("Previous response with id '%s' not found.", r.ID))
	}
	return apierror.NotFound(string(r.Kind)+"_not_found", r.Param,
		fmt.Sprintf("No %s found with id '%s'.", kindNames[r.Kind], r.ID))
}

var kindNames = map[Kind]string{
	Response: "response", Conversation: "conversation", File: "file",
	Batch: "batch", VectorStore: "vector store", Upload: "upload", Container: "container",
	MessageBatch: "message batch",
}

// ItemReferenceRefused is the 400 for an item reference under a shared
// key: the gateway does not record whose each item is, so it cannot tell
// the client's items from another client's.
func ItemReferenceRefused(r Ref) *apierror.Error {
	return apierror.InvalidCode("item_reference_not_allowed", r.Param, fmt.Sprintf(
		"Item references (here '%s') are refused: clients of this gateway share the upstream's API key, and the gateway "+
			"cannot tell your items from another client's. Continue with previous_response_id or a conversation, "+
			"pass the item's content itself, or ask the operator for your own upstream key (clients[].upstream_api_keys).", r.ID), nil)
}
