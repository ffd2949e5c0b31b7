package cache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Storage key layout:
//
//	'i' 0x00 scope 0x00 endpoint 0x00 id
//
// 'i' is the namespace of idempotency records ('d' is reserved for dead
// letters). Key.Validate forbids NUL in scope and endpoint and the id is
// printable ASCII, so the layout is unambiguous.
const recordNS = 'i'

func storageKey(k Key) []byte {
	b := make([]byte, 0, 4+len(k.Scope)+len(k.Endpoint)+len(k.ID))
	b = append(b, recordNS, 0)
	b = append(b, k.Scope...)
	b = append(b, 0)
	b = append(b, k.Endpoint...)
	b = append(b, 0)
	return append(b, k.ID...)
}

var recordKeyPrefix = []byte{recordNS, 0}

// Value layout: one version byte, then the version's encoding. Version 1:
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
// The metadata comes first, so a reader can stop before the body. A release
// that changes the layout adds version 2 and still reads version 1; this one
// reads version 1 only and rejects any other.
const codecV1 = 1

var errUnknownVersion = errors.New("unknown record encoding version")

// encodeRecord returns the stored form of r, in one allocation.
func encodeRecord(r *Record) []byte {
	return appendRecord(make([]byte, 0, encodedSize(r)), r)
}

func encodedSize(r *Record) int {
	n := 1 + 1 + 1 + 3*binary.MaxVarintLen64 + binary.MaxVarintLen64
	n += strSize(len(r.Fingerprint)) + strSize(len(r.Owner)) + strSize(len(r.Upstream))
	n += binary.MaxVarintLen64
	for name, vals := range r.Header {
		n += strSize(len(name)) + binary.MaxVarintLen64
		for _, v := range vals {
			n += strSize(len(v))
		}
	}
	n += strSize(len(r.Body)) + binary.MaxVarintLen64
	for _, e := range r.Events {
		n += strSize(len(e))
	}
	return n
}

func strSize(n int) int { return binary.MaxVarintLen64 + n }

func appendRecord(b []byte, r *Record) []byte {
	b = append(b, codecV1, byte(r.State))
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
	// Sorted so that one record always encodes to the same bytes.
	for _, name := range slices.Sorted(maps.Keys(r.Header)) {
		vals := r.Header[name]
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = appendString(b, v)
		}
	}
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

// decodeRecord parses a stored value. Body and Events alias b: pass a copy
// that nobody else will modify (Badger's ValueCopy is one).
func decodeRecord(b []byte) (*Record, error) {
	r := new(Record)
	d := decoder{b: b}
	if err := d.header(r); err != nil {
		return nil, err
	}
	if err := d.body(r); err != nil {
		return nil, err
	}
	return r, nil
}

type decoder struct {
	b   []byte
	err error
}

var errTruncated = errors.New("truncated record")

func (d *decoder) header(r *Record) error {
	if len(d.b) == 0 {
		return fmt.Errorf("decode record: %w: empty value", errTruncated)
	}
	if v := d.b[0]; v != codecV1 {
		return fmt.Errorf("decode record: %w %d (this release reads 1)", errUnknownVersion, v)
	}
	if len(d.b) < 3 {
		return fmt.Errorf("decode record: %w", errTruncated)
	}
	r.State = State(d.b[1])
	if r.State != InFlight && r.State != Committed {
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

func (d *decoder) body(r *Record) error {
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
