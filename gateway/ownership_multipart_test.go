package gateway

import (
	"bytes"
	"mime/multipart"
	"net/http"
	"testing"
)

// A multipart form (image edits) naming a stored file by id —
// images[][file_id], mask[file_id], file_id — is checked like a JSON body:
// under the shared key, bob naming alice's file is the ownership 404 with
// no upstream call; alice naming her own goes through.
func TestMultipartFileIDsOfOthersRefused(t *testing.T) {
	h, up := ownersHarness(t, nil)
	file := upload(t, h, up, asAlice)
	form := func(name string) (string, string) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		mw.WriteField("model", "gpt-image-1")
		mw.WriteField("prompt", "a cat")
		mw.WriteField(name, file)
		mw.Close()
		return buf.String(), mw.FormDataContentType()
	}
	for _, name := range []string{"images[][file_id]", "mask[file_id]", "file_id", "Images[][FILE_ID]"} {
		body, ct := form(name)
		r := h.do(http.MethodPost, "/v1/images/edits", body, map[string]string{"Authorization": asBob["Authorization"], "Content-Type": ct})
		wantNotFound(t, r, up, "file_not_found")
	}
	// A part whose disposition Go might read no name from, but a
	// provider's parser might: refused (400) or checked (404) before the
	// upstream, never passed on unchecked.
	// Starlette (FastAPI, LiteLLM's proxy, vLLM) names a part from its last
	// Content-Disposition, Go from its first: a part with two is refused.
	// So is a part named as a file id that carries a file name: a parser
	// may still read the id from it.
	for _, cd := range []string{`attachment; name="images[][file_id]"`, `form-data; name="mask[file_id]"; name="mask[file_id]"`,
		"form-data; name=\"note\"\r\nContent-Disposition: form-data; name=\"images[][file_id]\"",
		`form-data; name="images[][file_id]"; filename="x.txt"`,
		// RFC 2231 parameters: Go takes name* over name, python-multipart
		// (0.0.30 on) ignores it, earlier ones decode charsets Go skips.
		`form-data; name*=UTF-8''prompt; name="images[][file_id]"`,
		`form-data; name="prompt"; name*=iso-8859-1''images%5B%5D%5Bfile_id%5D`,
		// A bare LF: Go ends the header line there, python-multipart keeps
		// the next line in the disposition (and reads its last name).
		"form-data; name=\"prompt\"\nX-A: b; name=\"images[][file_id]\""} {
		raw := "--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ngpt-image-1\r\n" +
			"--x\r\nContent-Disposition: " + cd + "\r\n\r\n" + file + "\r\n--x--\r\n"
		r := h.do(http.MethodPost, "/v1/images/edits", raw, map[string]string{"Authorization": asBob["Authorization"], "Content-Type": "multipart/form-data; boundary=x"})
		if r.status != http.StatusBadRequest && r.status != http.StatusNotFound {
			t.Fatalf("%s: %d %s, want 400 or the ownership 404", cd, r.status, r.body)
		}
		if seen := up.requests(); len(seen) != 0 {
			t.Fatalf("%s: the upstream was called: %+v", cd, seen)
		}
	}
	// A boundary given twice, once as an RFC 2231 parameter: Go and Python
	// split the body at different boundaries.
	smuggled := "--XB\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ngpt-image-1\r\n--XB--\r\n" +
		"--YB\r\nContent-Disposition: form-data; name=\"images[][file_id]\"\r\n\r\n" + file + "\r\n--YB--\r\n"
	r := h.do(http.MethodPost, "/v1/images/edits", smuggled, map[string]string{"Authorization": asBob["Authorization"],
		"Content-Type": `multipart/form-data; boundary*=UTF-8''XB; boundary="YB"`})
	if r.status != http.StatusBadRequest {
		t.Fatalf("two boundaries: %d %s, want 400", r.status, r.body)
	}
	if seen := up.requests(); len(seen) != 0 {
		t.Fatalf("two boundaries: the upstream was called: %+v", seen)
	}
	body, ct := form("images[][file_id]")
	h.do(http.MethodPost, "/v1/images/edits", body, map[string]string{"Authorization": asAlice["Authorization"], "Content-Type": ct})
	if seen := up.requests(); len(seen) != 1 {
		t.Fatalf("alice naming her own file: the upstream saw %d requests, want 1", len(seen))
	}
}
