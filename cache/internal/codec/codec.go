// Package codec is the byte form of the cache's records and dead letters,
// shared by the Badger and Redis stores so that both hold the same bytes.
// Each form starts with a version byte; a value of another version is
// refused with ErrUnknownVersion, never guessed at.
package codec

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
	"time"

	"github.com/klauspost/compress/s2"

	"github.com/llmgate/llmgate/cache"
)

// Record layout: one version byte, then the version's encoding. Version 1:
//
//	state      u8
//	flags      u8                 bit 0: stream
//	fingerprint, owner            uvarint length + bytes
//	leaseUntil varint             Unix nanoseconds, 0 = zero time
//	status     uvarint
//	createdAt, expiresAt varint   Unix nanoseconds, 0 = zero time
//	upstream                      uvarint length + bytes
//	header     uvarint count, then per name (sorted): name, uvarint value count, values
//	body                          uvarint length + bytes
//	events     uvarint count, then each: uvarint length + bytes
//
// The metadata comes first, so a reader can stop before the body.
//
// Version 2 is version 1 with everything after the header (body and events)
// replaced by
//
//	size       uvarint            the section's uncompressed length
//	crc        u32 little-endian  CRC-32C of the size's bytes and the
//	                              uncompressed section
//	section    one S2 block (github.com/klauspost/compress/s2, block
//	           format) holding version 1's body and events
//
// The size must equal the length the block claims, and stay under
// maxSection and maxExpansion times the block, before anything is
// allocated for it: a flipped bit in either length is an error, not an
// allocation of what it says.
//
// A flipped bit in a compressed block changes many bytes of what it decodes
// to, not one, and the block format has no checksum of its own: the CRC
// makes that an error instead of a replay of other bytes. EncodeRecord
// writes it only where it pays (see compressMin and compressGain) and the
// block expands at most maxExpansion times; everything else is still
// written as version 1, which every release reads. This release reads
// versions 1 and 2 and rejects any other.
const (
	recordV1 = 1
	recordV2 = 2
)

// Compression of a record's body and events. A chat stream's events repeat
// the same id, model and framing in every chunk, so they shrink 5–10×; every
// byte not written is a byte Badger does not copy into a fresh page of its
// value log (page faults: 2.5–4 µs per KiB under load on a 2-vCPU VM) and
// that the disk, the value-log GC and Redis's memory do not hold.
//   - compressMin: sections smaller than this are written as version 1
//     (S2 saves little on them and costs ~0.3 µs).
//   - compressGain: version 2 only when the block is at least 1/8 smaller.
//   - maxExpansion, maxSection: the decoder refuses a block that claims to
//     expand more than maxExpansion times, or to more than maxSection
//     bytes, so a corrupt or hostile value cannot size a huge allocation;
//     the encoder writes version 1 where S2 would exceed either (a record
//     is capped far below maxSection: idempotency.max_record_bytes, 8 MiB
//     by default, and Badger's 16 MiB value-log files).
const (
	compressMin  = 512
	compressGain = 8
	maxExpansion = 256
	maxSection   = 32 << 20
)

// ErrUnknownVersion: a stored value starts with a version byte this release
// does not read.
var ErrUnknownVersion = errors.New("unknown record encoding version")

// EncodeRecord returns the stored form of r: version 2 where compressing
// its body and events pays, else version 1 in one allocation.
func EncodeRecord(r *cache.Record) []byte {
	// sectionSize bounds the section from above: a record it puts under
	// compressMin skips the scratch copy that encodeCompressed measures.
	if sectionSize(r) >= compressMin {
		if b := encodeCompressed(r); b != nil {
			return b
		}
	}
	return EncodeRecordV1(r)
}

// EncodeRecordV1 returns r as version 1, uncompressed, in one allocation:
// what a release before version 2 reads, for a store shared with one.
func EncodeRecordV1(r *cache.Record) []byte {
	return appendSection(appendHeader(make([]byte, 0, headerSize(r)+sectionSize(r)), recordV1, r), r)
}

// scratch holds the uncompressed section and the S2 block while a record
// is encoded; the stored form is one exact allocation made from them.
type scratch struct{ raw, block []byte }

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// maxPooled: buffers that grew past this (a multi-MiB stream) are dropped
// rather than kept for the next record.
const maxPooled = 1 << 20

// encodeCompressed returns r as version 2, or nil where version 1 is to be
// written: a section under compressMin or over maxSection, a block that
// does not save 1/compressGain, or one that expands more than maxExpansion.
func encodeCompressed(r *cache.Record) []byte {
	sc := scratchPool.Get().(*scratch)
	defer func() {
		if cap(sc.raw) <= maxPooled && cap(sc.block) <= maxPooled {
			scratchPool.Put(sc)
		}
	}()
	sc.raw = appendSection(sc.raw[:0], r)
	if len(sc.raw) < compressMin || len(sc.raw) > maxSection {
		return nil
	}
	if n := s2.MaxEncodedLen(len(sc.raw)); cap(sc.block) < n {
		sc.block = make([]byte, n)
	}
	block := s2.Encode(sc.block[:cap(sc.block)], sc.raw)
	if len(block) > len(sc.raw)-len(sc.raw)/compressGain || len(sc.raw) > maxExpansion*len(block) {
		return nil
	}
	b := appendHeader(make([]byte, 0, headerSize(r)+binary.MaxVarintLen64+4+len(block)), recordV2, r)
	sizeAt := len(b)
	b = binary.AppendUvarint(b, uint64(len(sc.raw)))
	sum := crc32.Update(crc32.Checksum(b[sizeAt:], castagnoli), castagnoli, sc.raw)
	b = binary.LittleEndian.AppendUint32(b, sum)
	return append(b, block...)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func headerSize(r *cache.Record) int {
	n := 1 + 1 + 1 + 3*binary.MaxVarintLen64 + binary.MaxVarintLen64
	n += strSize(len(r.Fingerprint)) + strSize(len(r.Owner)) + strSize(len(r.Upstream))
	n += binary.MaxVarintLen64
	for name, vals := range r.Header {
		n += strSize(len(name)) + binary.MaxVarintLen64
		for _, v := range vals {
			n += strSize(len(v))
		}
	}
	return n
}

// sectionSize bounds what appendSection writes: the body and the events.
func sectionSize(r *cache.Record) int {
	n := strSize(len(r.Body)) + binary.MaxVarintLen64
	for _, e := range r.Events {
		n += strSize(len(e))
	}
	return n
}

func strSize(n int) int { return binary.MaxVarintLen64 + n }

func appendHeader(b []byte, version byte, r *cache.Record) []byte {
	b = append(b, version, byte(r.State))
	var flags byte
	if r.Stream {
		flags |= 1
	}
	b = append(b, flags)
	b = appendString(b, r.Fingerprint)
	b = appendString(b, r.Owner)
	b = binary.AppendVarint(b, unixNano(r.LeaseUntil))
	b = binary.AppendUvarint(b, uint64(max(r.Status, 0)))
	b = binary.AppendVarint(b, unixNano(r.CreatedAt))
	b = binary.AppendVarint(b, unixNano(r.ExpiresAt))
	b = appendString(b, r.Upstream)
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	// Sorted so that one record always encodes to the same bytes. A
	// provider answer keeps a dozen or so headers: the names sort on the
	// stack.
	var stack [24]string
	names := stack[:0]
	for name := range r.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		vals := r.Header[name]
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = appendString(b, v)
		}
	}
	return b
}

// appendSection appends the body and the events, as version 1 lays them
// out (and version 2 compresses them).
func appendSection(b []byte, r *cache.Record) []byte {
	b = binary.AppendUvarint(b, uint64(len(r.Body)))
	b = append(b, r.Body...)
	b = binary.AppendUvarint(b, uint64(len(r.Events)))
	for _, e := range r.Events {
		b = binary.AppendUvarint(b, uint64(len(e)))
		b = append(b, e...)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// DecodeRecord parses a stored record. In version 1, Body and Events alias
// b: pass a copy that nobody else will modify (Badger's ValueCopy is one).
func DecodeRecord(b []byte) (*cache.Record, error) {
	r := new(cache.Record)
	d := decoder{b: b}
	if err := d.header(r); err != nil {
		return nil, err
	}
	if b[0] == recordV2 {
		if err := d.decompress(); err != nil {
			return nil, err
		}
	}
	if err := d.body(r); err != nil {
		return nil, err
	}
	return r, nil
}

// decompress replaces the rest of a version 2 record, its S2 block, with
// the section the block holds.
func (d *decoder) decompress() error {
	rest := d.b
	size := d.uvarint()
	if d.err == nil && len(d.b) < 4 {
		d.err = errTruncated
	}
	if d.err != nil {
		return fmt.Errorf("decode record: %w", d.err)
	}
	sizeBytes := rest[:len(rest)-len(d.b)]
	sum, block := binary.LittleEndian.Uint32(d.b), d.b[4:]
	n, err := s2.DecodedLen(block)
	switch {
	case err != nil:
		return fmt.Errorf("decode record: compressed section: %w", err)
	case uint64(n) != size:
		return fmt.Errorf("decode record: compressed section of %d bytes claims %d, its size says %d", len(block), n, size)
	case n > maxSection || n > maxExpansion*len(block):
		return fmt.Errorf("decode record: compressed section of %d bytes claims %d", len(block), n)
	}
	section, err := s2.Decode(make([]byte, n), block)
	if err != nil {
		return fmt.Errorf("decode record: compressed section: %w", err)
	}
	if crc32.Update(crc32.Checksum(sizeBytes, castagnoli), castagnoli, section) != sum {
		return errors.New("decode record: compressed section: checksum mismatch")
	}
	d.b = section
	return nil
}

type decoder struct {
	b   []byte
	err error
}

var errTruncated = errors.New("truncated record")

func (d *decoder) header(r *cache.Record) error {
	if len(d.b) == 0 {
		return fmt.Errorf("decode record: %w: empty value", errTruncated)
	}
	if v := d.b[0]; v != recordV1 && v != recordV2 {
		return fmt.Errorf("decode record: %w %d (this release reads 1 and 2)", ErrUnknownVersion, v)
	}
	if len(d.b) < 3 {
		return fmt.Errorf("decode record: %w", errTruncated)
	}
	r.State = cache.State(d.b[1])
	if r.State != cache.InFlight && r.State != cache.Committed {
		return fmt.Errorf("decode record: unknown state %d", d.b[1])
	}
	flags := d.b[2]
	if flags&^1 != 0 {
		return fmt.Errorf("decode record: unknown flags %#02x", flags)
	}
	r.Stream = flags&1 != 0
	d.b = d.b[3:]
	r.Fingerprint = string(d.bytes())
	r.Owner = string(d.bytes())
	r.LeaseUntil = fromUnixNano(d.varint())
	status := d.uvarint()
	if status > 999 && d.err == nil {
		d.err = fmt.Errorf("status %d out of range", status)
	}
	r.Status = int(status)
	r.CreatedAt = fromUnixNano(d.varint())
	r.ExpiresAt = fromUnixNano(d.varint())
	r.Upstream = string(d.bytes())
	// Each header needs at least two bytes (name length, value count), so a
	// count larger than half the rest is corrupt; the check also keeps a
	// hostile count from sizing a huge map.
	nh := d.count(2)
	if nh > 0 {
		r.Header = make(map[string][]string, nh)
	}
	for i := 0; i < nh && d.err == nil; i++ {
		name := string(d.bytes())
		nv := d.count(1)
		vals := make([]string, 0, nv)
		for j := 0; j < nv && d.err == nil; j++ {
			vals = append(vals, string(d.bytes()))
		}
		r.Header[name] = append(r.Header[name], vals...)
	}
	if d.err != nil {
		return fmt.Errorf("decode record: %w", d.err)
	}
	return nil
}

func (d *decoder) body(r *cache.Record) error {
	if body := d.bytes(); len(body) > 0 {
		r.Body = body[:len(body):len(body)]
	}
	ne := d.count(1)
	if ne > 0 {
		r.Events = make([][]byte, 0, ne)
	}
	for i := 0; i < ne && d.err == nil; i++ {
		e := d.bytes()
		r.Events = append(r.Events, e[:len(e):len(e)])
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return fmt.Errorf("decode record: %w", d.err)
	}
	return nil
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errTruncated
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errTruncated
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads an element count whose elements take at least minSize bytes each.
func (d *decoder) count(minSize int) int {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)/minSize) {
		d.err = fmt.Errorf("count %d exceeds the %d bytes left", n, len(d.b))
		return 0
	}
	return int(n)
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: length %d exceeds the %d bytes left", errTruncated, n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

// Dead-letter layout: one version byte, then, in version 1, the JSON of
// the DeadLetter's fields with the body as base64 under "body" (DeadLetter
// itself leaves the body out of its JSON).
const deadLetterV1 = 1

// deadLetterJSON is the stored form: the JSON fields plus the body.
type deadLetterJSON struct {
	cache.DeadLetter
	Body []byte `json:"body"`
}

// EncodeDeadLetter returns the stored form of d, body included.
func EncodeDeadLetter(d *cache.DeadLetter) ([]byte, error) {
	b, err := json.Marshal(deadLetterJSON{DeadLetter: *d, Body: d.Body})
	if err != nil {
		return nil, err
	}
	return append([]byte{deadLetterV1}, b...), nil
}

// DecodeDeadLetter parses a stored dead letter.
func DecodeDeadLetter(b []byte) (*cache.DeadLetter, error) {
	if len(b) == 0 || b[0] != deadLetterV1 {
		return nil, fmt.Errorf("dead letter: %w", ErrUnknownVersion)
	}
	var r deadLetterJSON
	if err := json.Unmarshal(b[1:], &r); err != nil {
		return nil, fmt.Errorf("dead letter: %w", err)
	}
	d := r.DeadLetter
	d.Body = r.Body
	return &d, nil
}
