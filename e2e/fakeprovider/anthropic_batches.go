package fakeprovider

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// The Anthropic fake's Message Batches API: a batch is created ended, its
// results ready at once (one succeeded message per request it holds),
// and its results_url is the fake's own address, as Anthropic's points at
// api.anthropic.com.

// fakeBatch is a batch the fake holds.
type fakeBatch struct {
	id       string
	status   string
	url      string     // its results_url
	requests []batchReq // as created
}

type batchReq struct {
	CustomID string `json:"custom_id"`
	Params   struct {
		Model string `json:"model"`
	} `json:"params"`
}

// AnthropicBatch is the JSON of a message batch of n requests as the fake
// sends it: processing_status status, results_url resultsURL (null when
// it is "").
func AnthropicBatch(id string, n int, status, resultsURL string) string {
	u := "null"
	if resultsURL != "" {
		b, _ := json.Marshal(resultsURL)
		u = string(b)
	}
	return fmt.Sprintf(`{"id":%q,"type":"message_batch","processing_status":%q,`+
		`"request_counts":{"processing":0,"succeeded":%d,"errored":0,"canceled":0,"expired":0},`+
		`"ended_at":"2026-01-02T03:04:06Z","created_at":"2026-01-02T03:04:05Z","expires_at":"2026-01-03T03:04:05Z",`+
		`"archived_at":null,"cancel_initiated_at":null,"results_url":%s}`, id, status, n, u)
}

// AnthropicBatchResult is one line of a batch's results (without its
// newline): the request customID, answered with AnthropicMessage.
func AnthropicBatchResult(customID, model string) string {
	id, _ := json.Marshal(customID)
	return `{"custom_id":` + string(id) + `,"result":{"type":"succeeded","message":` +
		AnthropicMessage(model, "Hello from the fake Anthropic provider.", "end_turn") + `}}`
}

func (b *fakeBatch) json() string { return AnthropicBatch(b.id, len(b.requests), b.status, b.url) }

// serveBatches answers a Message Batches request: POST /v1/messages/batches
// creates, GET lists, GET {id}, GET {id}/results, POST {id}/cancel and
// DELETE {id}; an unknown id is Anthropic's not_found_error.
func (a *Anthropic) serveBatches(w http.ResponseWriter, r *http.Request, body []byte) {
	rest := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/v1/messages/batches"), "/")
	id, action, _ := strings.Cut(rest, "/")
	a.mu.Lock()
	defer a.mu.Unlock()
	if id == "" {
		switch r.Method {
		case http.MethodPost:
			writeJSON(w, a.createBatch(r, body).json())
		case http.MethodGet:
			writeJSON(w, a.listBatches())
		}
		return
	}
	b, ok := a.batches[id]
	if !ok {
		writeAnthropicError(w, AnthropicStep{Status: http.StatusNotFound, ErrorType: "not_found_error",
			Message: "No batch found with id " + id})
		return
	}
	switch {
	case r.Method == http.MethodGet && action == "":
		writeJSON(w, b.json())
	case r.Method == http.MethodGet && action == "results":
		lines := make([]string, len(b.requests))
		for i, q := range b.requests {
			lines[i] = AnthropicBatchResult(q.CustomID, q.Params.Model)
		}
		writeJSONL(w, r, lines, nil)
	case r.Method == http.MethodPost && action == "cancel":
		b.status = "canceling"
		writeJSON(w, b.json())
	case r.Method == http.MethodDelete && action == "":
		delete(a.batches, id)
		writeJSON(w, fmt.Sprintf(`{"id":%q,"type":"message_batch_deleted"}`, id))
	default:
		writeAnthropicError(w, AnthropicStep{Status: http.StatusNotFound, ErrorType: "not_found_error", Message: "Not Found"})
	}
}

// createBatch holds a new batch of the requests in body.
func (a *Anthropic) createBatch(r *http.Request, body []byte) *fakeBatch {
	var in struct {
		Requests []batchReq `json:"requests"`
	}
	_ = json.Unmarshal(body, &in)
	if a.batches == nil {
		a.batches = map[string]*fakeBatch{}
	}
	id := fmt.Sprintf("msgbatch_fake%03d", len(a.batchIDs)+1)
	b := &fakeBatch{id: id, status: "ended", requests: in.Requests,
		url: "http://" + r.Host + "/v1/messages/batches/" + id + "/results"}
	a.batches[id] = b
	a.batchIDs = append(a.batchIDs, id)
	return b
}

// listBatches is the list of every batch held, newest first, as one page.
func (a *Anthropic) listBatches() string {
	var data, ids []string
	for i := len(a.batchIDs) - 1; i >= 0; i-- {
		if b, ok := a.batches[a.batchIDs[i]]; ok {
			data, ids = append(data, b.json()), append(ids, fmt.Sprintf("%q", b.id))
		}
	}
	first, last := "null", "null"
	if len(ids) > 0 {
		first, last = ids[0], ids[len(ids)-1]
	}
	return `{"data":[` + strings.Join(data, ",") + `],"has_more":false,"first_id":` + first + `,"last_id":` + last + `}`
}

func writeJSON(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, body)
}

// writeJSONL sends lines, each with its newline and flushed; hold, when
// not nil, is waited on before the last.
func writeJSONL(w http.ResponseWriter, r *http.Request, lines []string, hold <-chan struct{}) {
	w.Header().Set("Content-Type", "application/binary")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	for i, l := range lines {
		if hold != nil && i == len(lines)-1 {
			select {
			case <-hold:
			case <-r.Context().Done():
				panic(http.ErrAbortHandler)
			}
		}
		_, _ = io.WriteString(w, l+"\n")
		if f != nil {
			f.Flush()
		}
	}
}
