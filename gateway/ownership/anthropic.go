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
	messagesTopKeys  = jsonscan.NewKeys("container")
	containerIDKeys  = jsonscan.NewKeys("id")
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
// API would not read one is still checked.
func FromMessagesBody(body []byte) []Ref {
	var refs []Ref
	s := jsonscan.New(body, 0)
	for range s.Fields(messagesTopKeys) {
		v := s.Value()
		switch {
		case isString(v):
			refs = append(refs, Ref{Kind: Container, ID: jsonscan.Unquote(v), Param: "container"})
		case len(v) > 0 && v[0] == '{':
			sub := jsonscan.New(v, 0)
			for range sub.Fields(containerIDKeys) {
				if id := sub.Value(); isString(id) {
					refs = append(refs, Ref{Kind: Container, ID: jsonscan.Unquote(id), Param: "container"})
				}
			}
		}
	}
	return nested(jsonscan.New(body, 0), refs)
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
