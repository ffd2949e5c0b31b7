package proxy

import "testing"

// TestMergeQuery: the client's query is forwarded as written, after
// base_url's, and cannot override a parameter base_url sets (Azure's
// api-version).
func TestMergeQuery(t *testing.T) {
	for _, c := range []struct{ base, client, want string }{
		{"", "", ""},
		{"", "limit=2&after=file-1", "limit=2&after=file-1"},
		{"api-version=2024-10-21", "", "api-version=2024-10-21"},
		{"api-version=2024-10-21", "limit=2", "api-version=2024-10-21&limit=2"},
		{"api-version=2024-10-21", "api-version=evil", "api-version=2024-10-21"},
		{"api-version=2024-10-21", "api-version=evil&limit=2", "api-version=2024-10-21&limit=2"},
	} {
		if got := mergeQuery(c.base, c.client); got != c.want {
			t.Errorf("mergeQuery(%q, %q) = %q, want %q", c.base, c.client, got, c.want)
		}
	}
}
