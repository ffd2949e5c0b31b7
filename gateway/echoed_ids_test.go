package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/llmgate/llmgate/config"
)

// Regression tests from a hostile-tenant pass over the request plan and
// the ownership checks.

// echoUpstream answers like OpenAI does for the objects it stores: a
// created response or conversation echoes the request's metadata and
// tools, which the client chose; a code_interpreter call with an auto
// container runs in a new container. It records every request it sees.
type echoUpstream struct {
	mu   sync.Mutex
	n    int
	seen []objectSeen
}

func (e *echoUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	e.mu.Lock()
	e.n++
	n := e.n
	e.seen = append(e.seen, objectSeen{r.Method, r.URL.Path, r.Header.Get("Authorization"), string(body)})
	e.mu.Unlock()
	var in struct {
		Metadata json.RawMessage `json:"metadata"`
		Tools    json.RawMessage `json:"tools"`
	}
	_ = json.Unmarshal(body, &in)
	echo := func(v json.RawMessage) string {
		if len(v) == 0 {
			return "null"
		}
		return string(v)
	}
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/v1/responses":
		output := `[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}]`
		if strings.Contains(string(body), `"auto"`) {
			output = fmt.Sprintf(`[{"type":"code_interpreter_call","id":"ci_%d","container_id":"cntr_victim_%d","code":"1+1"}]`, n, n)
		}
		fmt.Fprintf(w, `{"id":"resp_%d","object":"response","status":"completed","metadata":%s,"tools":%s,"output":%s}`,
			n, echo(in.Metadata), echo(in.Tools), output)
	case "/v1/conversations":
		fmt.Fprintf(w, `{"id":"conv_%d","object":"conversation","created_at":1,"metadata":%s}`, n, echo(in.Metadata))
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"error":{"message":"not found","type":"invalid_request_error","param":null,"code":null}}`)
	}
}

func (e *echoUpstream) requests() []objectSeen {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.seen
	e.seen = nil
	return s
}

// TestContainerNotClaimedThroughEchoedFields: the containers recorded as a
// client's are the ones its code ran in, not any container_id string that
// an answer happens to carry. An answer echoes what the client sent
// (metadata, a function tool's parameters schema), so bob, knowing the id
// of alice's container, must not make it his by sending it back to
// himself: naming it afterwards is still a 404 with no upstream call.
func TestContainerNotClaimedThroughEchoedSchemasAndConversations(t *testing.T) {
	for _, launder := range []struct{ name, path, body string }{
		{"response metadata", "/v1/responses", `{"model":"gpt-4o","input":"x","metadata":{"container_id":"CNTR"}}`},
		{"function tool schema", "/v1/responses", `{"model":"gpt-4o","input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"object","examples":[{"container_id":"CNTR"}]}}]}`},
		{"conversation metadata", "/v1/conversations", `{"metadata":{"container_id":"CNTR"}}`},
	} {
		t.Run(launder.name, func(t *testing.T) {
			echo := &echoUpstream{}
			es := httptest.NewServer(echo)
			t.Cleanup(es.Close)
			h, _ := ownersHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = es.URL + "/v1" })
			r := h.do(http.MethodPost, "/v1/responses",
				`{"model":"gpt-4o","input":"1+1","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`, asAlice)
			i := strings.Index(string(r.body), `"container_id":"`)
			if r.status != http.StatusOK || i < 0 {
				t.Fatalf("alice's code run: %d %s", r.status, r.body)
			}
			cntr, _, _ := strings.Cut(string(r.body[i+len(`"container_id":"`):]), `"`)
			if r := h.do(http.MethodPost, launder.path, strings.ReplaceAll(launder.body, "CNTR", cntr), asBob); r.status != http.StatusOK {
				t.Fatalf("bob's create: %d %s", r.status, r.body)
			}
			echo.requests()
			use := `{"model":"gpt-4o","input":"cat /mnt/data/*","tools":[{"type":"code_interpreter","container":"` + cntr + `"}]}`
			r = h.do(http.MethodPost, "/v1/responses", use, asBob)
			if r.status != http.StatusNotFound || !strings.Contains(string(r.body), "container_not_found") {
				t.Errorf("bob naming alice's container after echoing it to himself: %d %s", r.status, r.body)
			}
			for _, s := range echo.requests() {
				if strings.Contains(s.Body, `"container":"`+cntr+`"`) {
					t.Errorf("bob's request in alice's container reached the upstream under %q: %s", s.Auth, s.Body)
				}
			}
		})
	}
}

// TestOwnKeyClientReachesItsObjectOnTheSharedFallback: alice has her own
// key on primary, which falls back to second under the key clients share.
// A response she created on second (primary down, or a model second
// serves) is recorded as hers there; reading it or continuing it goes to
// second, the upstream that holds it, as it would for a client with no
// key of its own — not to primary, where her own key finds nothing and
// the 404 stops the fallback.
func TestOwnKeyClientReachesItsObjectOnTheSharedFallback(t *testing.T) {
	second := &objectUpstream{}
	ss := httptest.NewServer(second)
	t.Cleanup(ss.Close)
	h, primary := ownersHarness(t, func(c *config.Config) {
		c.Upstreams[0].Models = []string{"gpt-*"}
		c.Upstreams[0].Fallbacks = []string{"second"}
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "second", BaseURL: ss.URL + "/v1", APIKey: "sk-second-shared",
			Models: []string{"llama-*"}, Timeout: c.Upstreams[0].Timeout})
		c.Clients[0].UpstreamAPIKeys = map[string]string{"primary": aliceOwn}
	})
	r := h.do(http.MethodPost, "/v1/responses", `{"model":"llama-3","input":"hi","store":true}`, asAlice)
	if r.status != http.StatusOK {
		t.Fatalf("create on second: %d %s", r.status, r.body)
	}
	id := decodeID(t, r.body)
	second.requests()
	for _, rq := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/responses/" + id, ""},
		{http.MethodPost, "/v1/responses", `{"model":"gpt-4o","input":"go on","previous_response_id":"` + id + `"}`},
	} {
		h.do(rq.method, rq.path, rq.body, asAlice)
		if seen := primary.requests(); len(seen) != 0 {
			t.Errorf("%s %s naming alice's response on second went to primary: %+v", rq.method, rq.path, seen)
		}
		if seen := second.requests(); len(seen) != 1 || seen[0].Auth != "Bearer sk-second-shared" {
			t.Errorf("%s %s: second saw %+v, want the request under its key", rq.method, rq.path, seen)
		}
	}
}
