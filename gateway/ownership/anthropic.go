package ownership

import (
	"strings"

	"github.com/llmgate/llmgate/classify/jsonscan"
	"github.com/llmgate/llmgate/gateway/sse"
)

// Scheme is how one provider API's bodies name objects and hand them out:
// the ownership check reads a request with Names, and records what a 2xx
// answer hands out with Answer (a JSON body) or Event (each of a stream's
// first events). An API is described once (proxy.API); nothing here
// branches on the path of another API.
type Scheme struct {
	// Names returns the objects a JSON request body names.
	Names func(body []byte) []Ref
	// Answer returns the objects a 2xx JSON answer on path hands out.
	Answer func(path string, body []byte) []Ref
	// Event returns the objects a stream event on path hands out.
	Event func(path string, ev []byte) []Ref
}

// OpenAIScheme reads OpenAI's bodies: FromBody, and FromAnswer and
// FromStreamEvent on the paths that create objects (Creates).
var OpenAIScheme = Scheme{
	Names: FromBody,
	Answer: func(path string, body []byte) []Ref {
		if !Creates(path) {
			return nil
		}
		return FromAnswer(body)
	},
	Event: func(path string, ev []byte) []Ref {
		if !Creates(path) {
			return nil
		}
		return FromStreamEvent(ev)
	},
}

// AnthropicScheme reads Anthropic's bodies: a Messages body with
// FromMessagesBody; a message (POST /v1/messages) with FromMessage, its
// stream's message_start likewise; a file (under /v1/files) with
// FromAnthropicFile.
var AnthropicScheme = Scheme{
	Names: FromMessagesBody,
	Answer: func(path string, body []byte) []Ref {
		switch {
		case path == "/v1/messages":
			return FromMessage(body)
		case path == "/v1/files" || strings.HasPrefix(path, "/v1/files/"):
			return FromAnthropicFile(body)
		}
		return nil
	},
	Event: func(path string, ev []byte) []Ref {
		if path != "/v1/messages" {
			return nil
		}
		return fromMessageStart(ev)
	},
}

var (
	messagesTopKeys  = jsonscan.NewKeys("container", "messages")
	containerIDKeys  = jsonscan.NewKeys("id")
	contentKeys      = jsonscan.NewKeys("content")
	blockTypeKeys    = jsonscan.NewKeys("type")
	toolInputKeys    = jsonscan.NewKeys("input")
	messageKeys      = jsonscan.NewKeys("type", "id", "container")
	messageEventKeys = jsonscan.NewKeys("type", "message")
)

// FromMessagesBody returns the objects an Anthropic Messages (or
// count_tokens) body names: the top-level "container" (a string id, or an
// object's "id"; an object with no id asks for a new container), and
// file_id (a document or image source of type "file", a container_upload
// block) and the other names FromBody finds at any depth — in every
// message's content, in a tool_result's content, in the system prompt.
// Like FromBody, it scans keys folded and fails closed: a file_id where the
// API would not read one is still checked, with one exception: the
// "input" of a tool_use block (server_tool_use, mcp_tool_use), which is
// the arguments the model wrote for the client's own tool, passed back in
// the history — a tool taking a "file_id" of the client's own system
// must not make every later turn a 404. A block is taken as a tool use
// only if every "type" it has (keys folded) says so, exactly.
func FromMessagesBody(body []byte) []Ref {
	var refs []Ref
	s := jsonscan.New(body, 0)
	if s.Peek() != '{' {
		return nil
	}
	for key := range s.Members() {
		switch messagesTopKeys.Index(key) {
		case 0:
			v := s.Value()
			refs = containerRef(v, refs)
			refs = nested(jsonscan.New(v, 0), refs)
		case 1:
			refs = eachElement(s.Value(), refs, messageRefs)
		default:
			refs = nestedMember(s, key, refs)
		}
	}
	return refs
}

// containerRef appends the container a Messages body's "container" value
// v names: a string, or an object's "id".
func containerRef(v []byte, refs []Ref) []Ref {
	switch {
	case isString(v):
		return append(refs, Ref{Kind: Container, ID: jsonscan.Unquote(v), Param: "container"})
	case len(v) > 0 && v[0] == '{':
		sub := jsonscan.New(v, 0)
		for range sub.Fields(containerIDKeys) {
			if id := sub.Value(); isString(id) {
				refs = append(refs, Ref{Kind: Container, ID: jsonscan.Unquote(id), Param: "container"})
			}
		}
	}
	return refs
}

// eachElement appends what each element of the array v names, read by
// each; a v that is no array is scanned whole (nested).
func eachElement(v []byte, refs []Ref, each func(elem []byte, refs []Ref) []Ref) []Ref {
	return eachOr(v, refs, each, func(v []byte, refs []Ref) []Ref { return nested(jsonscan.New(v, 0), refs) })
}

// eachOr applies each to the elements of the array v, or other to a v
// that is no array.
func eachOr(v []byte, refs []Ref, each, other func(v []byte, refs []Ref) []Ref) []Ref {
	arr := jsonscan.New(v, 0)
	if arr.Peek() != '[' {
		return other(v, refs)
	}
	for range arr.Elements() {
		refs = each(arr.Value(), refs)
	}
	return refs
}

// messageRefs appends what one message names: its content blocks
// (blockRefs), and anything else it holds (nested).
func messageRefs(msg []byte, refs []Ref) []Ref {
	m := jsonscan.New(msg, 0)
	if m.Peek() != '{' {
		return nested(m, refs)
	}
	for key := range m.Members() {
		if contentKeys.Index(key) == 0 {
			refs = eachElement(m.Value(), refs, blockRefs)
			continue
		}
		refs = nestedMember(m, key, refs)
	}
	return refs
}

// blockRefs appends what one content block names (nested), leaving out a
// tool use's "input".
func blockRefs(block []byte, refs []Ref) []Ref {
	s := jsonscan.New(block, 0)
	if !toolUse(block) {
		return nested(s, refs)
	}
	for key := range s.Members() {
		if toolInputKeys.Index(key) == 0 {
			s.Skip()
			continue
		}
		refs = nestedMember(s, key, refs)
	}
	return refs
}

// toolUse reports whether every "type" of block (keys folded; one at
// least) is exactly a tool use's.
func toolUse(block []byte) bool {
	s := jsonscan.New(block, 0)
	n := 0
	for range s.Fields(blockTypeKeys) {
		switch unquoteString(s.Value()) {
		case "tool_use", "server_tool_use", "mcp_tool_use":
			n++
		default:
			return false
		}
	}
	return n > 0
}

// FromMessage returns the objects an Anthropic message (a 2xx answer of
// POST /v1/messages) hands out: the container its code ran in, from the
// one field that means it — the message's top-level "container" object's
// "id" — and only when the answer is a message ("type": "message").
// Nothing else is read: content blocks (a code execution result's stdout,
// text, a tool's input), and anything the model wrote or the client sent
// and the answer echoes, may carry any id a client planted.
func FromMessage(body []byte) []Ref {
	var typ, id string
	var container []byte
	s := jsonscan.New(body, 0)
	for key := range s.Fields(messageKeys) {
		v := s.Value()
		switch key {
		case "type":
			typ = unquoteString(v)
		case "id":
			id = unquoteString(v)
		case "container":
			container = v
		}
	}
	if typ != "message" || id == "" || len(container) == 0 || container[0] != '{' {
		return nil
	}
	var cid string
	sub := jsonscan.New(container, 0)
	for range sub.Fields(containerIDKeys) {
		cid = unquoteString(sub.Value())
	}
	if cid == "" {
		return nil
	}
	return []Ref{{Kind: Container, ID: cid}}
}

// fromMessageStart is FromMessage for a Messages stream's message_start
// event (ev as the SSE reader returns it), whose "message" is the message
// without its content yet.
func fromMessageStart(ev []byte) []Ref {
	var typ string
	var msg []byte
	s := jsonscan.New(sse.Data(ev), 0)
	for key := range s.Fields(messageEventKeys) {
		v := s.Value()
		if key == "type" {
			typ = unquoteString(v)
		} else {
			msg = v
		}
	}
	if typ != "message_start" || msg == nil {
		return nil
	}
	return FromMessage(msg)
}

var anthropicFileKeys = jsonscan.NewKeys("type", "id")

// FromAnthropicFile returns the file an Anthropic Files API answer hands
// out: the object itself, when its "type" is "file" (an upload's answer,
// or a file's metadata). A deleted file ("file_deleted") and a list hand
// out nothing.
func FromAnthropicFile(body []byte) []Ref {
	var typ, id string
	s := jsonscan.New(body, 0)
	for key := range s.Fields(anthropicFileKeys) {
		if key == "type" {
			typ = unquoteString(s.Value())
		} else {
			id = unquoteString(s.Value())
		}
	}
	if typ != "file" || id == "" {
		return nil
	}
	return []Ref{{Kind: File, ID: id}}
}

// AnthropicBatchScheme reads Anthropic's Message Batches: its ids as the
// OpenAI objects are read (OpenAIScheme), and a batch's body with
// FromBatchBody.
var AnthropicBatchScheme = Scheme{
	Names:  FromBatchBody,
	Answer: OpenAIScheme.Answer,
	Event:  OpenAIScheme.Event,
}

// FromBatchBody returns the objects a Message Batches body names: what
// FromBody finds at any depth, and, for each of its requests, what
// FromMessagesBody finds in its params — a request's params are a whole
// Messages body, whose "container" FromBody alone does not read. Every
// member named like "requests" and "params" is read (in any case, escapes
// decoded, a duplicate too), and whatever its shape (a request in place of
// the list, params as a list, elements that are no request), so a body
// cannot show the check one member or shape and the provider another.
func FromBatchBody(body []byte) []Ref {
	refs := FromBody(body)
	s := jsonscan.New(body, 0)
	for range s.Fields(batchKeys) { // duplicates too
		refs = eachValue(s.Value(), refs, func(rq []byte, refs []Ref) []Ref {
			r := jsonscan.New(rq, 0)
			for range r.Fields(batchRequestKeys) {
				refs = eachValue(r.Value(), refs, func(params []byte, refs []Ref) []Ref {
					return append(refs, FromMessagesBody(params)...)
				})
			}
			return refs
		})
	}
	return refs
}

var (
	batchKeys        = jsonscan.NewKeys("requests")
	batchRequestKeys = jsonscan.NewKeys("params")
)

// eachValue applies each to v's elements when v is an array, else to v:
// a body the provider would refuse (a request in place of the list, params
// as a list) is still read, never passed unchecked.
func eachValue(v []byte, refs []Ref, each func(elem []byte, refs []Ref) []Ref) []Ref {
	return eachOr(v, refs, each, each)
}
