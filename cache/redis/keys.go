package redisstore

import (
	"strings"

	"github.com/llmgate/llmgate/cache"
)

// Redis key layout. P is Options.Prefix ("llmgate:" by default):
//
//	P r:{<scope>:<endpoint>:<id>}   record, a hash (see scripts.go); TTL = lease+1m in flight, ttl committed
//	P d:{<dead-letter id>}          dead letter, a string: codec.EncodeDeadLetter's bytes; TTL = its ttl
//	P dl:{<client>}                 the client's dead letters, a sorted set by last failure (letters.go)
//	P dlb:{<client>}                their sizes, a hash; both TTL = the newest letter's ttl
//	P breakers                      hash upstream → "open"; no TTL (see SetBreakerOverride)
//
// and the pub/sub channels (a separate namespace in Redis):
//
//	P wake:<scope>:<endpoint>:<id>  a record was committed, released or deleted
//	P breakers                      an override changed: "1"+upstream (open) or "0"+upstream (cleared)
//
// Each part is escaped (escapePart) so that it contains none of `:{}` nor a
// glob metacharacter: the layout is unambiguous, a pattern built from a part
// matches only that part, and the braces mark exactly one Redis Cluster hash
// tag per key. Every script touches one key, or keys of one hash tag (a
// client's dead-letter index), so in Cluster mode no script ever crosses
// slots; the tag still names the record's identity rather than the
// whole key, so that a key added later for the same record (say P l:{same})
// would share its slot and could join it in a script.
const (
	redisRecordNS     = "r:"
	redisDeadLetterNS = "d:"
	redisWakeNS       = "wake:"
	redisBarrierNS    = "barrier:"
	redisSessionNS    = "admin:session:"
	redisBreakers     = "breakers"
)

// escapeChars are escaped as %XX besides the bytes outside 0x21–0x7E: ':'
// separates the parts, braces delimit the hash tag, '%' is the escape, and
// the rest are glob metacharacters of SCAN MATCH and PSUBSCRIBE.
const escapeChars = `%:{}*?[]\`

// escapePart appends s to b with every byte that is not printable ASCII,
// or is one of escapeChars, written as %XX.
func escapePart(b *strings.Builder, s string) {
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(escapeChars, c) >= 0 {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
			continue
		}
		b.WriteByte(c)
	}
}

// recordIdent is the escaped "<scope>:<endpoint>:<id>" of a key: the hash
// tag of its record and the suffix of its wake channel.
func recordIdent(k cache.Key) string {
	var b strings.Builder
	b.Grow(len(k.Scope) + len(k.Endpoint) + len(k.ID) + 8)
	escapePart(&b, k.Scope)
	b.WriteByte(':')
	escapePart(&b, k.Endpoint)
	b.WriteByte(':')
	escapePart(&b, k.ID)
	return b.String()
}

func (r *Store) recordKey(ident string) string {
	return r.prefix + redisRecordNS + "{" + ident + "}"
}

// barrierKey is the replay barrier of the record at recordKey (see
// replicated): the same hash tag, so the same cluster slot.
func (r *Store) barrierKey(recordKey string) string {
	return r.prefix + redisBarrierNS + strings.TrimPrefix(recordKey, r.prefix+redisRecordNS)
}

func (r *Store) wakeChannel(ident string) string {
	return r.prefix + redisWakeNS + ident
}

func (r *Store) deadLetterKey(id string) string { return r.taggedKey(redisDeadLetterNS, id) }

// taggedKey is P ns{<part, escaped>}: a key whose hash tag is part.
func (r *Store) taggedKey(ns, part string) string {
	var b strings.Builder
	b.WriteString(r.prefix)
	b.WriteString(ns)
	b.WriteByte('{')
	escapePart(&b, part)
	b.WriteByte('}')
	return b.String()
}

// globEscape quotes the glob metacharacters of s for SCAN MATCH and
// PSUBSCRIBE; the prefix is the only part of a pattern not escaped by
// escapePart.
func globEscape(s string) string {
	if !strings.ContainsAny(s, `*?[]\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
