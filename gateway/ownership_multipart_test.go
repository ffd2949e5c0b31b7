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
	body, ct := form("images[][file_id]")
	h.do(http.MethodPost, "/v1/images/edits", body, map[string]string{"Authorization": asAlice["Authorization"], "Content-Type": ct})
	if seen := up.requests(); len(seen) != 1 {
		t.Fatalf("alice naming her own file: the upstream saw %d requests, want 1", len(seen))
	}
}
