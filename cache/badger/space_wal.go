package badgerstore

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

// Badger opens read-only only a directory whose memtable WALs end exactly
// where their last complete transaction ends (else ErrTruncateNeeded). A
// WAL is created sparse at twice MemTableSize and cut to its valid end only
// when Badger replays it read-write, so after any unclean stop — the case a
// full disk brings — every WAL is longer than its entries. trimWALs cuts
// each to where Badger's own replay would cut it (memtable.go's
// UpdateSkipList: iterate, then Truncate), which only shrinks files: it
// needs no free space and loses nothing Badger would keep.
//
// The format read here is Badger v4's log file (logFile.iterate,
// safeRead.Entry): a 20-byte header (key id, IV), then entries of
// meta, userMeta, uvarint key length, value length and expiry, key, value,
// and a big-endian CRC-32C of all but itself. Replay keeps entries outside
// transactions and transactions closed by their bitFinTxn entry; it stops
// at the first entry that does not decode or check. TestStartFullReadOnly
// holds this to Badger's own replay: if a Badger upgrade changes the
// format, the read-only open fails there (in production it falls back to
// an empty stand-in, never to a crash).

const (
	walHeaderSize = 20     // Badger's vlogHeaderSize
	walBitTxn     = 1 << 6 // bitTxn
	walBitFinTxn  = 1 << 7 // bitFinTxn
	walMaxKeyLen  = 1 << 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// walEnd is where Badger's replay of the WAL b stops.
func walEnd(b []byte) int64 {
	off, valid := walHeaderSize, walHeaderSize
	inTxn := false
	for off < len(b) {
		meta := b[off]
		p := off + 2
		var lens [3]uint64
		for i := range lens {
			if p > len(b) {
				return int64(valid)
			}
			v, n := binary.Uvarint(b[p:])
			if n <= 0 {
				return int64(valid)
			}
			lens[i], p = v, p+n
		}
		klen, vlen := lens[0], lens[1]
		if klen > walMaxKeyLen || vlen > uint64(len(b)) || klen == 0 {
			return int64(valid)
		}
		end := p + int(klen) + int(vlen)
		if end+crc32.Size > len(b) || crc32.Checksum(b[off:end], castagnoli) != binary.BigEndian.Uint32(b[end:]) {
			return int64(valid)
		}
		off = end + crc32.Size
		switch {
		case meta&walBitTxn != 0:
			inTxn = true
		case meta&walBitFinTxn != 0:
			inTxn, valid = false, off
		case inTxn:
			return int64(valid)
		default:
			valid = off
		}
	}
	return int64(valid)
}

// trimWALs cuts every memtable WAL in dir to its valid end.
func trimWALs(dir string) error {
	paths, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil {
		return err
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if end := walEnd(b); end < int64(len(b)) {
			if err := os.Truncate(p, end); err != nil {
				return fmt.Errorf("trim WAL %s to %d bytes: %w", p, end, err)
			}
		}
	}
	return nil
}
