package idempotency

import (
	"bytes"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"testing"
)

type part struct{ name, filename, ctype, body string }

func encodeParts(t testing.TB, boundary string, parts []part) []byte {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	if err := w.SetBoundary(boundary); err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		cd := `form-data; name="` + p.name + `"`
		if p.filename != "" {
			cd += `; filename="` + p.filename + `"`
		}
		h.Set("Content-Disposition", cd)
		if p.ctype != "" {
			h.Set("Content-Type", p.ctype)
		}
		pw, err := w.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		pw.Write([]byte(p.body))
	}
	w.Close()
	return b.Bytes()
}

// TestMultipartFingerprint: the boundary does not count; each part's name,
// file name, content type, bytes and order do.
func TestMultipartFingerprint(t *testing.T) {
	base := []part{{"model", "", "", "whisper-1"}, {"file", "a.wav", "audio/wav", "RIFF0123"}}
	fp := func(boundary string, parts []part) string {
		t.Helper()
		got, fields, _, err := MultipartFingerprint(bytes.NewReader(encodeParts(t, boundary, parts)), boundary, "model")
		if err != nil {
			t.Fatal(err)
		}
		if fields["model"] != parts[0].body && parts[0].name == "model" {
			t.Fatalf("model field %q", fields["model"])
		}
		return got
	}
	want := fp("b1", base)
	if got := fp("another-boundary-9", base); got != want {
		t.Fatal("another boundary changed the fingerprint")
	}
	variants := map[string][]part{
		"name":     {{"model", "", "", "whisper-1"}, {"upload", "a.wav", "audio/wav", "RIFF0123"}},
		"filename": {{"model", "", "", "whisper-1"}, {"file", "b.wav", "audio/wav", "RIFF0123"}},
		"type":     {{"model", "", "", "whisper-1"}, {"file", "a.wav", "audio/x-wav", "RIFF0123"}},
		"byte":     {{"model", "", "", "whisper-1"}, {"file", "a.wav", "audio/wav", "RIFF0124"}},
		"field":    {{"model", "", "", "whisper-2"}, {"file", "a.wav", "audio/wav", "RIFF0123"}},
		"order":    {{"file", "a.wav", "audio/wav", "RIFF0123"}, {"model", "", "", "whisper-1"}},
		"split":    {{"model", "", "", "whisper-1RIFF"}, {"file", "a.wav", "audio/wav", "0123"}},
	}
	for name, parts := range variants {
		if fp("b1", parts) == want {
			t.Errorf("changing the %s did not change the fingerprint", name)
		}
	}
	if _, _, _, err := MultipartFingerprint(bytes.NewReader([]byte("not multipart")), "b1"); err == nil {
		t.Error("a body that is not multipart was fingerprinted")
	}
}

// FuzzMultipartFingerprint: any input is parsed or refused without panic,
// and a body that parses fingerprints alike under another boundary.
func FuzzMultipartFingerprint(f *testing.F) {
	f.Add("model", "", "whisper-1", "file", "a.wav", "RIFF")
	f.Fuzz(func(t *testing.T, n1, f1, b1, n2, f2, b2 string) {
		_, _, _, _ = MultipartFingerprint(bytes.NewReader([]byte(b1+b2)), "x")
		for _, s := range []string{n1, f1, n2, f2} {
			for _, c := range []byte(s) {
				if c < 0x20 || c == '"' || c == '\\' || c > 0x7e {
					return
				}
			}
		}
		parts := []part{{n1, f1, "", b1}, {n2, f2, "text/plain", b2}}
		a, _, _, errA := MultipartFingerprint(bytes.NewReader(encodeParts(t, "boundary-a", parts)), "boundary-a")
		b, _, _, errB := MultipartFingerprint(bytes.NewReader(encodeParts(t, "zz-boundary-b", parts)), "zz-boundary-b")
		if (errA == nil) != (errB == nil) || a != b {
			t.Fatalf("boundaries disagree: %v %v", errA, errB)
		}
	})
}

// TestWithHeaders: the headers named change the fingerprint as written,
// in order; a request with none of them keeps its body's fingerprint.
func TestWithHeaders(t *testing.T) {
	names := []string{"Anthropic-Version", "Anthropic-Beta"}
	body := fingerprintOf(t, []byte(`{"model":"claude","max_tokens":5}`))
	fp := func(h http.Header) string { return WithHeaders(body, h, names) }
	base := fp(http.Header{"Anthropic-Version": {"2023-06-01"}, "Anthropic-Beta": {"a,b"}})
	if got := fp(http.Header{}); got != body {
		t.Errorf("no header: %s, want the body's %s", got, body)
	}
	if got := fp(http.Header{"Anthropic-Version": {"2023-06-01"}, "Anthropic-Beta": {"a,b"}, "User-Agent": {"x"}}); got != base {
		t.Error("a header not named changed the fingerprint")
	}
	for name, h := range map[string]http.Header{
		"another version":        {"Anthropic-Version": {"2026-10-21"}, "Anthropic-Beta": {"a,b"}},
		"another beta":           {"Anthropic-Version": {"2023-06-01"}, "Anthropic-Beta": {"a"}},
		"no beta":                {"Anthropic-Version": {"2023-06-01"}},
		"beta in two lines":      {"Anthropic-Version": {"2023-06-01"}, "Anthropic-Beta": {"a", "b"}},
		"values moved to a name": {"Anthropic-Version": {"2023-06-01", "Anthropic-Beta", "a,b"}},
	} {
		if fp(h) == base {
			t.Errorf("%s: same fingerprint", name)
		}
	}
}

// TestPlainParams: an RFC 2231 parameter is refused by name outside
// quoted strings, a continuation (name*0=) too, a filename*= where it is
// allowed is not, nor "*=" inside a quoted file name; a backslash, a
// control character or a byte outside ASCII outside quotes is refused,
// UTF-8 inside quotes (a file name) is not.
func TestPlainParams(t *testing.T) {
	for _, tc := range []struct {
		v, allowed string
		ok         bool
	}{
		{`form-data; name*=UTF-8''prompt; name="a"`, "filename", false},
		{`form-data; name="a"; NAME*0=x`, "filename", false},
		{`form-data; name="a"; filename*=UTF-8''x.png`, "filename", true},
		{`form-data; name="a"; FileName*=UTF-8''x.png`, "filename", true},
		{`form-data; name="a"; filename="a*=b.png"`, "filename", true},
		{`form-data; name="a*=b"`, "filename", true},
		{`form-data; name="image"; filename="chat noir é.png"`, "filename", true},
		{`form-data; name="prompt"; x="a\\"; y="; name=images[][file_id]; z="`, "filename", false},
		{`form-data; name="a"; filename="C:\\x.png"`, "filename", true},
		{`form-data; name="a"; filename="say \"hi\".png"`, "filename", true},
		{`form-data; name="a"; filename="a\\\"b.png"`, "filename", true},
		{`form-data; name="a"; filename="a\\"; name="b"`, "filename", false},
		{`form-data; name="a"; filename="a\\\\"; name="b"`, "filename", false},
		{"form-data; name=\"a\"; filename=\"a\x01b.png\"", "filename", true},
		{`form-data; name=a\"b`, "filename", false},
		{`form-data; name="file"; filename="rapport %22final%22 é\x.jsonl"`, "filename", true},
		{"form-data; name*\u00a0=UTF-8''prompt; name=\"a\"", "filename", false},
		{"form-data;\u00a0name=\"a\"", "filename", false},
		{"form-data; name=\"a\"\x00", "filename", false},
		{"form-data; name=\"a\"\x0b", "filename", false},
		{"form-data;\tname=\"a\"", "filename", true},
		{`multipart/form-data; boundary*=UTF-8''XB; boundary="YB"`, "", false},
		{`multipart/form-data; boundary=----WebKitFormBoundary7MA4YWxkTrZu0gW`, "", true},
		{`multipart/form-data; boundary="--- b'()+_,-./:=? x"`, "", true},
	} {
		if err := plainParams(tc.v, tc.allowed); (err == nil) != tc.ok {
			t.Errorf("plainParams(%q, %q) = %v, want ok %v", tc.v, tc.allowed, err, tc.ok)
		}
	}
}

// TestFormLinesInAnyChunks: formLines decides a body the same whichever
// sizes of writes it arrives in (Go's parser reads in its own), and
// refuses exactly the line ends and delimiters Go and python-multipart
// read apart.
func TestFormLinesInAnyChunks(t *testing.T) {
	const b = "YB"
	part := "--YB\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nx\r\n"
	for _, tc := range []struct {
		name, body string
		ok         bool
	}{
		{"plain", part + "--YB--\r\n", true},
		{"data that starts like a delimiter", part[:len(part)-2] + "\r\n--YBx\r\n--YB\n\r\n--YB--", true},
		{"bare LF in a part's data", "--YB\r\nContent-Type: text/plain\r\n\r\na\nb\r\n--YB--", true},
		{"an epilogue, anything", part + "--YB--\n\n junk \r", true},
		{"a preamble", "hello\r\n" + part + "--YB--\r\n", false},
		{"a first line ended by LF", "--YB\nContent-Disposition: form-data; name=\"a\"\n\nx\n--YB--\n", false},
		{"a bare LF in the headers", "--YB\r\nContent-Disposition: form-data; name=\"a\"\n\r\nx\r\n--YB--", false},
		{"a CR alone in the headers", "--YB\r\nContent-Disposition: form-data; name=\"a\"\rX: y\r\n\r\nx\r\n--YB--", false},
		{"a padded delimiter", part + "--YB \r\nContent-Disposition: form-data; name=\"b\"\r\n\r\ny\r\n--YB--", false},
		{"a padded first line", "--YB\t\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nx\r\n--YB--", false},
		{"a second part's bare LF", part + "--YB\r\nContent-Disposition: form-data; name=\"b\"\nX: y\r\n\r\ny\r\n--YB--", false},
	} {
		whole := writeAll(b, []byte(tc.body), len(tc.body))
		if (whole == nil) != tc.ok {
			t.Errorf("%s: %v, want ok %v", tc.name, whole, tc.ok)
		}
		for size := 1; size < len(tc.body); size++ {
			if err := writeAll(b, []byte(tc.body), size); (err == nil) != (whole == nil) {
				t.Fatalf("%s in writes of %d bytes: %v, but whole: %v", tc.name, size, err, whole)
			}
		}
	}
}

// writeAll writes body to a new formLines in writes of size bytes.
func writeAll(boundary string, body []byte, size int) error {
	f := newFormLines(boundary)
	for len(body) > 0 {
		n := min(size, len(body))
		if _, err := f.Write(body[:n]); err != nil {
			return err
		}
		body = body[n:]
	}
	return nil
}
