package cache

import "testing"

func TestStoredSize(t *testing.T) {
	r := &Record{
		Fingerprint: "fp12",                                                    // 4
		Upstream:    "openai",                                                  // 6
		Header:      map[string][]string{"Content-Type": {"application/json"}}, // 12 + 16
		Body:        []byte("0123456789"),                                      // 10
	}
	if got, want := r.StoredSize(), int64(RecordOverhead+4+6+12+16+10); got != want {
		t.Fatalf("StoredSize = %d, want %d", got, want)
	}
	s := &Record{Stream: true, Events: [][]byte{[]byte("data: 1\n\n"), []byte("data: [DONE]\n\n")}}
	if got, want := s.StoredSize(), int64(RecordOverhead+9+14); got != want {
		t.Fatalf("stream StoredSize = %d, want %d", got, want)
	}
}
