package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/llmgate/llmgate/config"
)

// modelsFake answers GET /v1/models with list, and GET /v1/models/{id}
// with an object naming the id.
func modelsFake(t *testing.T, list string) *recorder {
	return newRecorder(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, list)
			return
		}
		id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
		fmt.Fprintf(w, `{"id":%q,"object":"model","owned_by":"vllm","max_model_len":32768}`, id)
	})
}

// TestModelsRawMerge: GET /v1/models keeps every field each upstream sent,
// byte for byte, adds none, and a duplicate id is the first upstream's.
func TestModelsRawMerge(t *testing.T) {
	a := `{"id":"b-model","object":"model","created":1,"owned_by":"vllm","max_model_len":4096,"permission":[{"x":1}]}`
	dupFirst := `{"id":"dup","object":"model","owned_by":"first"}`
	dupSecond := `{"id":"dup","object":"model","owned_by":"second"}`
	c := `{"id":"a-model", "object":"model","owned_by":"org","meta":{"context":[1,2]}}`
	first := modelsFake(t, `{"object":"list","data":[`+a+`,`+dupFirst+`]}`)
	second := modelsFake(t, `{"object":"list","data":[`+dupSecond+`,`+c+`]}`)
	h := passHarness(t, first, func(cfg *config.Config) {
		cfg.Upstreams = append(cfg.Upstreams, config.Upstream{Name: "second", BaseURL: second.srv.URL + "/v1",
			Models: []string{"*"}, Timeout: config.Duration(5 * time.Second)})
	})
	r := h.do("GET", "/v1/models", "", nil)
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var list struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil || list.Object != "list" {
		t.Fatalf("not a list: %s", r.body)
	}
	var got []string
	for _, d := range list.Data {
		got = append(got, string(d))
	}
	want := []string{c, a, dupFirst} // sorted by id
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("items:\n%s\nwant, as the upstreams wrote them:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if bytes.Contains(r.body, []byte(`"root"`)) || bytes.Contains(r.body, []byte(`"parent"`)) {
		t.Fatalf("fields added: %s", r.body)
	}
}

// TestModelRetrieve: GET /v1/models/{id} with an id containing "/" goes
// to the upstream that serves it, its answer relayed as it came; a model
// no upstream serves is a 404 model_not_found with no upstream call.
func TestModelRetrieve(t *testing.T) {
	first := modelsFake(t, `{"data":[]}`)
	second := modelsFake(t, `{"data":[]}`)
	h := passHarness(t, first, func(cfg *config.Config) {
		cfg.Upstreams[0].Models = []string{"gpt-*"}
		cfg.Upstreams = append(cfg.Upstreams, config.Upstream{Name: "second", BaseURL: second.srv.URL + "/v1",
			Models: []string{"meta-llama/*"}, Timeout: config.Duration(5 * time.Second)})
	})
	r := h.do("GET", "/v1/models/meta-llama/Llama-3.1-8B-Instruct", "", nil)
	want := `{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","owned_by":"vllm","max_model_len":32768}`
	if r.status != 200 || string(r.body) != want {
		t.Fatalf("%d %s, want %s", r.status, r.body, want)
	}
	if s := second.seen(); len(s) != 1 || s[0].path != "/v1/models/meta-llama/Llama-3.1-8B-Instruct" || s[0].method != "GET" {
		t.Fatalf("second saw %+v", s)
	}
	r = h.do("GET", "/v1/models/mistral-large", "", nil)
	if e := wantOpenAIError(t, r, 404); e["code"] != "model_not_found" {
		t.Fatalf("unserved model: %v", e)
	}
	if len(first.seen())+len(second.seen()) != 1 {
		t.Fatal("an unserved model reached an upstream")
	}
}

// TestModelRetrieveSDK: an SDK's models.retrieve (go-openai's GetModel)
// works through the gateway, for an id with "/" too.
func TestModelRetrieveSDK(t *testing.T) {
	up := modelsFake(t, `{"data":[]}`)
	h := passHarness(t, up, nil)
	cfg := openai.DefaultConfig("unused")
	cfg.BaseURL = h.srv.URL + "/v1"
	m, err := openai.NewClientWithConfig(cfg).GetModel(context.Background(), "Qwen/Qwen2.5-7B")
	if err != nil || m.ID != "Qwen/Qwen2.5-7B" || m.OwnedBy != "vllm" {
		t.Fatalf("GetModel: %+v, %v", m, err)
	}
}

// An upstream's base_url may carry its credential in the query (Azure's
// ?api-key=): a models list no upstream answered logs the failure without
// the URL, on its warning and on the request's log line alike.
func TestModelsListLogsNoBaseURLSecret(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = "http://127.0.0.1:1/v1?api-version=2024&api-key=AZURE-SECRET-123"
	})
	r := h.do(http.MethodGet, "/v1/models", "", nil)
	if r.status != http.StatusBadGateway {
		t.Fatalf("status %d, want 502: %s", r.status, r.body)
	}
	if logs := h.logs.String(); strings.Contains(logs, "AZURE-SECRET-123") || !strings.Contains(logs, "connection refused") {
		t.Fatalf("the log holds base_url's secret, or not the failure:\n%s", logs)
	}
	if strings.Contains(string(r.body), "AZURE-SECRET-123") {
		t.Fatalf("the answer holds base_url's secret: %s", r.body)
	}
}
