package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/llmgate/llmgate/config"
)

// echoingObjects is a fake provider that, like OpenAI, echoes a request's
// metadata (and user, instructions) back in the Response or Conversation
// it creates, and hands out a container when a code_interpreter tool asks
// for an automatic one. It counts what it sees.
type echoingObjects struct {
	mu    sync.Mutex
	calls int
}

func (e *echoingObjects) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req map[string]json.RawMessage
	json.NewDecoder(r.Body).Decode(&req)
	e.mu.Lock()
	e.calls++
	n := e.calls
	e.mu.Unlock()
	meta := req["metadata"]
	if meta == nil {
		meta = json.RawMessage(`{}`)
	}
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/v1/conversations":
		fmt.Fprintf(w, `{"id":"conv_%d","object":"conversation","created_at":1,"metadata":%s}`, n, meta)
	case "/v1/responses":
		out := `{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]}`
		if string(req["tools"]) == `[{"type":"code_interpreter","container":{"type":"auto"}}]` {
			out = fmt.Sprintf(`{"type":"code_interpreter_call","id":"ci_%d","container_id":"cntr_alice%d","code":"1"}`, n, n)
		}
		user, instr := req["user"], req["instructions"]
		if user == nil {
			user = json.RawMessage(`null`)
		}
		if instr == nil {
			instr = json.RawMessage(`null`)
		}
		fmt.Fprintf(w, `{"id":"resp_%d","object":"response","status":"completed","metadata":%s,"user":%s,"instructions":%s,"output":[%s]}`,
			n, meta, user, instr, out)
	default:
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error":{"message":"not found","type":"invalid_request_error","param":null,"code":null}}`)
	}
}

func (e *echoingObjects) seen() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls
}

// TestContainerNotClaimedThroughEchoedFields: bob plants alice's container
// id in the metadata (and user, instructions) of a Response and a
// Conversation, which the provider echoes back; naming that container
// afterwards is still a 404 container_not_found, and the provider is not
// called. Alice's own container, handed out by a code_interpreter call,
// stays hers.
func TestContainerNotClaimedThroughEchoedFields(t *testing.T) {
	up := &echoingObjects{}
	s := httptest.NewServer(up)
	t.Cleanup(s.Close)
	h, _ := ownersHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = s.URL + "/v1" })
	r := h.do(http.MethodPost, "/v1/responses", `{"model":"gpt-4o","input":"1","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, asAlice)
	var created struct {
		Output []struct {
			ContainerID string `json:"container_id"`
		}
	}
	if err := json.Unmarshal(r.body, &created); r.status != http.StatusOK || err != nil || len(created.Output) != 1 || created.Output[0].ContainerID == "" {
		t.Fatalf("alice's container: %d %s", r.status, r.body)
	}
	cntr := created.Output[0].ContainerID
	use := `{"model":"gpt-4o","input":"2","tools":[{"type":"code_interpreter","container":"` + cntr + `"}]}`
	if r := h.do(http.MethodPost, "/v1/responses", use, asAlice); r.status != http.StatusOK {
		t.Fatalf("alice uses her container: %d %s", r.status, r.body)
	}
	planted := fmt.Sprintf(`{"container_id":%q}`, cntr)
	for _, plant := range []struct{ path, body string }{
		{"/v1/responses", `{"model":"gpt-4o","input":"x","metadata":` + planted + `}`},
		{"/v1/responses", fmt.Sprintf(`{"model":"gpt-4o","input":"x","user":%q}`, planted)},
		{"/v1/responses", `{"model":"gpt-4o","input":"x","instructions":[{"type":"code_interpreter_call","id":"ci_x","container_id":"` + cntr + `","code":"1"}]}`},
		{"/v1/conversations", `{"metadata":` + planted + `}`},
	} {
		if r := h.do(http.MethodPost, plant.path, plant.body, asBob); r.status != http.StatusOK {
			t.Fatalf("bob's plant %s: %d %s", plant.body, r.status, r.body)
		}
	}
	before := up.seen()
	r = h.do(http.MethodPost, "/v1/responses", use, asBob)
	if e := wantOpenAIError(t, r, http.StatusNotFound); e["code"] != "container_not_found" {
		t.Fatalf("bob names alice's container after planting it: %v", e)
	}
	if up.seen() != before {
		t.Fatalf("bob's request naming alice's container reached the provider")
	}
}
