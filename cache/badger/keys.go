package badgerstore

import "github.com/llmgate/llmgate/cache"

// Storage key layout:
//
//	'i' 0x00 scope 0x00 endpoint 0x00 id   a committed record (codec.EncodeRecord)
//	'd' 0x00 id                            a dead letter (codec.EncodeDeadLetter)
//
// Key.Validate forbids NUL in scope and endpoint and the id is printable
// ASCII, so the layout is unambiguous.
//
// Commit is the only writer of a record key. Another (an import, a
// restore) must add the key to the key filter first (noteCommit, under
// the key's shard lock), or Claim will not see the record (filter.go).
const (
	recordNS     = 'i'
	deadLetterNS = 'd'
)

func storageKey(k cache.Key) []byte {
	b := make([]byte, 0, 4+len(k.Scope)+len(k.Endpoint)+len(k.ID))
	b = append(b, recordNS, 0)
	b = append(b, k.Scope...)
	b = append(b, 0)
	b = append(b, k.Endpoint...)
	b = append(b, 0)
	return append(b, k.ID...)
}

var (
	recordKeyPrefix     = []byte{recordNS, 0}
	deadLetterKeyPrefix = []byte{deadLetterNS, 0}
)

func deadLetterKey(id string) []byte { return append([]byte{deadLetterNS, 0}, id...) }
