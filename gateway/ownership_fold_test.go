package gateway

import (
	"bytes"
	"mime/multipart"
	"net/http"
	"testing"

	"github.com/llmgate/llmgate/config"
)

// A Go upstream's encoding/json matches keys case-insensitively, 'ſ'
// (U+017F) as s: "PREVIOUS_RESPONSE_ID" names a response to it as
// previous_response_id does. The ownership checks read keys the same way.

// upload stores a one-line batch file as who and returns its id.
func upload(t *testing.T, h *harness, up *objectUpstream, who map[string]string) string {
	t.Helper()
	r := uploadAs(h, who)
	if r.status != http.StatusOK {
		t.Fatalf("upload: %d %s", r.status, r.body)
	}
	up.requests()
	return decodeID(t, r.body)
}

// uploadAs posts a one-line batch file to /v1/files as who.
func uploadAs(h *harness, who map[string]string) result {
	h.t.Helper()
	body, ctype := batchFileForm()
	return h.do(http.MethodPost, "/v1/files", body, map[string]string{"Authorization": who["Authorization"], "Content-Type": ctype})
}

// batchFileForm is a /v1/files form of a one-line batch file, and its
// Content-Type.
func batchFileForm() (body, contentType string) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	fw.Write([]byte("{}\n"))
	mw.Close()
	return buf.String(), mw.FormDataContentType()
}

// TestFoldedKeysOfOthersRefused: bob cannot name alice's response or file
// under a key in another case, or with 'ſ' for s: each is the ownership
// 404 with no upstream call. Alice can, under the same keys.
func TestFoldedKeysOfOthersRefused(t *testing.T) {
	h, up := ownersHarness(t, nil)
	resp, _ := create(t, h, up, responseBody, asAlice)
	file := upload(t, h, up, asAlice)
	bobs := upload(t, h, up, asBob)
	cases := []struct{ path, body, code string }{
		{"/v1/responses", `{"model":"gpt-4o","input":"go on","PREVIOUS_RESPONSE_ID":"` + resp + `"}`, "previous_response_not_found"},
		{"/v1/responses", `{"model":"gpt-4o","input":"go on","previou\u017f_response_id":"` + resp + `"}`, "previous_response_not_found"},
		{"/v1/responses", `{"model":"gpt-4o","input":"go on","Conversation":{"ID":"conv_never"}}`, "conversation_not_found"},
		{"/v1/batches", `{"Input_File_Id":"` + file + `","endpoint":"/v1/chat/completions","completion_window":"24h"}`, "file_not_found"},
		// Every occurrence is checked, bob's own file first.
		{"/v1/batches", `{"input_file_id":"` + bobs + `","INPUT_FILE_ID":"` + file + `","endpoint":"/v1/chat/completions","completion_window":"24h"}`, "file_not_found"},
		{"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"FILE_ID":"` + file + `"}}]}]}`, "file_not_found"},
		{"/v1/chat/completions", `{"model":"gpt-4o","messages":[],"tools":[{"type":"file_search","Vector_Store_Ids":["vs_never"]}]}`, "vector_store_not_found"},
	}
	for _, c := range cases {
		t.Run(c.body, func(t *testing.T) {
			wantNotFound(t, h.do(http.MethodPost, c.path, c.body, asBob), up, c.code)
		})
	}
	for _, c := range cases[:2] {
		if r := h.do(http.MethodPost, c.path, c.body, asAlice); r.status != http.StatusOK {
			t.Fatalf("alice %s: %d %s", c.body, r.status, r.body)
		}
	}
	body := `{"Input_File_Id":"` + file + `","endpoint":"/v1/chat/completions","completion_window":"24h"}`
	if r := h.do(http.MethodPost, "/v1/batches", body, asAlice); r.status != http.StatusOK {
		t.Fatalf("alice's batch: %d %s", r.status, r.body)
	}
	if seen := up.requests(); len(seen) != 3 || seen[2].Body != body {
		t.Fatalf("upstream saw %+v", seen)
	}

	// Item references under folded keys, or whose "type" only a Go
	// upstream reads, are refused as item references are.
	for _, item := range []string{`{"TYPE":"item_reference","ID":"msg_alice"}`, `{"Type":"message","id":"msg_alice"}`, `{"id":"msg_mine","ID":"msg_alice"}`} {
		r := h.do(http.MethodPost, "/v1/responses", `{"model":"gpt-4o","INPUT":[`+item+`]}`, asBob)
		if e := wantOpenAIError(t, r, http.StatusBadRequest); e["code"] != "item_reference_not_allowed" {
			t.Errorf("%s: %v", item, e)
		}
		if seen := up.requests(); len(seen) != 0 {
			t.Fatalf("%s reached the upstream: %+v", item, seen)
		}
	}

	// Both spellings at once: a field the gateway routes by, refused.
	r := h.do(http.MethodPost, "/v1/responses", `{"model":"gpt-4o","input":"x","previous_response_id":"`+resp+`","PREVIOUS_RESPONSE_ID":"resp_other"}`, asAlice)
	if e := wantOpenAIError(t, r, http.StatusBadRequest); e["code"] != "duplicate_field" || e["param"] != "previous_response_id" {
		t.Fatalf("two spellings: %v", e)
	}
	if seen := up.requests(); len(seen) != 0 {
		t.Fatalf("the upstream was called: %+v", seen)
	}
}

// TestForceStoreFalseFolded: "STORE" is store to a Go upstream and nothing
// to an exact-case one; with force_store_false both read false. A
// response created with "STORE":false on an upstream that may store it is
// recorded, so that its owner can reach it.
func TestForceStoreFalseFolded(t *testing.T) {
	h, up := ownersHarness(t, func(c *config.Config) { c.Upstreams[0].ForceStoreFalse = true })
	if r := h.do(http.MethodPost, "/v1/responses", `{"model":"gpt-4o","STORE":true,"input":"hi"}`, asAlice); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if seen := up.requests(); len(seen) != 1 || seen[0].Body != `{"store":false,"model":"gpt-4o","STORE":false,"input":"hi"}` {
		t.Fatalf("upstream saw %+v", seen)
	}

	h, up = ownersHarness(t, nil)
	id, _ := create(t, h, up, `{"model":"gpt-4o","input":"hello","STORE":false}`, asAlice)
	if r := h.do(http.MethodGet, "/v1/responses/"+id, "", asAlice); r.status != http.StatusOK {
		t.Fatalf("alice's response: %d %s", r.status, r.body)
	}
	up.requests()
	wantNotFound(t, h.do(http.MethodGet, "/v1/responses/"+id, "", asBob), up, "response_not_found")
}
