package ownership

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/llmgate/llmgate/classify/jsonscan"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/sse"
)

// pathKinds maps the first segment of a path under /v1 to the kind of the
// object its second segment names: /v1/responses/{id}[/input_items|/cancel],
// /v1/files/{id}[/content], /v1/vector_stores/{id}/files/..., and so on.
var pathKinds = map[string]Kind{
	"responses":     Response,
	"conversations": Conversation,
	"files":         File,
	"batches":       Batch,
	"vector_stores": VectorStore,
	"uploads":       Upload,
}

// messageBatches is the path of Anthropic's Message Batches API under
// /v1: /v1/messages/batches/{id}[/results|/cancel] names a message batch.
const messageBatches = "messages/batches"

// FromPath returns the object a request path names, if any. path is the
// URL path, with or without its /v1 prefix.
func FromPath(path string) (Ref, bool) {
	rest := strings.TrimPrefix(strings.TrimPrefix(path, "/v1"), "/")
	if sub, ok := strings.CutPrefix(rest, messageBatches+"/"); ok {
		id, _, _ := strings.Cut(sub, "/")
		return Ref{Kind: MessageBatch, ID: id}, id != ""
	}
	first, rest, ok := strings.Cut(rest, "/")
	kind, known := pathKinds[first]
	if !ok || !known {
		return Ref{}, false
	}
	id, _, _ := strings.Cut(rest, "/")
	if id == "" {
		return Ref{}, false
	}
	return Ref{Kind: kind, ID: id}, true
}

// tenantLists are the list endpoints that show every object the provider
// holds under the upstream's key: with a shared key, every tenant's.
var tenantLists = map[string]bool{
	"/files": true, "/batches": true, "/vector_stores": true, "/chat/completions": true,
	// OpenAI lists neither today; a provider that does would list everyone's.
	"/uploads": true, "/conversations": true,
	// Anthropic's list of message batches.
	"/" + messageBatches: true,
}

// TenantList reports whether method and path list objects across tenants:
// GET /v1/files, /v1/batches, /v1/vector_stores, /v1/uploads,
// /v1/conversations, /v1/chat/completions (stored chat completions) and
// /v1/messages/batches. The gateway refuses them under a shared key.
func TenantList(method, path string) bool {
	return method == http.MethodGet && tenantLists[strings.TrimSuffix(strings.TrimPrefix(path, "/v1"), "/")]
}

// ListRefused is the answer to a TenantList request under a shared key: a
// 403, since retrying cannot help, that says what to do instead.
func ListRefused(path string) *apierror.Error {
	return &apierror.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "list_not_allowed",
		Message: fmt.Sprintf("Listing %s is refused: clients of this gateway share the upstream's API key, so the list "+
			"would show every client's objects. Retrieve your objects by the ids you were given, or ask the "+
			"operator for your own upstream key (clients[].upstream_api_keys).", path)}
}

// The members of a request body that name objects: topKeys at the top
// level only, nestedNames anywhere.
var (
	topKeys          = jsonscan.NewKeys("previous_response_id", "conversation", "input", "items", "tools")
	conversationKeys = jsonscan.NewKeys("id")
	itemKeys         = jsonscan.NewKeys("type", "id") // indexes used by itemRefs
	toolKeys         = jsonscan.NewKeys("container", "environment")
	environmentKeys  = jsonscan.NewKeys("container_id")
	nestedNames      = [...]struct {
		name string
		kind Kind
	}{{"file_id", File}, {"file_ids", File}, {"input_file_id", File}, {"vector_store_ids", VectorStore}}
)

// FromBody returns the objects a JSON request body names:
// previous_response_id and conversation (a string, or an object's "id"),
// the item references in input or items (an element with an "id" whose
// type is item_reference or absent: kind ItemReference), and the
// containers tools name (a code_interpreter tool's "container" string, a
// shell tool's environment's "container_id") at the top level, and
// file_id, file_ids, input_file_id and vector_store_ids at any depth (input_file content parts, tool resources, file_search's
// vector stores, a batch's input file). A value of another type is not an
// id and is left to the upstream to refuse. A body that is not valid JSON
// names nothing here: the caller must not forward it unchecked (the
// gateway refuses it before it is parsed on the JSON endpoints, and under
// a shared key refuses a passthrough body it cannot scan).
func FromBody(body []byte) []Ref {
	var refs []Ref
	s := jsonscan.New(body, 0)
	for key := range s.Fields(topKeys) {
		v := s.Value()
		switch {
		case key == "previous_response_id" && isString(v):
			refs = append(refs, Ref{Kind: Response, ID: jsonscan.Unquote(v), Param: key})
		case key == "conversation" && isString(v):
			refs = append(refs, Ref{Kind: Conversation, ID: jsonscan.Unquote(v), Param: key})
		case key == "conversation" && len(v) > 0 && v[0] == '{':
			sub := jsonscan.New(v, 0)
			for range sub.Fields(conversationKeys) {
				if id := sub.Value(); isString(id) {
					refs = append(refs, Ref{Kind: Conversation, ID: jsonscan.Unquote(id), Param: key})
				}
			}
		case key == "input" || key == "items":
			refs = itemRefs(v, key, refs)
		case key == "tools":
			refs = containerRefs(v, refs)
		}
	}
	return nested(jsonscan.New(body, 0), refs)
}

// itemRefs appends the item references in the array v: elements with an
// "id" string whose "type" is "item_reference" or absent (the API's
// default). Other items with an id (a message, a function call passed
// back) carry their content themselves. Keys fold, and an element is a
// reference unless it has a "type" spelled exactly (all an exact-case
// upstream reads) and no "type" in any case (a Go upstream's) is
// item_reference; then every "id" in any case is checked.
func itemRefs(v []byte, param string, refs []Ref) []Ref {
	arr := jsonscan.New(v, 0)
	for range arr.Elements() {
		n, exactTyped, ref := len(refs), false, false
		item := jsonscan.New(arr.Value(), 0)
		for key := range item.Members() {
			switch itemKeys.Index(key) {
			case 0:
				exactTyped = exactTyped || jsonscan.Equal(key, "type")
				ref = ref || unquoteString(item.Value()) == "item_reference"
			case 1:
				if id := unquoteString(item.Value()); id != "" {
					refs = append(refs, Ref{Kind: ItemReference, ID: id, Param: param})
				}
			}
		}
		if exactTyped && !ref {
			refs = refs[:n]
		}
	}
	return refs
}

// containerRefs appends the containers the tools array v names: a
// "container" string (a code_interpreter tool's; an object asks for a new
// container, and its file_ids are found by nested), and an "environment"
// object's "container_id" (the hosted shell tool's container_reference).
func containerRefs(v []byte, refs []Ref) []Ref {
	arr := jsonscan.New(v, 0)
	for range arr.Elements() {
		tool := jsonscan.New(arr.Value(), 0)
		for key := range tool.Fields(toolKeys) {
			c := tool.Value()
			if key == "environment" && len(c) > 0 && c[0] == '{' {
				env := jsonscan.New(c, 0)
				for range env.Fields(environmentKeys) {
					if id := env.Value(); isString(id) {
						refs = append(refs, Ref{Kind: Container, ID: jsonscan.Unquote(id), Param: "tools"})
					}
				}
			} else if key == "container" && isString(c) {
				refs = append(refs, Ref{Kind: Container, ID: jsonscan.Unquote(c), Param: "tools"})
			}
		}
	}
	return refs
}

// nested appends the ids under nestedNames in the value at s, at any
// depth. Keys are matched by jsonscan.Keys.Index, which allocates nothing:
// it runs over every member of every guarded request body.
func nested(s *jsonscan.Scanner, refs []Ref) []Ref {
	switch s.Peek() {
	case '{':
		for key := range s.Members() {
			refs = nestedMember(s, key, refs)
		}
	case '[':
		for range s.Elements() {
			refs = nested(s, refs)
		}
	default:
		s.Skip()
	}
	return refs
}

// nestedMember appends the ids of the member key whose value is at s: its
// value's, when key is one of nestedNames, else those under it.
func nestedMember(s *jsonscan.Scanner, key []byte, refs []Ref) []Ref {
	i := nestedName(key)
	if i < 0 {
		return nested(s, refs)
	}
	n := nestedNames[i]
	v := s.Value()
	if isString(v) {
		return append(refs, Ref{Kind: n.kind, ID: jsonscan.Unquote(v), Param: n.name})
	}
	arr := jsonscan.New(v, 0)
	for range arr.Elements() {
		if e := arr.Value(); isString(e) {
			refs = append(refs, Ref{Kind: n.kind, ID: jsonscan.Unquote(e), Param: n.name})
		}
	}
	return refs
}

// nestedName is the index in nestedNames of the name key matches (folded,
// as a Go upstream matches it), or -1.
func nestedName(key []byte) int { return nestedKeys.Index(key) }

var nestedKeys = func() *jsonscan.Keys {
	var names []string
	for _, n := range nestedNames {
		names = append(names, n.name)
	}
	return jsonscan.NewKeys(names...)
}()

func isString(v []byte) bool { return len(v) > 0 && v[0] == '"' }

var (
	answerKeys = jsonscan.NewKeys("id", "object", "deleted", "file", "output_file_id", "error_file_id", "output", "type")
	outputKeys = jsonscan.NewKeys("type", "container_id")
)

// objectKinds maps an answer's "object" to the kind recorded; typeKinds
// an Anthropic answer's "type" (Anthropic's objects name their kind
// there).
var (
	objectKinds = map[string]Kind{
		"response": Response, "conversation": Conversation, "file": File,
		"batch": Batch, "vector_store": VectorStore, "upload": Upload,
	}
	typeKinds = map[string]Kind{"message_batch": MessageBatch}
)

// FromAnswer returns the objects a JSON answer hands out, each from the
// one documented place a provider puts an object it created, at the top
// level of the answer's own object:
//
//   - the object itself: its "id" and "object" (an Anthropic object's
//     "type": a message_batch), unless "deleted" is true;
//   - an upload's "file", the file a completed upload became;
//   - a batch's "output_file_id" and "error_file_id", the files it wrote;
//   - a response's output items of type code_interpreter_call: their
//     "container_id", the container the call ran in.
//
// Nothing else is read: metadata, user, instructions, prompt variables,
// the tools a client named, message text and annotations, and the items
// of a list are written, or echoed, from what a client sent, and an id
// planted there must not become the client's.
func FromAnswer(body []byte) []Ref {
	var (
		refs, inner     []Ref
		id, object, typ string
		deleted         bool
	)
	s := jsonscan.New(body, 0)
	for key := range s.Fields(answerKeys) {
		v := s.Value()
		switch key {
		case "id":
			id = unquoteString(v)
		case "object":
			object = unquoteString(v)
		case "type":
			typ = unquoteString(v)
		case "deleted":
			deleted = string(v) == "true"
		default:
			inner = append(inner, answerMember(key, v)...)
		}
	}
	kind, ok := objectKinds[object]
	if !ok && object == "" {
		kind, ok = typeKinds[typ]
	}
	if !ok || id == "" || deleted {
		return nil
	}
	refs = append(refs, Ref{Kind: kind, ID: id})
	for _, r := range inner {
		if r.Param == object {
			refs = append(refs, Ref{Kind: r.Kind, ID: r.ID})
		}
	}
	return refs
}

// answerMember returns the objects the top-level member key (value v)
// hands out, each with Param set to the kind of object the member belongs
// to: FromAnswer keeps them only if the answer is of that kind.
func answerMember(key string, v []byte) []Ref {
	switch key {
	case "file":
		var id, object string
		s := jsonscan.New(v, 0)
		for k := range s.Fields(answerKeys) {
			switch k {
			case "id":
				id = unquoteString(s.Value())
			case "object":
				object = unquoteString(s.Value())
			}
		}
		if object == "file" && id != "" {
			return []Ref{{Kind: File, ID: id, Param: "upload"}}
		}
	case "output_file_id", "error_file_id":
		if fid := unquoteString(v); fid != "" {
			return []Ref{{Kind: File, ID: fid, Param: "batch"}}
		}
	case "output":
		var refs []Ref
		arr := jsonscan.New(v, 0)
		for range arr.Elements() {
			if c := containerOf(arr.Value()); c != "" {
				refs = append(refs, Ref{Kind: Container, ID: c, Param: "response"})
			}
		}
		return refs
	}
	return nil
}

// containerOf is the container_id of an output item of type
// code_interpreter_call, or "".
func containerOf(item []byte) string {
	var typ, id string
	s := jsonscan.New(item, 0)
	for key := range s.Fields(outputKeys) {
		if key == "type" {
			typ = unquoteString(s.Value())
		} else {
			id = unquoteString(s.Value())
		}
	}
	if typ != "code_interpreter_call" {
		return ""
	}
	return id
}

func unquoteString(v []byte) string {
	if !isString(v) {
		return ""
	}
	return jsonscan.Unquote(v)
}

var eventKeys = jsonscan.NewKeys("type", "response", "item")

// FromStreamEvent returns the objects a Responses stream event (ev as the
// SSE reader returns it) hands out: response.created's "response", the
// response with its id (read as FromAnswer reads it), and the container
// a code_interpreter_call item runs in, in response.output_item.added and
// .done.
func FromStreamEvent(ev []byte) []Ref {
	var typ string
	var resp, item []byte
	s := jsonscan.New(sse.Data(ev), 0)
	for key := range s.Fields(eventKeys) {
		v := s.Value()
		switch key {
		case "type":
			typ = unquoteString(v)
		case "response":
			resp = v
		default:
			item = v
		}
	}
	switch {
	case typ == "response.created" && resp != nil:
		return FromAnswer(resp)
	case typ == "response.output_item.added" || typ == "response.output_item.done":
		if c := containerOf(item); c != "" {
			return []Ref{{Kind: Container, ID: c}}
		}
	}
	return nil
}

// UploadPath reports whether path takes multipart/form-data uploads:
// POST /v1/files, /v1/uploads/{id}/parts, /v1/audio/* and /v1/images/*.
func UploadPath(path string) bool {
	p := strings.TrimPrefix(path, "/v1")
	if p == "/files" || strings.HasPrefix(p, "/audio/") || strings.HasPrefix(p, "/images/") {
		return true
	}
	rest, ok := strings.CutPrefix(p, "/uploads/")
	id, tail, _ := strings.Cut(rest, "/")
	return ok && id != "" && tail == "parts"
}

// Creates reports whether answers on path may hand out objects whose owner
// is recorded: paths under /v1/responses, /v1/conversations, /v1/files,
// /v1/batches, /v1/vector_stores, /v1/uploads and /v1/messages/batches.
// Other answers (chat, messages, embeddings) are not scanned.
func Creates(path string) bool {
	rest := strings.TrimPrefix(strings.TrimPrefix(path, "/v1"), "/")
	if rest == messageBatches || strings.HasPrefix(rest, messageBatches+"/") {
		return true
	}
	first, _, _ := strings.Cut(rest, "/")
	_, ok := pathKinds[first]
	return ok
}
