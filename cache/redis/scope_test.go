package redisstore

import (
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

// A record committed by a release that did not write its size is read
// whole and decoded: the scan reports the same size.
func TestScanCommittedWithoutSizeField(t *testing.T) {
	clock := storetest.NewClock()
	r := openTestRedis(t, Options{Now: clock.Now, PollInterval: time.Hour})
	k := cache.Key{Scope: "acme", Endpoint: chatEP, ID: "old"}
	c, err := r.Claim(ctx, k, "fp", lease)
	if err != nil {
		t.Fatal(err)
	}
	rec := storetest.StreamRecord()
	if err := r.Commit(ctx, k, c.Owner, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	rec.Fingerprint = "fp"
	want := cache.CommittedRecord{Size: rec.StoredSize(), ExpiresAt: clock.Now().Add(time.Hour)}
	for _, drop := range []bool{false, true} {
		if drop {
			if err := r.client.HDel(ctx, r.recordKey(recordIdent(k)), "size").Err(); err != nil {
				t.Fatal(err)
			}
		}
		var got []cache.CommittedRecord
		if err := r.ScanCommitted(ctx, "acme", func(cr cache.CommittedRecord) error { got = append(got, cr); return nil }); err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0] != want {
			t.Fatalf("size field dropped %v: ScanCommitted = %+v, want [%+v]", drop, got, want)
		}
	}
}
