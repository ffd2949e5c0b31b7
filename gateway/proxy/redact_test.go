package proxy

import (
	"io"
	"strings"
	"testing"
)

// TestRedactKey: every copy of a key of eight bytes or more is replaced;
// a shorter one (a local server's "EMPTY") and a body without the key are
// returned as they came.
func TestRedactKey(t *testing.T) {
	for _, tc := range []struct{ body, key, want string }{
		{`{"error":{"message":"key sk-abcdefgh, again sk-abcdefgh"}}`, "sk-abcdefgh", `{"error":{"message":"key [redacted], again [redacted]"}}`},
		{`{"error":{"message":"bad key sk-1234567"}}`, "sk-12345", `{"error":{"message":"bad key [redacted]67"}}`},
		{`{"error":{"message":"EMPTY is not a valid key"}}`, "EMPTY", `{"error":{"message":"EMPTY is not a valid key"}}`},
		{`{"error":{"message":"no key here"}}`, "sk-abcdefgh", `{"error":{"message":"no key here"}}`},
		{`{"error":{"message":"no key sent"}}`, "", `{"error":{"message":"no key sent"}}`},
	} {
		if got := string(redactKey([]byte(tc.body), newSecret(tc.key))); got != tc.want {
			t.Errorf("redactKey(%s, %q) = %s, want %s", tc.body, tc.key, got, tc.want)
		}
	}
}

// TestCutRedactedAtTheLimit: an error body cut at its limit is cut where
// no copy of the key straddles the cut: one that starts before it is
// read whole and replaced, so no prefix of the key reaches the client,
// the log or a dead letter (the cut used to come first, and a padded
// error left "…key=sk-upst" in the body).
func TestCutRedactedAtTheLimit(t *testing.T) {
	const key = "sk-upstream-SECRET-0123456789abcdef"
	const limit = 64
	for pad := limit - len(key) - 2; pad <= limit+2; pad++ {
		body := []byte(strings.Repeat("x", pad) + key + strings.Repeat("y", 40))
		// What the reader hands over: up to limit+len(key)-1 bytes.
		read := body[:min(len(body), limit+len(key)-1)]
		got := string(cutRedacted(read, limit, newSecret(key)))
		for i := minRedactedKey; i <= len(key); i++ {
			if strings.Contains(got, key[:i]) {
				t.Fatalf("pad %d: %d bytes of the key survive the cut: %q", pad, i, got)
			}
		}
		if pad < limit && !strings.Contains(got, "[redacted]") {
			t.Errorf("pad %d: the key before the cut was not replaced: %q", pad, got)
		}
		if len(got) > limit+len("[redacted]") {
			t.Errorf("pad %d: %d bytes, over the limit plus one replacement", pad, len(got))
		}
	}
	// A short key is not looked for: the body is cut at the limit.
	if got := cutRedacted([]byte(strings.Repeat("z", 100)), limit, newSecret("EMPTY")); len(got) != limit {
		t.Errorf("short key: %d bytes, want %d", len(got), limit)
	}
}

// TestKeyRedactorInAnyReads: a body redacted as it streams comes out as
// redactKey makes it whole, whatever sizes of reads it arrives in, a copy
// of the key split across two reads included, and overlapping near-copies
// ("sk-sk-abc…") too.
func TestKeyRedactorInAnyReads(t *testing.T) {
	const key = "sk-abcdefgh12"
	for _, body := range []string{
		"",
		"no key at all, just bytes",
		key,
		"a " + key + " b " + key,
		"sk-sk-abcdefgh12 and sk-abcdefgh1 cut short, sk-",
		strings.Repeat("s", 40) + key + "sk-abcdefg",
	} {
		want := string(redactKey([]byte(body), newSecret(key)))
		for size := 1; size <= len(body)+1; size++ {
			got, err := io.ReadAll(&keyRedactor{r: &chunked{s: body, size: size}, key: newSecret(key)})
			if err != nil || string(got) != want {
				t.Fatalf("%q in reads of %d: %q, %v; want %q", body, size, got, err, want)
			}
		}
	}
}

// TestKeyRedactorHoldsBackOnlyAKeyStart: what cannot begin a copy of the
// key goes out at once, before the upstream sends more (a streamed
// file's or audio's last bytes are not held for the next read).
func TestKeyRedactorHoldsBackOnlyAKeyStart(t *testing.T) {
	const key = "sk-abcdefgh12"
	for _, tc := range []struct {
		first string
		out   string
	}{
		{"audio \xff\xfb", "audio \xff\xfb"},
		{"text then sk-ab", "text then "},
		{"text then s", "text then "},
		{"text then sk-abcdefgh1", "text then "},
		{"ends in k", "ends in k"},
	} {
		wantFirstRead(t, key, tc.first, tc.out)
	}
}

// wantFirstRead checks that a keyRedactor for key whose upstream has sent
// first (and nothing more yet) gives out exactly out on its first read.
func wantFirstRead(t *testing.T, key, first, out string) {
	t.Helper()
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write([]byte(first))
	kr := &keyRedactor{r: pr, key: newSecret(key)}
	buf := make([]byte, 64)
	n, err := kr.Read(buf)
	if err != nil || string(buf[:n]) != out {
		t.Errorf("after %q: first read %q, %v; want %q", first, buf[:n], err, out)
	}
}

// chunked reads s in reads of at most size bytes.
type chunked struct {
	s    string
	size int
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.size)], c.s)
	c.s = c.s[n:]
	return n, nil
}

// TestKeyRedactorGivesUpOnNoProgress: a reader that returns nothing and
// no error forever ends the relay with io.ErrNoProgress, as bufio does,
// instead of spinning.
func TestKeyRedactorGivesUpOnNoProgress(t *testing.T) {
	kr := &keyRedactor{r: stuck{}, key: newSecret("sk-abcdefgh12")}
	if n, err := kr.Read(make([]byte, 8)); n != 0 || err != io.ErrNoProgress {
		t.Fatalf("Read = %d, %v; want 0, io.ErrNoProgress", n, err)
	}
}

type stuck struct{}

func (stuck) Read([]byte) (int, error) { return 0, nil }
