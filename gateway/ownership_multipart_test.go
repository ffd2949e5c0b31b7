package gateway

import (
	"bytes"
	"context"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	openaigo "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	goopenai "github.com/sashabaranov/go-openai"
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

// TestMultipartReadAlikeOrRefused: request bodies Go's mime/multipart and
// python-multipart (as Starlette drives it) split or name differently,
// each used by the read-only review to pass another tenant's file id to
// the upstream under a harmless name: refused with a 400, the upstream
// never called. Uploads as SDKs send them still pass, non-ASCII file
// names and filename*= included.
func TestMultipartReadAlikeOrRefused(t *testing.T) {
	h, up := ownersHarness(t, nil)
	file := upload(t, h, up, asAlice)
	model := "--YB\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ngpt-image-1\r\n"
	idPart := "--YB\r\nContent-Disposition: form-data; name=\"images[][file_id]\"\r\n\r\n" + file + "\r\n"
	plain := "multipart/form-data; boundary=YB"
	nbsp := "\u00a0"
	for _, tc := range []struct{ name, ct, body string }{
		// Go cannot parse the parameters, so it read no boundary and no
		// part at all; Python ignores the bare "junk".
		{"a Content-Type Go cannot parse", "multipart/form-data; boundary=YB; junk", model + idPart + "--YB--\r\n"},
		{"a Content-Type with no boundary", "multipart/form-data", model + idPart + "--YB--\r\n"},
		// Inside quotes Go reads \\ as one backslash and " as the end;
		// Python's quote count takes \\" for an escaped quote, so the
		// two split the parameters at different semicolons.
		{`a \\" in a part's disposition`, plain, model + "--YB\r\nContent-Disposition: form-data; name=\"prompt\"; x=\"a\\\\\"; y=\"; name=images[][file_id]; z=\"\r\n\r\n" + file + "\r\n--YB--\r\n"},
		{`a \\" in the Content-Type`, `multipart/form-data; x="a\\"; y="; boundary=XB; z="; boundary=YB`,
			"--XB\r\nContent-Disposition: form-data; name=\"images[][file_id]\"\r\n\r\n" + file + "\r\n--XB--\r\n" + model + "--YB--\r\n"},
		// Go skips any Unicode space around a parameter; python-multipart
		// drops a name holding '*'.
		{"a no-break space after name*", plain, model + "--YB\r\nContent-Disposition: form-data; name*" + nbsp + "=UTF-8''prompt; name=\"images[][file_id]\"\r\n\r\n" + file + "\r\n--YB--\r\n"},
		{"a no-break space before name*", plain, model + "--YB\r\nContent-Disposition: form-data;" + nbsp + "name*=UTF-8''prompt; name=\"images[][file_id]\"\r\n\r\n" + file + "\r\n--YB--\r\n"},
		{"a no-break space after boundary*", "multipart/form-data; boundary*" + nbsp + "=UTF-8''XB; boundary=YB",
			idPart + "--YB--\r\n--XB\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ngpt-image-1\r\n--XB--\r\n"},
		// A bare LF before the blank line: Go ends the headers at the
		// blank line, Python keeps the LF in the first header and reads
		// the next disposition, whose name it takes.
		{"a bare LF before the blank line", plain, model + "--YB\r\nContent-Disposition: form-data; name=\"prompt\"\n\r\nContent-Disposition: form-data; name=\"images[][file_id]\"\r\n\r\n" + file + "\r\n--YB--\r\n"},
		// Transport padding after a boundary: Go takes the line for a
		// delimiter, python-multipart for data.
		{"padding after a boundary", plain, model + "--YB \r\nContent-Disposition: form-data; name=\"images[][file_id]\"\r\n\r\n" + file + "\r\n--YB--\r\n"},
		// LF line ends throughout: Go reads them, python-multipart not.
		{"LF line ends", plain, strings.ReplaceAll(model+idPart+"--YB--\r\n", "\r\n", "\n")},
		// Starlette decodes every part's name and value with the
		// Content-Type's charset; Go reads the bytes (the second review
		// passed the id as images[][file+AF8-id] under UTF-7).
		{"a charset other than UTF-8", "multipart/form-data; boundary=YB; charset=utf-7",
			model + "--YB\r\nContent-Disposition: form-data; name=\"images[][file+AF8-id]\"\r\n\r\n" + file + "\r\n--YB--\r\n"},
		{"another parameter", "multipart/form-data; boundary=YB; x=y", model + idPart + "--YB--\r\n"},
		// Two backslashes before a quote: Go closes the string there,
		// Python's count does not.
		{`\\" in a file name`, plain, model + "--YB\r\nContent-Disposition: form-data; name=\"prompt\"; filename=\"a\\\\\"; y=\"; name=images[][file_id]; z=\"\r\n\r\n" + file + "\r\n--YB--\r\n"},
		// A model sent again as a file (filename*=): Go routes by the
		// field, Starlette reads the part as a field and takes the last.
		{"a model field sent again with filename*=", plain, model + "--YB\r\nContent-Disposition: form-data; name=\"model\"; filename*=UTF-8''m\r\n\r\ndall-e-2\r\n--YB--\r\n"},
		// A backslash before a character that is no tspecial: Go keeps
		// both, busboy (Node) drops the backslash and reads the file id
		// field (the hostile-tenant run).
		{`a \_ in a field name`, plain, model + "--YB\r\nContent-Disposition: form-data; name=\"images[][file\\_id]\"\r\n\r\n" + file + "\r\n--YB--\r\n"},
	} {
		r := h.do(http.MethodPost, "/v1/images/edits", tc.body, map[string]string{"Authorization": asBob["Authorization"], "Content-Type": tc.ct})
		if r.status != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", tc.name, r.status, r.body)
		}
		if seen := up.requests(); len(seen) != 0 {
			t.Fatalf("%s: the upstream was called: %+v", tc.name, seen)
		}
	}
	// Alice's own upload, as the Go SDK writes one (a quoted boundary, a
	// file with a non-ASCII name), and with filename*= as well, as some
	// clients add for such a name.
	for _, cd := range []string{`form-data; name="image"; filename="chat noir é.png"`,
		`form-data; name="image"; filename="e.png"; filename*=UTF-8''%C3%A9.png`,
		// A backslash as Go's writer and httpx escape it, one as undici
		// leaves it.
		`form-data; name="image"; filename="a\\b.png"`, `form-data; name="image"; filename="a\b.png"`} {
		body := "--YB\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ngpt-image-1\r\n" +
			"--YB\r\nContent-Disposition: " + cd + "\r\nContent-Type: image/png; name=\"a.png\"\r\n\r\n\x89PNG\r\n\x1a\n\r\n" + idPart + "--YB--\r\n"
		before := len(up.requests())
		r := h.do(http.MethodPost, "/v1/images/edits", "\r\n"+body, map[string]string{"Authorization": asAlice["Authorization"], "Content-Type": `multipart/form-data; boundary="YB"; charset=UTF-8`})
		if seen := up.requests(); len(seen) != before+1 {
			t.Fatalf("alice's own upload (%s): %d %s; the upstream saw %d requests, want %d", cd, r.status, r.body, len(seen), before+1)
		}
	}
}

// TestSDKUploadsPassTheFormChecks: the form checks refuse no upload as the
// Go SDKs write one, also of a file whose name holds a quote (escaped
// \" inside its quotes), spaces and non-ASCII: openai-go and go-openai
// through the gateway, the upstream receiving each, the file's bytes
// whole.
func TestSDKUploadsPassTheFormChecks(t *testing.T) {
	h, up := ownersHarness(t, nil)
	const name = `rapport "final" é.jsonl`
	const content = "{\"custom_id\":\"1\"}\n"
	oc := openaigo.NewClient(option.WithBaseURL(h.srv.URL+"/v1"), option.WithAPIKey(aliceKey), option.WithMaxRetries(0))
	f, err := oc.Files.New(context.Background(), openaigo.FileNewParams{
		File: openaigo.File(strings.NewReader(content), name, "application/jsonl"), Purpose: openaigo.FilePurposeBatch})
	if err != nil {
		t.Fatalf("openai-go Files.New: %v", err)
	}
	gc := goopenai.NewClientWithConfig(func() goopenai.ClientConfig {
		c := goopenai.DefaultConfig(aliceKey)
		c.BaseURL = h.srv.URL + "/v1"
		return c
	}())
	g, err := gc.CreateFileBytes(context.Background(), goopenai.FileBytesRequest{Name: name, Bytes: []byte(content), Purpose: goopenai.PurposeBatch})
	if err != nil {
		t.Fatalf("go-openai CreateFileBytes: %v", err)
	}
	seen := up.requests()
	if len(seen) != 2 || f.ID == "" || g.ID == "" {
		t.Fatalf("the upstream saw %d uploads (ids %q, %q), want 2", len(seen), f.ID, g.ID)
	}
	for _, s := range seen {
		if !strings.Contains(s.Body, content) || !strings.Contains(s.Body, `é.jsonl"`) {
			t.Errorf("the upload reached the upstream as:\n%s", s.Body)
		}
	}
}
