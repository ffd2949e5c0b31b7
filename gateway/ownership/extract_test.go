package ownership

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
)

func TestFromPath(t *testing.T) {
	for path, want := range map[string]Ref{
		"/v1/responses/resp_1":                    {Kind: Response, ID: "resp_1"},
		"/v1/responses/resp_1/input_items":        {Kind: Response, ID: "resp_1"},
		"/v1/responses/resp_1/cancel":             {Kind: Response, ID: "resp_1"},
		"/v1/conversations/conv_1/items/msg_2":    {Kind: Conversation, ID: "conv_1"},
		"/v1/files/file-abc/content":              {Kind: File, ID: "file-abc"},
		"/v1/batches/batch_1/cancel":              {Kind: Batch, ID: "batch_1"},
		"/v1/vector_stores/vs_1/files/file-abc":   {Kind: VectorStore, ID: "vs_1"},
		"/v1/uploads/upload_1/complete":           {Kind: Upload, ID: "upload_1"},
		"/responses/resp_2":                       {Kind: Response, ID: "resp_2"},
		"/v1/messages/batches/msgbatch_1":         {Kind: MessageBatch, ID: "msgbatch_1"},
		"/v1/messages/batches/msgbatch_1/cancel":  {Kind: MessageBatch, ID: "msgbatch_1"},
		"/v1/messages/batches/msgbatch_1/results": {Kind: MessageBatch, ID: "msgbatch_1"},
	} {
		got, ok := FromPath(path)
		if !ok || got != want {
			t.Errorf("FromPath(%q) = %+v, %v; want %+v", path, got, ok, want)
		}
	}
	for _, path := range []string{"/v1/responses", "/v1/responses/", "/v1/files", "/v1/chat/completions", "/v1/models/gpt-4o", "/v1/embeddings",
		"/v1/messages", "/v1/messages/count_tokens", "/v1/messages/batches", "/v1/messages/batches/"} {
		if got, ok := FromPath(path); ok {
			t.Errorf("FromPath(%q) = %+v, want nothing", path, got)
		}
	}
}

func TestTenantList(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		want         bool
	}{
		{"GET", "/v1/files", true}, {"GET", "/v1/batches", true}, {"GET", "/v1/vector_stores", true},
		{"GET", "/v1/chat/completions", true}, {"GET", "/v1/files/", true},
		{"GET", "/v1/uploads", true}, {"GET", "/v1/conversations", true}, {"GET", "/v1/messages/batches", true},
		{"POST", "/v1/messages/batches", false}, {"GET", "/v1/messages/batches/msgbatch_1", false},
		{"POST", "/v1/files", false}, {"POST", "/v1/chat/completions", false},
		{"GET", "/v1/files/file-1", false}, {"GET", "/v1/models", false}, {"GET", "/v1/responses/resp_1/input_items", false},
	} {
		if got := TenantList(tc.method, tc.path); got != tc.want {
			t.Errorf("TenantList(%s %s) = %v, want %v", tc.method, tc.path, got, tc.want)
		}
	}
	e := ListRefused("/v1/files")
	if e.Status != http.StatusForbidden || e.Type != "invalid_request_error" {
		t.Errorf("ListRefused = %+v", e)
	}
}

func TestFromBody(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []Ref
	}{
		{"previous response", `{"model":"m","previous_response_id":"resp_1","input":"hi"}`,
			[]Ref{{Response, "resp_1", "previous_response_id"}}},
		{"conversation string", `{"conversation":"conv_1"}`, []Ref{{Conversation, "conv_1", "conversation"}}},
		{"conversation object", `{"conversation":{"id":"conv_\u0031"}}`, []Ref{{Conversation, "conv_1", "conversation"}}},
		{"nested file parts", `{"input":[{"role":"user","content":[{"type":"input_file","file_id":"file-a"},{"type":"input_text","text":"file_id"}]}]}`,
			[]Ref{{File, "file-a", "file_id"}}},
		{"tools", `{"tools":[{"type":"file_search","vector_store_ids":["vs_1","vs_2"]}],"tool_resources":{"code_interpreter":{"file_ids":["file-b"]}}}`,
			[]Ref{{VectorStore, "vs_1", "vector_store_ids"}, {VectorStore, "vs_2", "vector_store_ids"}, {File, "file-b", "file_ids"}}},
		{"escaped key", `{"x":{"file\u005fid":"file-e"}}`, []Ref{{File, "file-e", "file_id"}}},
		{"batch input", `{"input_file_id":"file-c","endpoint":"/v1/chat/completions","completion_window":"24h"}`,
			[]Ref{{File, "file-c", "input_file_id"}}},
		{"chat file part", `{"messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-d"}}]}]}`,
			[]Ref{{File, "file-d", "file_id"}}},
		// Only at the top level: a nested previous_response_id is data.
		{"nested top-level names", `{"metadata":{"previous_response_id":"resp_9","conversation":"conv_9"}}`, nil},
		// A schema that merely describes a file_id names none.
		{"schema", `{"tools":[{"type":"function","parameters":{"properties":{"file_id":{"type":"string"}}}}]}`, nil},
		{"not ids", `{"previous_response_id":null,"conversation":7,"file_ids":[1,null]}`, nil},
		{"none", `{"model":"m","input":"hello"}`, nil},
		{"item references", `{"input":[{"type":"item_reference","id":"msg_1"},{"id":"rs_2"},{"type":"message","id":"msg_3","role":"user","content":"x"},"text",7],"items":[{"type":"item_reference","id":"fc_4"}]}`,
			[]Ref{{ItemReference, "msg_1", "input"}, {ItemReference, "rs_2", "input"}, {ItemReference, "fc_4", "items"}}},
		{"containers", `{"tools":[{"type":"code_interpreter","container":"cntr_1"},{"type":"code_interpreter","container":{"type":"auto","file_ids":["file-f"]}}]}`,
			[]Ref{{Container, "cntr_1", "tools"}, {File, "file-f", "file_ids"}}},
		// The hosted shell tool runs in a container it names by reference
		// (found by the hostile-tenant run: another tenant's ran commands).
		{"shell container reference", `{"tools":[{"type":"shell","environment":{"type":"container_reference","container_id":"cntr_2"}},{"type":"shell","Environment":{"Container_Id":"cntr_3"}}]}`,
			[]Ref{{Container, "cntr_2", "tools"}, {Container, "cntr_3", "tools"}}},
		{"embeddings input", `{"model":"m","input":["a","b"]}`, nil},
		{"not json", `{"model":`, nil},
		// Keys fold as a Go upstream's encoding/json folds them.
		{"folded top level", `{"PREVIOUS_RESPONSE_ID":"resp_1","Conversation":{"ID":"conv_1"}}`,
			[]Ref{{Response, "resp_1", "previous_response_id"}, {Conversation, "conv_1", "conversation"}}},
		{"long s", `{"previou\u017f_response_id":"resp_1","converſation":"conv_1"}`,
			[]Ref{{Response, "resp_1", "previous_response_id"}, {Conversation, "conv_1", "conversation"}}},
		{"every folded occurrence", `{"previous_response_id":"resp_1","PREVIOUS_RESPONSE_ID":"resp_2"}`,
			[]Ref{{Response, "resp_1", "previous_response_id"}, {Response, "resp_2", "previous_response_id"}}},
		// An item is a reference to a Go upstream when its last "type" in
		// any case is item_reference or it has none, to an exact-case one
		// when its "type" is or it has no "type" exactly: either counts,
		// and every id in any case is checked.
		{"folded item keys", `{"INPUT":[{"TYPE":"item_reference","ID":"msg_1"},{"Id":"rs_2"}]}`,
			[]Ref{{ItemReference, "msg_1", "input"}, {ItemReference, "rs_2", "input"}}},
		{"type in another case only", `{"input":[{"Type":"message","id":"msg_1"}]}`, []Ref{{ItemReference, "msg_1", "input"}}},
		{"any type a reference", `{"input":[{"type":"item_reference","TYPE":"message","id":"msg_1"},{"TYPE":"item_reference","type":"message","id":"msg_2"}]}`,
			[]Ref{{ItemReference, "msg_1", "input"}, {ItemReference, "msg_2", "input"}}},
		{"every id", `{"input":[{"id":"msg_1","ID":"msg_2"}]}`, []Ref{{ItemReference, "msg_1", "input"}, {ItemReference, "msg_2", "input"}}},
		{"a message in any case", `{"input":[{"type":"message","TYPE":"message","id":"msg_1","ID":"msg_2"}]}`, nil},
		{"folded batch input", `{"Input_File_Id":"file-c"}`, []Ref{{File, "file-c", "input_file_id"}}},
		{"folded nested", `{"x":{"FILE_ID":"file-a","File_Idſ":["file-b"]},"tools":[{"Vector_Store_Ids":["vs_1"],"vector_ſtore_ids":["vs_2"]}]}`,
			[]Ref{{File, "file-a", "file_id"}, {File, "file-b", "file_ids"}, {VectorStore, "vs_1", "vector_store_ids"}, {VectorStore, "vs_2", "vector_store_ids"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FromBody([]byte(tc.body)); !reflect.DeepEqual(got, tc.want) && len(got)+len(tc.want) > 0 {
				t.Errorf("FromBody = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestFromAnswer(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []Ref
	}{
		{"response", `{"id":"resp_1","object":"response","status":"completed","output":[{"id":"msg_1","type":"message"}]}`,
			[]Ref{{Kind: Response, ID: "resp_1"}}},
		{"conversation", `{"id":"conv_1","object":"conversation","created_at":1}`, []Ref{{Kind: Conversation, ID: "conv_1"}}},
		{"file", `{"id":"file-1","object":"file","bytes":3,"purpose":"batch"}`, []Ref{{Kind: File, ID: "file-1"}}},
		{"vector store", `{"id":"vs_1","object":"vector_store"}`, []Ref{{Kind: VectorStore, ID: "vs_1"}}},
		{"completed upload", `{"id":"upload_1","object":"upload","status":"completed","file":{"id":"file-2","object":"file"}}`,
			[]Ref{{Kind: Upload, ID: "upload_1"}, {Kind: File, ID: "file-2"}}},
		{"batch with output", `{"id":"batch_1","object":"batch","input_file_id":"file-in","output_file_id":"file-out","error_file_id":null}`,
			[]Ref{{Kind: Batch, ID: "batch_1"}, {Kind: File, ID: "file-out"}}},
		{"deleted", `{"id":"file-1","object":"file","deleted":true}`, nil},
		{"chat completion", `{"id":"chatcmpl-1","object":"chat.completion"}`, nil},
		{"containers", `{"id":"resp_2","object":"response","output":[{"type":"code_interpreter_call","container_id":"cntr_1"},{"type":"message","content":[{"annotations":[{"type":"container_file_citation","container_id":"cntr_2"}]}]}]}`,
			// A citation names a container, it does not create one: only
			// the call's container_id is recorded.
			[]Ref{{Kind: Response, ID: "resp_2"}, {Kind: Container, ID: "cntr_1"}}},
		{"list", `{"object":"list","data":[{"id":"file-1","object":"file"}]}`, nil},
		{"message batch", `{"id":"msgbatch_1","type":"message_batch","processing_status":"in_progress","results_url":null}`,
			[]Ref{{Kind: MessageBatch, ID: "msgbatch_1"}}},
		{"deleted message batch", `{"id":"msgbatch_1","type":"message_batch_deleted"}`, nil},
		{"message batch list", `{"data":[{"id":"msgbatch_1","type":"message_batch"}],"has_more":false}`, nil},
		// "object" decides where there is one: an OpenAI answer's "type"
		// is not its kind.
		{"object wins over type", `{"id":"chatcmpl-1","object":"chat.completion","type":"message_batch"}`, nil},
		{"not json", `<html>`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FromAnswer([]byte(tc.body)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("FromAnswer = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestFromStreamEvent(t *testing.T) {
	ev := "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_s\",\"object\":\"response\",\"status\":\"in_progress\"}}\n\n"
	if got, want := FromStreamEvent([]byte(ev)), []Ref{{Kind: Response, ID: "resp_s"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("response.created: %+v, want %+v", got, want)
	}
	other := "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n"
	if got := FromStreamEvent([]byte(other)); got != nil {
		t.Errorf("a delta hands out %+v", got)
	}
}

func TestStoreFalse(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"model":"m","store":true,"input":"hi"}`, `{"model":"m","store":false,"input":"hi"}`},
		{`{"model":"m", "store" : true ,"input":"hi"}`, `{"model":"m", "store" : false ,"input":"hi"}`},
		{`{"st\u006fre":null,"input":"x"}`, `{"st\u006fre":false,"input":"x"}`},
		{`{"model":"m","store":false}`, `{"model":"m","store":false}`},
		{`{"model":"m","input":"hi"}`, `{"store":false,"model":"m","input":"hi"}`},
		{` { "model":"m"}`, ` {"store":false, "model":"m"}`},
		{`{}`, `{"store":false}`},
		{`{ }`, `{"store":false }`},
		{`{"metadata":{"store":"true"},"model":"m"}`, `{"store":false,"metadata":{"store":"true"},"model":"m"}`},
		{`[1]`, `[1]`},
		// A Go upstream reads "STORE" as store, an exact-case one only
		// "store": both are made false.
		{`{"model":"m","STORE":true}`, `{"store":false,"model":"m","STORE":false}`},
		{`{"\u017ftore":null}`, `{"store":false,"\u017ftore":false}`},
		{`{"Store":false}`, `{"store":false,"Store":false}`},
	} {
		got := string(StoreFalse([]byte(tc.in)))
		if got != tc.want {
			t.Errorf("StoreFalse(%s) = %s, want %s", tc.in, got, tc.want)
		}
		if tc.in[0] != '[' && !json.Valid([]byte(got)) {
			t.Errorf("StoreFalse(%s) = %s, not JSON", tc.in, got)
		}
	}
}

func TestCreates(t *testing.T) {
	for path, want := range map[string]bool{
		"/v1/responses": true, "/v1/responses/resp_1/cancel": true, "/v1/files": true, "/v1/uploads/u/complete": true,
		"/v1/batches": true, "/v1/vector_stores": true, "/v1/conversations": true,
		"/v1/chat/completions": false, "/v1/embeddings": false, "/v1/models": false, "/v1/responsesx": false,
		"/v1/messages/batches": true, "/v1/messages/batches/msgbatch_1/cancel": true,
		"/v1/messages": false, "/v1/messages/count_tokens": false, "/v1/messages/batchesx": false,
	} {
		if got := Creates(path); got != want {
			t.Errorf("Creates(%q) = %v, want %v", path, got, want)
		}
	}
}

func BenchmarkFromBody(b *testing.B) {
	body := []byte(`{"model":"gpt-4o","messages":[{"role":"system","content":"You are terse."},` +
		`{"role":"user","content":[{"type":"text","text":"Summarize the attached file in three bullet points."},` +
		`{"type":"file","file":{"file_id":"file-abc123"}}]}],"temperature":0.2,"max_tokens":400,` +
		`"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}]}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		FromBody(body)
	}
}

func TestStored(t *testing.T) {
	for body, want := range map[string]bool{
		`{"model":"m"}`: true, `{"store":true}`: true, `{"store":null}`: true,
		`{"store":false}`: false, `{"model":"m", "store" : false}`: false, `{"metadata":{"store":false}}`: true,
		`{"st\u006fre":false}`: false,
		// An exact-case upstream reads no store, and stores: not known to
		// be unstored.
		`{"STORE":false}`: true, `{"\u017ftore":false}`: true, `{"Store":false}`: true,
	} {
		if got := Stored([]byte(body)); got != want {
			t.Errorf("Stored(%s) = %v, want %v", body, got, want)
		}
	}
}

// A Messages body names a container at its top level (a string, or an
// object's id) and files wherever a file_id is: a document or image
// source, inside a tool_result, a container_upload block.
func TestFromMessagesBody(t *testing.T) {
	for _, tc := range []struct {
		body string
		want []Ref
	}{
		{`{"container":"container_1"}`, []Ref{{Kind: Container, ID: "container_1", Param: "container"}}},
		{`{"container":{"id":"container_1","skills":[{"type":"anthropic","skill_id":"pptx"}]}}`, []Ref{{Kind: Container, ID: "container_1", Param: "container"}}},
		{`{"Container":"container_1"}`, []Ref{{Kind: Container, ID: "container_1", Param: "container"}}},
		{`{"container":{"skills":[]}}`, nil},
		{`{"container":null}`, nil},
		{`{"messages":[{"role":"user","content":[{"type":"document","source":{"type":"file","file_id":"file_1"}}]}]}`,
			[]Ref{{Kind: File, ID: "file_1", Param: "file_id"}}},
		{`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"file","file_id":"file_2"}}]}]}]}`,
			[]Ref{{Kind: File, ID: "file_2", Param: "file_id"}}},
		{`{"messages":[{"role":"user","content":[{"type":"container_upload","file_id":"file_3"}]}]}`,
			[]Ref{{Kind: File, ID: "file_3", Param: "file_id"}}},
		{`{"messages":[{"role":"user","content":[{"type":"text","text":"{\"container\":\"container_x\"}"}]}]}`, nil},
		// A tool's arguments the model wrote, passed back, name nothing;
		// a block that is not exactly (and only) a tool use is scanned.
		{`{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"drive","input":{"file_id":"doc-1"}}]}]}`, nil},
		{`{"messages":[{"role":"assistant","content":[{"type":"server_tool_use","id":"s","name":"x","input":{"file_id":"doc-1"}}]}]}`, nil},
		{`{"messages":[{"role":"assistant","content":[{"type":"tool_use","Type":"document","input":{"file_id":"file_4"}}]}]}`,
			[]Ref{{Kind: File, ID: "file_4", Param: "file_id"}}},
		{`{"messages":[{"role":"assistant","content":[{"type":"Tool_Use","input":{"file_id":"file_5"}}]}]}`,
			[]Ref{{Kind: File, ID: "file_5", Param: "file_id"}}},
		{`{"messages":[{"role":"user","content":[{"type":"tool_use","input":{},"source":{"type":"file","file_id":"file_6"},"file_id":"file_9"}]}]}`,
			[]Ref{{Kind: File, ID: "file_6", Param: "file_id"}, {Kind: File, ID: "file_9", Param: "file_id"}}},
		{`{"file_id":"file_10","container":{"id":"container_2","file_ids":["file_11"]}}`,
			[]Ref{{Kind: File, ID: "file_10", Param: "file_id"}, {Kind: Container, ID: "container_2", Param: "container"}, {Kind: File, ID: "file_11", Param: "file_ids"}}},
		{`{"system":[{"type":"text","text":"x","file_id":"file_7"}],"messages":"not an array","Messages":[{"content":"hi","file_id":"file_8"}]}`,
			[]Ref{{Kind: File, ID: "file_7", Param: "file_id"}, {Kind: File, ID: "file_8", Param: "file_id"}}},
	} {
		if got := FromMessagesBody([]byte(tc.body)); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("FromMessagesBody(%s) = %+v, want %+v", tc.body, got, tc.want)
		}
	}
}
