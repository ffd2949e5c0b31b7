package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestAmbiguousCredentialsRefused: a request whose credential is
// ambiguous — two Authorization headers, two x-api-key headers, or both
// headers naming different keys — is a 400 in OpenAI's error shape, and
// nothing reaches the upstream, whichever key comes first. Both headers
// with the same key, or either alone, authenticate.
func TestAmbiguousCredentialsRefused(t *testing.T) {
	h, up := ownersHarness(t, nil)
	send := func(hdr http.Header) result {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = hdr
		req.Header.Set("Content-Type", "application/json")
		res, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return result{status: res.StatusCode, header: res.Header, body: b}
	}
	bearer := func(k string) string { return "Bearer " + k }
	for _, tc := range []struct {
		name string
		hdr  http.Header
	}{
		{"two Authorization, victim's first", http.Header{"Authorization": {bearer(aliceKey), bearer(bobKey)}}},
		{"two Authorization, own first", http.Header{"Authorization": {bearer(bobKey), bearer(aliceKey)}}},
		{"two equal Authorization", http.Header{"Authorization": {bearer(bobKey), bearer(bobKey)}}},
		{"two x-api-key", http.Header{"X-Api-Key": {aliceKey, bobKey}}},
		{"Authorization and a different x-api-key", http.Header{"Authorization": {bearer(bobKey)}, "X-Api-Key": {aliceKey}}},
		{"x-api-key and a non-bearer Authorization", http.Header{"Authorization": {"Basic Ym9iOng="}, "X-Api-Key": {bobKey}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := send(tc.hdr)
			e := wantOpenAIError(t, r, http.StatusBadRequest)
			if e["type"] != "invalid_request_error" || e["code"] != "ambiguous_credentials" {
				t.Fatalf("error = %v", e)
			}
			if strings.Contains(string(r.body), aliceKey) || strings.Contains(string(r.body), bobKey) {
				t.Fatalf("a key in the answer: %s", r.body)
			}
			if seen := up.requests(); len(seen) != 0 {
				t.Fatalf("the upstream was called: %+v", seen)
			}
		})
	}
	for _, tc := range []struct {
		name string
		hdr  http.Header
	}{
		{"Authorization", http.Header{"Authorization": {bearer(bobKey)}}},
		{"x-api-key", http.Header{"X-Api-Key": {bobKey}}},
		{"both, equal", http.Header{"Authorization": {bearer(bobKey)}, "X-Api-Key": {bobKey}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r := send(tc.hdr); r.status != http.StatusOK {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if seen := up.requests(); len(seen) != 1 || seen[0].Auth != "Bearer "+upstreamKey {
				t.Fatalf("upstream saw %+v", seen)
			}
		})
	}
}
