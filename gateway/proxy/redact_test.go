package proxy

import "testing"

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
		if got := string(redactKey([]byte(tc.body), tc.key)); got != tc.want {
			t.Errorf("redactKey(%s, %q) = %s, want %s", tc.body, tc.key, got, tc.want)
		}
	}
}
