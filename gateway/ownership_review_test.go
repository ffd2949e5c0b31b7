package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
)

// Regression tests for a review of the ownership checks: bodies the
// gateway did not read as JSON, dot segments in a model id, encoded
// slashes in an object id, and Responses bodies naming items and
// containers.

// TestReviewNonJSONContentTypeBypassesBodyCheck: a JSON body sent as
// text/plain, form-urlencoded or with no Content-Type is checked like an
// application/json one under a shared key: bob's batch over alice's file
// never reaches the upstream.
func TestReviewNonJSONContentTypeBypassesBodyCheck(t *testing.T) {
	h, up := ownersHarness(t, nil)
	h.store.PutOwner(t.Context(), "alice", "file-a", cache.Owner{Upstream: "primary", Kind: "file"}, time.Hour)
	body := `{"input_file_id":"file-a","endpoint":"/v1/chat/completions","completion_window":"24h"}`
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", ""} {
		r := h.do(http.MethodPost, "/v1/batches", body, map[string]string{"Authorization": asBob["Authorization"], "Content-Type": ct})
		for _, s := range up.requests() {
			if strings.Contains(s.Body, "file-a") {
				t.Errorf("Content-Type %q: bob's batch over alice's file reached the upstream (%d %s)", ct, r.status, r.body)
			}
		}
		// Alice's own file passes, checked, whatever the Content-Type.
		r = h.do(http.MethodPost, "/v1/batches", body, map[string]string{"Authorization": asAlice["Authorization"], "Content-Type": ct})
		if r.status != http.StatusOK || len(up.requests()) != 1 {
			t.Errorf("Content-Type %q: alice's batch: %d %s", ct, r.status, r.body)
		}
	}
}

// TestReviewUncheckableBodyRefusedUnderSharedKey: a body the gateway
// cannot scan for ids — not JSON, or streamed once past
// passthrough.spool_max_bytes — is refused under a shared key (415, 413)
// and
// forwarded under a client's own key.
func TestReviewUncheckableBodyRefusedUnderSharedKey(t *testing.T) {
	h, up := ownersHarness(t, func(c *config.Config) {
		c.Passthrough.SpoolMaxBytes = 128
		c.Clients[0].UpstreamAPIKeys = map[string]string{"primary": aliceOwn}
	})
	h.store.PutOwner(t.Context(), "alice", "file-a", cache.Owner{Upstream: "primary", Kind: "file"}, time.Hour)
	big := `{"input_file_id":"file-a","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":{"note":"well over 128 bytes long"}}`
	for _, tc := range []struct {
		body, ct string
		status   int
		code     string
	}{
		{"input_file_id=file-a", "application/x-www-form-urlencoded", http.StatusUnsupportedMediaType, "unsupported_media_type"},
		{"--x\r\nContent-Disposition: form-data; name=\"input_file_id\"\r\n\r\nfile-a\r\n--x--\r\n", "multipart/form-data; boundary=x",
			http.StatusUnsupportedMediaType, "unsupported_media_type"},
		{big, "application/json", http.StatusRequestEntityTooLarge, "request_too_large"},
		{big, "text/plain", http.StatusRequestEntityTooLarge, "request_too_large"},
	} {
		r := h.do(http.MethodPost, "/v1/batches", tc.body, map[string]string{"Authorization": asBob["Authorization"], "Content-Type": tc.ct})
		if e := wantOpenAIError(t, r, tc.status); e["code"] != tc.code {
			t.Errorf("%s %s: %v", tc.ct, tc.body, e)
		}
		if seen := up.requests(); len(seen) != 0 {
			t.Errorf("%s %s: the upstream was called: %+v", tc.ct, tc.body, seen)
		}
		if r := h.do(http.MethodPost, "/v1/batches", tc.body, map[string]string{"Authorization": asAlice["Authorization"], "Content-Type": tc.ct}); r.status != http.StatusOK {
			t.Errorf("own key, %s: %d %s", tc.ct, r.status, r.body)
		}
		up.requests()
	}
}

// TestReviewUploadsPassUnderSharedKey: a multipart upload passes under a
// shared key, streamed unread past passthrough.spool_max_bytes too.
func TestReviewUploadsPassUnderSharedKey(t *testing.T) {
	h, up := ownersHarness(t, func(c *config.Config) { c.Passthrough.SpoolMaxBytes = 128 })
	body := "--x\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n" +
		"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n" + strings.Repeat("{}\n", 100) + "\r\n--x--\r\n"
	r := h.do(http.MethodPost, "/v1/files", body, map[string]string{"Authorization": asBob["Authorization"], "Content-Type": "multipart/form-data; boundary=x"})
	if r.status != http.StatusOK || len(up.requests()) != 1 {
		t.Fatalf("upload: %d %s", r.status, r.body)
	}
}

// TestReviewModelsDotDotListsFilesNormalising: a model id with dot
// segments is a 404, never sent to an upstream that would normalise it
// into another path.
func TestReviewModelsDotDotListsFilesNormalising(t *testing.T) {
	var paths []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.EscapedPath())
		if path.Clean(r.URL.Path) == "/v1/files" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"object":"list","data":[{"id":"file-alice-secret","object":"file"}]}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"model"}`)
	}))
	defer up.Close()
	h, _ := ownersHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = up.URL + "/v1" })
	for _, p := range []string{"/v1/models/x%2F..%2F..%2Ffiles", "/v1/models/x%2F.%2Fy", "/v1/models/x%2F%2Fy", "/v1/models/x/"} {
		r := h.do(http.MethodGet, p, "", asBob)
		if strings.Contains(string(r.body), "file-alice-secret") {
			t.Errorf("bob listed every tenant's files via /v1/models: %d %s", r.status, r.body)
		}
		if e := wantOpenAIError(t, r, http.StatusNotFound); e["code"] != "model_not_found" {
			t.Errorf("%s: %v", p, e)
		}
	}
	if len(paths) != 0 {
		t.Fatalf("the upstream was called: %v", paths)
	}
	// Each segment of an id is escaped: nothing the client wrote is read
	// as path syntax upstream (an id holding ";" or "?" is refused
	// outright since: TestModelIDOtherPathSyntaxRefused).
	if r := h.do(http.MethodGet, "/v1/models/org%2Fa:b@c", "", asBob); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if len(paths) != 1 || paths[0] != "/v1/models/org/a:b@c" {
		t.Fatalf("upstream saw %v, want /v1/models/org/a:b@c", paths)
	}
}

// TestReviewEncodedSlashInObjectID: an object id with an encoded "/" does
// not become another path segment upstream (where the check saw one id
// and the upstream another path): 404, no upstream call.
func TestReviewEncodedSlashInObjectID(t *testing.T) {
	h, up := ownersHarness(t, nil)
	h.store.PutOwner(t.Context(), "bob", "file-b", cache.Owner{Upstream: "primary", Kind: "file"}, time.Hour)
	for _, p := range []string{"/v1/files/file-b%2Fcontent", "/v1/files/file-b%2fcontent", "/v1/vector_stores/vs%2F..%2Ffiles"} {
		r := h.do(http.MethodGet, p, "", asBob)
		wantOpenAIError(t, r, http.StatusNotFound)
		if seen := up.requests(); len(seen) != 0 {
			t.Errorf("%s reached the upstream as %+v", p, seen)
		}
	}
	if r := h.do(http.MethodGet, "/v1/files/file-b/content", "", asBob); r.status != http.StatusOK {
		t.Fatalf("bob's own file: %d %s", r.status, r.body)
	}
}

// TestReviewItemReferenceRefused: an item_reference (typed, or an input
// item that is only an id) names an item the provider keeps under the
// shared key: refused with a 400 before any upstream call; with her own
// key alice may send it.
func TestReviewItemReferenceRefused(t *testing.T) {
	h, up := ownersHarness(t, func(c *config.Config) {
		c.Clients[0].UpstreamAPIKeys = map[string]string{"primary": aliceOwn}
	})
	for _, item := range []string{`{"type":"item_reference","id":"msg_alice"}`, `{"id":"msg_alice"}`} {
		body := `{"model":"gpt-4o","input":[{"role":"user","content":"hi"},` + item + `]}`
		r := h.do(http.MethodPost, "/v1/responses", body, asBob)
		if e := wantOpenAIError(t, r, http.StatusBadRequest); e["code"] != "item_reference_not_allowed" || e["param"] != "input" {
			t.Errorf("%s: %v", item, e)
		}
		if seen := up.requests(); len(seen) != 0 {
			t.Errorf("%s reached the upstream: %+v", item, seen)
		}
		if r := h.do(http.MethodPost, "/v1/responses", body, asAlice); r.status != http.StatusOK {
			t.Errorf("own key: %d %s", r.status, r.body)
		}
		up.requests()
	}
}

// TestReviewContainerOwned: the container a code_interpreter call ran in
// (container_id in the answer) is the creator's: bob cannot run code in
// alice's container, nor in one never handed out; alice can.
func TestReviewContainerOwned(t *testing.T) {
	h, up := ownersHarness(t, nil)
	_, r := create(t, h, up, `{"model":"gpt-4o","input":"1+1","store":true,"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, asAlice)
	i := strings.Index(string(r.body), `"container_id":"`)
	if i < 0 {
		t.Fatalf("no container in %s", r.body)
	}
	cntr, _, _ := strings.Cut(string(r.body[i+len(`"container_id":"`):]), `"`)
	use := func(id string) string {
		return `{"model":"gpt-4o","input":"2+2","tools":[{"type":"code_interpreter","container":"` + id + `"}]}`
	}
	wantNotFound(t, h.do(http.MethodPost, "/v1/responses", use(cntr), asBob), up, "container_not_found")
	wantNotFound(t, h.do(http.MethodPost, "/v1/responses", use("cntr_never"), asAlice), up, "container_not_found")
	if r := h.do(http.MethodPost, "/v1/responses", use(cntr), asAlice); r.status != http.StatusOK {
		t.Fatalf("alice's container: %d %s", r.status, r.body)
	}
	// The hosted shell tool names its container by reference: the same
	// check (the hostile-tenant run had bob's shell run in alice's).
	up.requests()
	shell := func(id string) string {
		return `{"model":"gpt-4o","input":"ls","tools":[{"type":"shell","environment":{"type":"container_reference","container_id":"` + id + `"}}]}`
	}
	wantNotFound(t, h.do(http.MethodPost, "/v1/responses", shell(cntr), asBob), up, "container_not_found")
	if r := h.do(http.MethodPost, "/v1/responses", shell(cntr), asAlice); r.status != http.StatusOK {
		t.Fatalf("alice's shell in her container: %d %s", r.status, r.body)
	}
	// A response with store false is not kept, the container its code ran in is.
	_, r = create(t, h, up, `{"model":"gpt-4o","input":"1+1","store":false,"tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, asAlice)
	i = strings.Index(string(r.body), `"container_id":"`)
	cntr, _, _ = strings.Cut(string(r.body[i+len(`"container_id":"`):]), `"`)
	if r := h.do(http.MethodPost, "/v1/responses", use(cntr), asAlice); r.status != http.StatusOK {
		t.Fatalf("alice's container of a store:false response: %d %s", r.status, r.body)
	}
	// An auto container's file_ids are still checked.
	up.requests()
	wantNotFound(t, h.do(http.MethodPost, "/v1/responses",
		`{"model":"gpt-4o","input":"x","tools":[{"type":"code_interpreter","container":{"type":"auto","file_ids":["file-x"]}}]}`, asBob), up, "file_not_found")
}

// TestPathSyntaxAfterOwnIDRefused: the path check reads the first id of a
// passthrough path and forwards the rest as sent; a segment after one's
// own id that another server reads as path syntax — Tomcat's and Jetty's
// path parameters (/..;/ is /../), IIS's backslash, a percent sign a
// proxy decodes again — would name another tenant's object there. Each
// is the 404 an unclean path gets, with no upstream call (the
// hostile-tenant run forwarded all of them).
func TestPathSyntaxAfterOwnIDRefused(t *testing.T) {
	h, up := ownersHarness(t, nil)
	alices := upload(t, h, up, asAlice)
	bobs := upload(t, h, up, asBob)
	for _, p := range []string{
		"/v1/files/" + bobs + "/..;/" + alices + "/content",
		"/v1/files/" + bobs + "/..;/" + alices,
		"/v1/files/" + bobs + "/.;/content",
		"/v1/files/" + bobs + ";x/content",
		"/v1/files/" + bobs + "/%5c..%5c" + alices + "%5ccontent",
		"/v1/files/" + bobs + "/%252e%252e/" + alices,
		"/v1/files/" + bobs + "/.hidden",
		// What a server that trims or normalises reads as "..", and what
		// cuts a path short there.
		"/v1/files/" + bobs + "/%20../" + alices,
		"/v1/files/" + bobs + "/%EF%BC%8E%EF%BC%8E/" + alices,
		"/v1/files/" + bobs + "/%3F/../" + alices,
		"/v1/files/" + bobs + "%23/content",
	} {
		r := h.do(http.MethodGet, p, "", asBob)
		if r.status != http.StatusNotFound {
			t.Errorf("GET %s: %d %s, want 404", p, r.status, r.body)
		}
		if seen := up.requests(); len(seen) != 0 {
			t.Errorf("GET %s: the upstream was called: %+v", p, seen)
		}
	}
	if r := h.do(http.MethodGet, "/v1/files/"+bobs+"/content", "", asBob); r.status != http.StatusOK {
		t.Fatalf("bob's own content: %d %s", r.status, r.body)
	}
}

// TestModelIDOtherPathSyntaxRefused: a model id holding syntax another
// server reads as a path — a backslash (IIS reads it as "/"), a "%" left
// after decoding (a server that decodes again reads %2F), ";" (Tomcat,
// Jetty), "?", "#", a space at a segment's edge, a control byte,
// non-ASCII, or a segment starting with "." — is a 404 with no upstream
// call, as on the
// passthrough paths. The hostile-tenant run read another tenant's file
// content through /v1/models/gpt-a%5C..%5C..%5Cfiles%5C<id>%5Ccontent
// from an upstream that reads backslashes as slashes. Real ids pass.
func TestModelIDOtherPathSyntaxRefused(t *testing.T) {
	var paths []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.EscapedPath())
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"model"}`)
	}))
	defer up.Close()
	h, _ := ownersHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = up.URL + "/v1" })
	for _, p := range []string{
		"/v1/models/gpt-a%5C..%5C..%5Cfiles%5Cfile-abc%5Ccontent",
		"/v1/models/gpt-a%252F..%252F..%252Ffiles%252Ffile-abc%252Fcontent",
		"/v1/models/gpt-a%3B..%3Bfiles",
		"/v1/models/org%2Fa%3Bb%3Fc",
		"/v1/models/gpt-a%23x",
		"/v1/models/gpt-a%20..",
		"/v1/models/x/%20../%20../files",
		"/v1/models/gpt-a%20",
		"/v1/models/gpt-a%09x",
		"/v1/models/gpt-a%EF%BC%8E%EF%BC%8E",
		"/v1/models/org/.hidden",
		"/v1/models/.x",
	} {
		r := h.do(http.MethodGet, p, "", asBob)
		if e := wantOpenAIError(t, r, http.StatusNotFound); e["code"] != "model_not_found" {
			t.Errorf("%s: %v", p, e)
		}
	}
	if len(paths) != 0 {
		t.Fatalf("the upstream was called: %v", paths)
	}
	for _, id := range []string{"gpt-4.1-mini", "ft:gpt-4o-mini-2024-07-18:acme:support:9XyZ", "meta-llama/Llama-3.1-8B-Instruct", "claude-3-5-sonnet@20240620", "org/model_v1.2+q4",
		"Llama%203%208B%20Instruct"} { // GPT4All's ids hold spaces
		if r := h.do(http.MethodGet, "/v1/models/"+id, "", asBob); r.status != http.StatusOK {
			t.Errorf("%s: %d %s", id, r.status, r.body)
		}
	}
	if len(paths) != 6 {
		t.Fatalf("upstream saw %v, want the six real ids", paths)
	}
}
