package codec

import (
	"encoding/binary"
	"fmt"

	"github.com/llmgate/llmgate/cache"
)

// Owner layout: one version byte, then in version 1:
//
//	upstream, kind        uvarint length + bytes
//	createdAt, expiresAt  varint Unix nanoseconds, 0 = zero time
//
// The client is the scope in the storage key and is not repeated. A typical
// entry is ~40 bytes.
const ownerV1 = 1

// EncodeOwner returns the stored form of o.
func EncodeOwner(o cache.Owner) []byte {
	b := make([]byte, 0, 1+2*binary.MaxVarintLen64+len(o.Upstream)+len(o.Kind)+2*binary.MaxVarintLen64)
	b = append(b, ownerV1)
	b = appendString(b, o.Upstream)
	b = appendString(b, o.Kind)
	b = binary.AppendVarint(b, unixNano(o.CreatedAt))
	return binary.AppendVarint(b, unixNano(o.ExpiresAt))
}

// DecodeOwner parses a stored owner; Client is left for the caller, who
// knows the scope.
func DecodeOwner(b []byte) (cache.Owner, error) {
	var o cache.Owner
	if len(b) == 0 || b[0] != ownerV1 {
		return o, fmt.Errorf("owner: %w", ErrUnknownVersion)
	}
	d := decoder{b: b[1:]}
	o.Upstream = string(d.bytes())
	o.Kind = string(d.bytes())
	o.CreatedAt = fromUnixNano(d.varint())
	o.ExpiresAt = fromUnixNano(d.varint())
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return cache.Owner{}, fmt.Errorf("decode owner: %w", d.err)
	}
	return o, nil
}
