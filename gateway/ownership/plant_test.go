package ownership

import (
	"reflect"
	"strings"
	"testing"
)

// The fields an answer hands out objects in, one row per kind with the
// path it is taken from, and the same id planted where a client writes
// freely — metadata, user, instructions, message text, a function call's
// arguments, a list of items the client sent — which must record nothing
// but the answer's own object.
func TestOwnershipOnlyFromFieldsThatMeanIt(t *testing.T) {
	for _, tc := range []struct {
		kind, path, body string
		want             []Ref
	}{
		{"response", "id", `{"id":"resp_1","object":"response"}`, []Ref{{Kind: Response, ID: "resp_1"}}},
		{"conversation", "id", `{"id":"conv_1","object":"conversation"}`, []Ref{{Kind: Conversation, ID: "conv_1"}}},
		{"file", "id", `{"id":"file-1","object":"file"}`, []Ref{{Kind: File, ID: "file-1"}}},
		{"vector store", "id", `{"id":"vs_1","object":"vector_store"}`, []Ref{{Kind: VectorStore, ID: "vs_1"}}},
		{"upload", "id", `{"id":"upload_1","object":"upload","status":"pending"}`, []Ref{{Kind: Upload, ID: "upload_1"}}},
		{"batch", "id", `{"id":"batch_1","object":"batch"}`, []Ref{{Kind: Batch, ID: "batch_1"}}},
		{"file", "upload file.id", `{"id":"upload_1","object":"upload","file":{"id":"file-2","object":"file"}}`,
			[]Ref{{Kind: Upload, ID: "upload_1"}, {Kind: File, ID: "file-2"}}},
		{"file", "batch output_file_id, error_file_id", `{"id":"batch_1","object":"batch","output_file_id":"file-o","error_file_id":"file-e"}`,
			[]Ref{{Kind: Batch, ID: "batch_1"}, {Kind: File, ID: "file-o"}, {Kind: File, ID: "file-e"}}},
		{"container", "response output[type=code_interpreter_call].container_id",
			`{"id":"resp_2","object":"response","output":[{"type":"code_interpreter_call","id":"ci_1","container_id":"cntr_1"}]}`,
			[]Ref{{Kind: Response, ID: "resp_2"}, {Kind: Container, ID: "cntr_1"}}},
	} {
		t.Run(tc.kind+" from "+tc.path, func(t *testing.T) {
			if got := FromAnswer([]byte(tc.body)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("FromAnswer(%s) = %+v, want %+v", tc.body, got, tc.want)
			}
		})
	}
	resp := []Ref{{Kind: Response, ID: "resp_1"}}
	conv := []Ref{{Kind: Conversation, ID: "conv_1"}}
	for _, tc := range []struct {
		name, body string
		want       []Ref
	}{
		{"container_id in a response's metadata", `{"id":"resp_1","object":"response","metadata":{"container_id":"cntr_victim"}}`, resp},
		{"container_id in a conversation's metadata", `{"id":"conv_1","object":"conversation","metadata":{"container_id":"cntr_victim"}}`, conv},
		{"code_interpreter_call in metadata", `{"id":"resp_1","object":"response","metadata":{"output":[{"type":"code_interpreter_call","container_id":"cntr_victim"}]}}`, resp},
		{"file in metadata", `{"id":"upload_1","object":"upload","metadata":{"file":{"id":"file-victim","object":"file"}}}`,
			[]Ref{{Kind: Upload, ID: "upload_1"}}},
		{"batch files in metadata", `{"id":"batch_1","object":"batch","metadata":{"output_file_id":"file-victim","error_file_id":"file-victim"}}`,
			[]Ref{{Kind: Batch, ID: "batch_1"}}},
		{"metadata naming an object", `{"object":"list","metadata":{"id":"file-victim","object":"file"}}`, nil},
		{"user", `{"id":"resp_1","object":"response","user":"{\"container_id\":\"cntr_victim\"}"}`, resp},
		{"instructions as items", `{"id":"resp_1","object":"response","instructions":[{"type":"code_interpreter_call","container_id":"cntr_victim"}]}`, resp},
		{"instructions as text", `{"id":"resp_1","object":"response","instructions":"\"container_id\":\"cntr_victim\""}`, resp},
		{"message text", `{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"{\"container_id\":\"cntr_victim\"}"}]}]}`, resp},
		{"a citation of a container file", `{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","annotations":[{"type":"container_file_citation","container_id":"cntr_victim"}]}]}]}`, resp},
		{"function call arguments", `{"id":"resp_1","object":"response","output":[{"type":"function_call","arguments":"{}","container_id":"cntr_victim"}]}`, resp},
		{"a tool the client named", `{"id":"resp_1","object":"response","tools":[{"type":"code_interpreter","container":"cntr_victim","container_id":"cntr_victim"}]}`, resp},
		{"prompt variables", `{"id":"resp_1","object":"response","prompt":{"id":"pmpt_1","variables":{"container_id":"cntr_victim"}}}`, resp},
		{"items the client added to a conversation", `{"object":"list","data":[{"type":"code_interpreter_call","container_id":"cntr_victim"}]}`, nil},
		{"a response's input items", `{"object":"list","data":[{"id":"ci_1","type":"code_interpreter_call","container_id":"cntr_victim"}]}`, nil},
		{"a code_interpreter_call with no object", `{"output":[{"type":"code_interpreter_call","container_id":"cntr_victim"}]}`, nil},
		{"batch files on another kind", `{"id":"resp_1","object":"response","output_file_id":"file-victim"}`, resp},
		{"upload file on another kind", `{"id":"conv_1","object":"conversation","file":{"id":"file-victim","object":"file"}}`, conv},
	} {
		t.Run("planted "+tc.name, func(t *testing.T) {
			got := FromAnswer([]byte(tc.body))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("FromAnswer(%s) = %+v, want %+v", tc.body, got, tc.want)
			}
			ev := `data: {"type":"response.created","response":` + tc.body + "}\n\n"
			for _, r := range FromStreamEvent([]byte(ev)) {
				if strings.Contains(r.ID, "victim") {
					t.Errorf("stream event records %+v", r)
				}
			}
		})
	}
}

// A Responses stream hands out the response in response.created and the
// container a code_interpreter call runs in with the call's item
// (response.output_item.added or .done); an item of another type, or a
// container named in the response's metadata, records nothing.
func TestStreamOwnershipFromItems(t *testing.T) {
	for _, tc := range []struct {
		ev   string
		want []Ref
	}{
		{`{"type":"response.created","response":{"id":"resp_1","object":"response","metadata":{"container_id":"cntr_victim"}}}`,
			[]Ref{{Kind: Response, ID: "resp_1"}}},
		{`{"type":"response.output_item.added","output_index":0,"item":{"type":"code_interpreter_call","id":"ci_1","container_id":"cntr_1"}}`,
			[]Ref{{Kind: Container, ID: "cntr_1"}}},
		{`{"type":"response.output_item.done","output_index":0,"item":{"type":"code_interpreter_call","id":"ci_1","container_id":"cntr_1"}}`,
			[]Ref{{Kind: Container, ID: "cntr_1"}}},
		{`{"type":"response.output_item.added","item":{"type":"message","container_id":"cntr_victim"}}`, nil},
		{`{"type":"response.in_progress","response":{"id":"resp_1","object":"response"}}`, nil},
		{`{"type":"response.output_text.delta","delta":"{\"container_id\":\"cntr_victim\"}"}`, nil},
	} {
		if got := FromStreamEvent([]byte("data: " + tc.ev + "\n\n")); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("FromStreamEvent(%s) = %+v, want %+v", tc.ev, got, tc.want)
		}
	}
}

// Anthropic's messages hand out one object, the container their code ran
// in, in the message's top-level container.id (of a JSON answer, or of a
// stream's message_start); the same id planted where the model or the
// client writes freely — text, a tool's input, a code execution result's
// stdout or its own "container", metadata echoed, another type of answer
// — records nothing. A file is handed out by the Files API's file object.
func TestAnthropicOwnershipOnlyFromFieldsThatMeanIt(t *testing.T) {
	own := []Ref{{Kind: Container, ID: "container_1"}}
	planted := `{"container":{"id":"container_victim"},"container_id":"container_victim"}`
	for _, tc := range []struct {
		name, body string
		want       []Ref
	}{
		{"top-level container.id", `{"id":"msg_1","type":"message","container":{"id":"container_1","expires_at":"2026-01-01T00:00:00Z"},"content":[]}`, own},
		{"container null", `{"id":"msg_1","type":"message","container":null,"content":[]}`, nil},
		{"container as a string", `{"id":"msg_1","type":"message","container":"container_victim"}`, nil},
		{"text", `{"id":"msg_1","type":"message","content":[{"type":"text","text":` + quote(planted) + `}]}`, nil},
		{"a tool's input", `{"id":"msg_1","type":"message","content":[{"type":"tool_use","id":"t","name":"x","input":` + planted + `}]}`, nil},
		{"a code execution result", `{"id":"msg_1","type":"message","content":[{"type":"code_execution_tool_result","content":{"stdout":` +
			quote(planted) + `,"container":{"id":"container_victim"}}}]}`, nil},
		{"metadata", `{"id":"msg_1","type":"message","metadata":` + planted + `}`, nil},
		{"another type", `{"id":"msgbatch_1","type":"message_batch","container":{"id":"container_victim"}}`, nil},
		{"no type", `{"id":"msg_1","container":{"id":"container_victim"}}`, nil},
		{"nested message", `{"type":"error","error":{"id":"msg_1","type":"message","container":{"id":"container_victim"}}}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := AnthropicScheme.Answer("/v1/messages", []byte(tc.body)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Answer(%s) = %+v, want %+v", tc.body, got, tc.want)
			}
			ev := `event: message_start` + "\n" + `data: {"type":"message_start","message":` + tc.body + "}\n\n"
			if got := AnthropicScheme.Event("/v1/messages", []byte(ev)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Event(%s) = %+v, want %+v", ev, got, tc.want)
			}
			if got := AnthropicScheme.Answer("/v1/messages/count_tokens", []byte(tc.body)); got != nil {
				t.Errorf("count_tokens hands out %+v", got)
			}
		})
	}
	for _, tc := range []struct {
		name, body string
		want       []Ref
	}{
		{"a file", `{"id":"file_1","type":"file","filename":"a.txt"}`, []Ref{{Kind: File, ID: "file_1"}}},
		{"a deleted file", `{"id":"file_1","type":"file_deleted"}`, nil},
		{"a list", `{"data":[{"id":"file_victim","type":"file"}],"has_more":false,"first_id":"file_victim","last_id":"file_victim"}`, nil},
		{"an OpenAI file", `{"id":"file-1","object":"file"}`, nil},
	} {
		if got := AnthropicScheme.Answer("/v1/files", []byte(tc.body)); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: Answer(%s) = %+v, want %+v", tc.name, tc.body, got, tc.want)
		}
	}
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }
