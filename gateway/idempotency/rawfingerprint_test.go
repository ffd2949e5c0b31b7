package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"mime/multipart"
	"testing"
)

// A raw body cannot have a form's fingerprint: a form whose first part is
// named "raw body" (no file name) once hashed the prefix RawFingerprint("")
// did, and the rest of its hash input is bytes a raw body can hold (found
// by review). Now the raw prefix starts with a byte no form's can.
func TestRawFingerprintApartFromForms(t *testing.T) {
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	pw, _ := mw.CreateFormField("raw body")
	pw.Write([]byte("hello"))
	mw.Close()
	fp, _, _, err := MultipartFingerprint(bytes.NewReader(form.Bytes()), mw.Boundary(), "model")
	if err != nil {
		t.Fatal(err)
	}
	// The raw body: the form's hash input after writeString(name), writeString(filename).
	var raw bytes.Buffer
	ct := "" // a field part has no Content-Type
	binary.Write(&raw, binary.BigEndian, uint64(len(ct)))
	raw.WriteString(ct)
	binary.Write(&raw, binary.BigEndian, int64(5))
	inner := sha256.Sum256([]byte("hello"))
	raw.Write(inner[:])
	h := RawFingerprint("") // no Content-Type sent
	h.Write(raw.Bytes())
	if got := hex.EncodeToString(h.Sum(nil)); got == fp {
		t.Logf("raw body %q", raw.Bytes())
		t.Fatalf("a body with no Content-Type of %d bytes has the form's fingerprint %s", raw.Len(), fp)
	}
}
