package request

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestCutKeepsWholeCharacters: a logged path, method or error cut at its
// byte limit ends on a character boundary, so a multi-byte character
// that straddles the limit is left out whole, not split into an invalid
// byte (a JSON log handler writes U+FFFD for it, a text one the raw byte).
func TestCutKeepsWholeCharacters(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{strings.Repeat("a", 511) + "é" + "bbb", 512, strings.Repeat("a", 511) + "…(516 bytes)"},
		{strings.Repeat("a", 510) + "€" + "bbb", 512, strings.Repeat("a", 510) + "…(516 bytes)"},
		{strings.Repeat("a", 509) + "€" + "bbb", 512, strings.Repeat("a", 509) + "€…(515 bytes)"},
		{strings.Repeat("a", 512), 512, strings.Repeat("a", 512)},
		{strings.Repeat("a", 513), 512, strings.Repeat("a", 512) + "…(513 bytes)"},
		// Not UTF-8 to begin with: cut where the limit says, no further.
		{strings.Repeat("\xff", 600), 512, strings.Repeat("\xff", 512) + "…(600 bytes)"},
	} {
		got := cut(tc.s, tc.n)
		if got != tc.want {
			t.Errorf("cut(%d bytes, %d) = %q…, want %q…", len(tc.s), tc.n, got[max(0, len(got)-20):], tc.want[max(0, len(tc.want)-20):])
		}
		if utf8.ValidString(tc.s) && !utf8.ValidString(got) {
			t.Errorf("cut(%d bytes, %d) split a character", len(tc.s), tc.n)
		}
	}
}
