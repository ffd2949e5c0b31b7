package cache

import "time"

// Owner is who created a provider object (a stored response, a file, a
// batch, ...) through llmgate: the client (the scope it is stored under),
// the upstream that holds the object, and its kind. The gateway writes one
// before the object's id reaches the client and reads it before forwarding
// any request that names the id, so that clients sharing an upstream's key
// cannot reach each other's objects. The stores add two methods to the
// contract:
//
//	PutOwner(ctx, scope, id string, o Owner, ttl time.Duration) error
//	    stores o under (scope, id), replacing what was there, until ttl
//	    (which must be positive) runs out; o.CreatedAt and o.ExpiresAt are
//	    set from the store's clock. On Redis every replica sees it at once;
//	    on Badger it survives a restart.
//
//	GetOwner(ctx, scope, id string) (Owner, error)
//	    returns the record under (scope, id), or an error wrapping
//	    ErrNotFound when there is none or it has expired by the store's
//	    clock. Another scope's record under the same id is not found: a
//	    client only ever sees its own.
//
// The storage key starts with the scope (Badger 'o' 0 scope 0 id, Redis
// P o:{scope:id}), so that a scope's entries can be found by prefix.
type Owner struct {
	Client   string // the scope; set by GetOwner, not stored twice
	Upstream string // the upstream's config name
	Kind     string // "response", "conversation", "file", "batch", "vector_store", "upload"
	// CreatedAt and ExpiresAt are set by PutOwner (store clock).
	CreatedAt, ExpiresAt time.Time
}

// MaxOwnerIDLen is the longest object id an Owner is kept for. Provider ids
// are under 100 bytes (resp_ and 48 hex digits); an id longer than this is
// not one llmgate handed out.
const MaxOwnerIDLen = 255

// ValidateOwner reports whether (scope, id) can be stored: id is 1–255
// printable ASCII characters and scope contains no NUL byte.
func ValidateOwner(scope, id string) error {
	return Key{Scope: scope, Endpoint: "", ID: id}.Validate()
}
