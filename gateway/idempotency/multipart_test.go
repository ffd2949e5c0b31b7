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
	body := Fingerprint([]byte(`{"model":"claude","max_tokens":5}`))
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

// TestExtendedParam: an RFC 2231 parameter is found by name outside quoted
// strings, a continuation (name*0=) too; "*=" inside a quoted file name is
// not one.
func TestExtendedParam(t *testing.T) {
	for _, tc := range []struct {
		v, param string
		want     bool
	}{
		{`form-data; name*=UTF-8''prompt; name="a"`, "name", true},
		{`form-data; name="a"; NAME*0=x`, "name", true},
		{`form-data; name="a"; filename*=UTF-8''x.png`, "name", false},
		{`form-data; name="a"; filename="a*=b.png"`, "name", false},
		{`form-data; name="a*=b"`, "name", false},
		{`multipart/form-data; boundary*=UTF-8''XB; boundary="YB"`, "", true},
		{`multipart/form-data; boundary=----WebKitFormBoundary7MA4YWxkTrZu0gW`, "", false},
	} {
		if got := extendedParam(tc.v, tc.param); got != tc.want {
			t.Errorf("extendedParam(%s, %q) = %v, want %v", tc.v, tc.param, got, tc.want)
		}
	}
}
