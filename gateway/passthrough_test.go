package gateway

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
)

// seenRequest is what the recording fake upstream received.
type seenRequest struct {
	method, path, query, auth, contentType string
	body                                   []byte
}

// recorder is a fake upstream that records every request and answers as
// its handle says (by default 200 with a body naming the request).
type recorder struct {
	mu     sync.Mutex
	reqs   []seenRequest
	handle func(w http.ResponseWriter, r *http.Request, n int)
	srv    *httptest.Server
}

func newRecorder(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, n int)) *recorder {
	rec := &recorder{handle: handle}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, seenRequest{method: r.Method, path: r.URL.Path, query: r.URL.RawQuery,
			auth: r.Header.Get("Authorization"), contentType: r.Header.Get("Content-Type"), body: body})
		n := len(rec.reqs)
		rec.mu.Unlock()
		if rec.handle != nil {
			rec.handle(w, r, n)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Vendor-Secret", "dropped")
		fmt.Fprintf(w, `{"object" : "echo", "path":%q,  "n":%d}`, r.URL.Path, n)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recorder) seen() []seenRequest {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]seenRequest(nil), rec.reqs...)
}

// passHarness is a gateway whose one upstream is rec.
func passHarness(t *testing.T, rec *recorder, mutate func(c *config.Config)) *harness {
	return newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = rec.srv.URL + "/v1"
		c.Passthrough.SpoolDir = t.TempDir()
		if mutate != nil {
			mutate(c)
		}
	})
}

// sendRaw sends a request with the given content type and body bytes.
func (h *harness) sendRaw(method, path, contentType string, body []byte, hdr map[string]string) result {
	h.t.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := testClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return result{status: res.StatusCode, header: res.Header, body: readAllBody(h.t, res)}
}

// multipartBody builds a form with the boundary given: fields, then one
// file part.
func multipartBody(t *testing.T, boundary string, fields [][2]string, file []byte) (string, []byte) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	if err := w.SetBoundary(boundary); err != nil {
		t.Fatal(err)
	}
	for _, f := range fields {
		_ = w.WriteField(f[0], f[1])
	}
	fw, err := w.CreateFormFile("file", "data.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	fw.Write(file)
	w.Close()
	return w.FormDataContentType(), b.Bytes()
}

// TestPassthroughEndpoints sends each passthrough endpoint once through the
// fake: the method, path, query and body bytes reach it as sent, with the
// upstream's key, and its answer's bytes reach the client unchanged.
func TestPassthroughEndpoints(t *testing.T) {
	rec := newRecorder(t, nil)
	h := passHarness(t, rec, nil)
	mpType, mp := multipartBody(t, "b0undary", [][2]string{{"purpose", "batch"}}, []byte(`{"a":1}`+"\n"))
	audioType, audio := multipartBody(t, "aud10", [][2]string{{"model", "whisper-1"}}, []byte("RIFF....WAVE"))
	json := func(s string) (string, []byte) { return "application/json", []byte(s) }
	none := func() (string, []byte) { return "", nil }
	type tc struct {
		method, path string
		ct           string
		body         []byte
	}
	var cases []tc
	add := func(method, path string, ct string, body []byte) { cases = append(cases, tc{method, path, ct, body}) }
	c, b := json(`{"model":"omni-moderation-latest", "input":"hi"}`)
	add("POST", "/v1/moderations", c, b)
	c, b = json(`{"prompt":"a cat","size":"256x256"}`)
	add("POST", "/v1/images/generations", c, b)
	add("POST", "/v1/images/edits", mpType, mp)
	c, b = json(`{"model":"tts-1","input":"hello","voice":"alloy"}`)
	add("POST", "/v1/audio/speech", c, b)
	add("POST", "/v1/audio/transcriptions", audioType, audio)
	add("POST", "/v1/audio/translations", audioType, audio)
	add("POST", "/v1/files", mpType, mp)
	for _, m := range []string{"GET /v1/files?purpose=batch&limit=2", "GET /v1/files/file-1", "DELETE /v1/files/file-1",
		"GET /v1/files/file-1/content", "GET /v1/batches?after=b0", "GET /v1/batches/b1", "POST /v1/batches/b1/cancel",
		"POST /v1/uploads/upl_1/cancel", "GET /v1/vector_stores", "GET /v1/vector_stores/vs_1", "DELETE /v1/vector_stores/vs_1",
		"GET /v1/vector_stores/vs_1/files", "GET /v1/conversations/conv_1", "DELETE /v1/conversations/conv_1",
		"GET /v1/conversations/conv_1/items?limit=5", "GET /v1/responses/resp_1", "DELETE /v1/responses/resp_1",
		"GET /v1/responses/resp_1/input_items?order=asc", "POST /v1/responses/resp_1/cancel"} {
		method, path, _ := strings.Cut(m, " ")
		c, b := none()
		add(method, path, c, b)
	}
	c, b = json(`{"filename":"a.jsonl","purpose":"batch","bytes":8,"mime_type":"text/jsonl"}`)
	add("POST", "/v1/uploads", c, b)
	add("POST", "/v1/uploads/upl_1/parts", mpType, mp)
	c, b = json(`{"part_ids":["part_1"]}`)
	add("POST", "/v1/uploads/upl_1/complete", c, b)
	c, b = json(`{"input_file_id":"file-1","endpoint":"/v1/chat/completions","completion_window":"24h"}`)
	add("POST", "/v1/batches", c, b)
	c, b = json(`{"name":"kb"}`)
	add("POST", "/v1/vector_stores", c, b)
	add("POST", "/v1/vector_stores/vs_1", c, b)
	c, b = json(`{"file_id":"file-1"}`)
	add("POST", "/v1/vector_stores/vs_1/files", c, b)
	c, b = json(`{"metadata":{"k":"v"}}`)
	add("POST", "/v1/conversations", c, b)
	add("POST", "/v1/conversations/conv_1", c, b)
	c, b = json(`{"items":[{"type":"message","role":"user","content":"hi"}]}`)
	add("POST", "/v1/conversations/conv_1/items", c, b)

	for i, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r := h.sendRaw(tc.method, tc.path, tc.ct, tc.body, map[string]string{"Authorization": "Bearer client-key"})
			all := rec.seen()
			if len(all) != i+1 {
				t.Fatalf("upstream saw %d requests, want %d", len(all), i+1)
			}
			got := all[i]
			path, query, _ := strings.Cut(tc.path, "?")
			if got.method != tc.method || got.path != path || got.query != query {
				t.Errorf("upstream saw %s %s?%s, want %s %s?%s", got.method, got.path, got.query, tc.method, path, query)
			}
			if !bytes.Equal(got.body, tc.body) || got.contentType != tc.ct {
				t.Errorf("upstream saw body %q (%s), want %q (%s)", got.body, got.contentType, tc.body, tc.ct)
			}
			if got.auth != "Bearer "+upstreamKey {
				t.Errorf("upstream saw Authorization %q, want the upstream's key", got.auth)
			}
			want := fmt.Sprintf(`{"object" : "echo", "path":%q,  "n":%d}`, path, i+1)
			if r.status != 200 || string(r.body) != want {
				t.Errorf("client got %d %s, want 200 %s", r.status, r.body, want)
			}
			if r.header.Get("X-Vendor-Secret") != "" || r.header.Get("Content-Type") != "application/json" {
				t.Errorf("response headers not filtered as for chat: %v", r.header)
			}
		})
	}
}

// TestPassthroughUnknownPaths: paths under /v1 that are not the API's stay
// 404 (OpenAI-shaped), a path that is not clean never reaches an upstream,
// and a method the API does not use there is a 405.
func TestPassthroughUnknownPaths(t *testing.T) {
	rec := newRecorder(t, nil)
	h := passHarness(t, rec, nil)
	for _, p := range []string{"/v1/foo", "/v1/filesX", "/v1/files/../models", "/v1/files//x", "/v1/moderationsX", "/v1/responses/r1/other"} {
		r := h.sendRaw("GET", p, "", nil, nil)
		if e := wantOpenAIError(t, r, 404); e["code"] != "unknown_url" {
			t.Errorf("%s: code %v, want unknown_url", p, e["code"])
		}
	}
	r := h.sendRaw("PUT", "/v1/files/file-1", "", nil, nil)
	wantOpenAIError(t, r, 405)
	if n := len(rec.seen()); n != 0 {
		t.Fatalf("upstream saw %d requests, want none", n)
	}
}

// TestPassthroughMethodNotAllowed: a passthrough path with a method the
// API does not use there is a 405 (OpenAI-shaped, with Allow), whichever
// way its route is written; a path that is not the API's stays a 404.
func TestPassthroughMethodNotAllowed(t *testing.T) {
	rec := newRecorder(t, nil)
	h := passHarness(t, rec, nil)
	for _, tc := range []struct{ method, path, allow string }{
		{"PUT", "/v1/files", "GET, POST, DELETE"},
		{"PATCH", "/v1/files/file-1", "GET, POST, DELETE"},
		{"PUT", "/v1/vector_stores/vs_1/files", "GET, POST, DELETE"},
		{"PATCH", "/v1/responses/resp_1", "GET, DELETE"},
		{"POST", "/v1/responses/resp_1/input_items", "GET"},
		{"GET", "/v1/responses/resp_1/cancel", "POST"},
		{"GET", "/v1/moderations", "POST"},
		{"DELETE", "/v1/audio/speech", "POST"},
	} {
		r := h.sendRaw(tc.method, tc.path, "", nil, nil)
		e := wantOpenAIError(t, r, http.StatusMethodNotAllowed)
		if e["type"] != "invalid_request_error" || e["code"] != "method_not_allowed" || r.header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %s, Allow %q; want method_not_allowed, Allow %q", tc.method, tc.path, r.body, r.header.Get("Allow"), tc.allow)
		}
	}
	if r := h.sendRaw("HEAD", "/v1/batches", "", nil, nil); r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") != "GET, POST, DELETE" {
		t.Errorf("HEAD /v1/batches: %d, Allow %q", r.status, r.header.Get("Allow"))
	}
	for _, p := range []string{"/v1/foo", "/v1/filesX", "/v1/responses/resp_1/other"} {
		if e := wantOpenAIError(t, h.sendRaw("PUT", p, "", nil, nil), http.StatusNotFound); e["code"] != "unknown_url" {
			t.Errorf("PUT %s: code %v, want unknown_url", p, e["code"])
		}
	}
	if n := len(rec.seen()); n != 0 {
		t.Fatalf("upstream saw %d requests, want none", n)
	}
}

// TestPassthroughRetryPolicy: a 5xx on a moderation is retried and the
// client gets the success; a 400 is not retried and relayed as it came.
func TestPassthroughRetryPolicy(t *testing.T) {
	var mu sync.Mutex
	var statuses []int // the fake's next answers; 200 when empty
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, n int) {
		mu.Lock()
		st := 200
		if len(statuses) > 0 {
			st, statuses = statuses[0], statuses[1:]
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(st)
		if st != 200 {
			fmt.Fprint(w, `{"error":{"message":"no","type":"invalid_request_error","param":null,"code":null}}`)
			return
		}
		fmt.Fprint(w, `{"id":"modr-1","results":[]}`)
	})
	h := passHarness(t, rec, nil)
	statuses = []int{503}
	r := h.sendRaw("POST", "/v1/moderations", "application/json", []byte(`{"input":"x"}`), nil)
	if r.status != 200 || string(r.body) != `{"id":"modr-1","results":[]}` || len(rec.seen()) != 2 {
		t.Fatalf("after a 503: %d %s, %d upstream calls; want 200 after 2", r.status, r.body, len(rec.seen()))
	}
	mu.Lock()
	statuses = []int{400}
	mu.Unlock()
	r = h.sendRaw("POST", "/v1/moderations", "application/json", []byte(`{"input":"x"}`), nil)
	if r.status != 400 || string(r.body) != `{"error":{"message":"no","type":"invalid_request_error","param":null,"code":null}}` || len(rec.seen()) != 3 {
		t.Fatalf("after a 400: %d %s, %d upstream calls; want the 400 after 1 more", r.status, r.body, len(rec.seen()))
	}
}

// TestPassthroughMultipartKeyed: SDKs pick a new boundary on every retry,
// so the same upload with another boundary replays the first answer (one
// upstream call, byte-identical); one changed byte in the file is 422.
func TestPassthroughMultipartKeyed(t *testing.T) {
	rec := newRecorder(t, nil)
	h := passHarness(t, rec, nil)
	file := bytes.Repeat([]byte(`{"custom_id":"1"}`+"\n"), 100)
	key := map[string]string{"Idempotency-Key": "upload-4711"}
	ct1, b1 := multipartBody(t, "boundaryONE", [][2]string{{"purpose", "batch"}}, file)
	first := h.sendRaw("POST", "/v1/files", ct1, b1, key)
	ct2, b2 := multipartBody(t, "boundaryTWO-other", [][2]string{{"purpose", "batch"}}, file)
	if bytes.Equal(b1, b2) {
		t.Fatal("test bug: the two bodies are equal")
	}
	second := h.sendRaw("POST", "/v1/files", ct2, b2, key)
	if first.status != 200 || second.status != 200 || !bytes.Equal(first.body, second.body) || second.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("second boundary: %d %s (replayed %q), want the first answer %d %s replayed",
			second.status, second.body, second.header.Get("Idempotent-Replayed"), first.status, first.body)
	}
	if n := len(rec.seen()); n != 1 {
		t.Fatalf("upstream saw %d requests, want 1", n)
	}
	changed := bytes.Clone(file)
	changed[len(changed)/2] ^= 1
	ct3, b3 := multipartBody(t, "boundaryONE", [][2]string{{"purpose", "batch"}}, changed)
	third := h.sendRaw("POST", "/v1/files", ct3, b3, key)
	if e := wantOpenAIError(t, third, 422); e["code"] != "idempotency_key_reused" {
		t.Fatalf("changed byte: code %v", e["code"])
	}
	ct4, b4 := multipartBody(t, "boundaryONE", [][2]string{{"purpose", "assistants"}}, file)
	wantOpenAIError(t, h.sendRaw("POST", "/v1/files", ct4, b4, key), 422)
	if n := len(rec.seen()); n != 1 {
		t.Fatalf("upstream saw %d requests, want 1", n)
	}
}

// TestPassthroughGetIgnoresKey: an Idempotency-Key on a GET is ignored:
// each GET reads the object afresh.
func TestPassthroughGetIgnoresKey(t *testing.T) {
	rec := newRecorder(t, nil)
	h := passHarness(t, rec, nil)
	key := map[string]string{"Idempotency-Key": "k-1"}
	a := h.sendRaw("GET", "/v1/batches/b1", "", nil, key)
	b := h.sendRaw("GET", "/v1/batches/b1", "", nil, key)
	if a.status != 200 || b.status != 200 || bytes.Equal(a.body, b.body) || len(rec.seen()) != 2 {
		t.Fatalf("GETs: %s / %s, %d upstream calls; want two fresh reads", a.body, b.body, len(rec.seen()))
	}
}

// TestPassthroughKeyedJSON: a keyed JSON POST commits and replays; one over
// its route's record limit is served once and a 410 marker committed.
func TestPassthroughKeyedJSON(t *testing.T) {
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		if strings.HasPrefix(r.URL.Path, "/v1/images") {
			fmt.Fprintf(w, `{"data":[{"b64_json":"%s"}]}`, strings.Repeat("A", 4096))
			return
		}
		fmt.Fprintf(w, `{"id":"batch_%d"}`, n)
	})
	h := passHarness(t, rec, func(c *config.Config) {
		c.Passthrough.Routes = []config.Route{{Prefix: "/v1/images", MaxRecordBytes: 1024}}
	})
	body := []byte(`{"input_file_id":"file-1","endpoint":"/v1/chat/completions","completion_window":"24h"}`)
	key := map[string]string{"Idempotency-Key": "batch-of-monday"}
	a := h.sendRaw("POST", "/v1/batches", "application/json", body, key)
	b := h.sendRaw("POST", "/v1/batches", "application/json", []byte(`{ "completion_window":"24h","endpoint":"/v1/chat/completions","input_file_id":"file-1"}`), key)
	if string(a.body) != `{"id":"batch_1"}` || string(b.body) != string(a.body) || len(rec.seen()) != 1 {
		t.Fatalf("keyed batch: %s then %s with %d upstream calls", a.body, b.body, len(rec.seen()))
	}
	img := []byte(`{"prompt":"a cat"}`)
	key = map[string]string{"Idempotency-Key": "img-1"}
	big := h.sendRaw("POST", "/v1/images/generations", "application/json", img, key)
	if big.status != 200 || len(big.body) < 4096 {
		t.Fatalf("image over the record limit: %d, %d bytes", big.status, len(big.body))
	}
	again := h.sendRaw("POST", "/v1/images/generations", "application/json", img, key)
	if e := wantOpenAIError(t, again, 410); e["code"] != "idempotency_result_not_stored" {
		t.Fatalf("retry of an unstored answer: %v", e)
	}
	if n := len(rec.seen()); n != 2 {
		t.Fatalf("upstream saw %d requests, want 2", n)
	}
}

// TestPassthroughRouting: a body's model picks the upstream that serves it;
// a request without one goes to its route's upstream (passthrough.routes),
// else the first upstream; a model nobody serves is a 404.
func TestPassthroughRouting(t *testing.T) {
	first, second := newRecorder(t, nil), newRecorder(t, nil)
	h := passHarness(t, first, func(c *config.Config) {
		c.Upstreams[0].Models = []string{"gpt-*"}
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "second", BaseURL: second.srv.URL + "/v1",
			Models: []string{"whisper-*", "omni-*"}, Timeout: config.Duration(5 * time.Second)})
		c.Passthrough.Routes = []config.Route{{Prefix: "/v1/files", Upstream: "second"}}
	})
	h.sendRaw("POST", "/v1/moderations", "application/json", []byte(`{"model":"omni-moderation-latest","input":"x"}`), nil)
	h.sendRaw("POST", "/v1/moderations", "application/json", []byte(`{"input":"x"}`), nil)
	ct, b := multipartBody(t, "x1", [][2]string{{"model", "whisper-1"}}, []byte("RIFF"))
	h.sendRaw("POST", "/v1/audio/transcriptions", ct, b, nil)
	h.sendRaw("GET", "/v1/files", "", nil, nil)
	r := h.sendRaw("POST", "/v1/moderations", "application/json", []byte(`{"model":"nobody","input":"x"}`), nil)
	if e := wantOpenAIError(t, r, 404); e["code"] != "model_not_found" {
		t.Fatalf("unknown model: %v", e)
	}
	var got []string
	for _, s := range second.seen() {
		got = append(got, s.path)
	}
	if want := "/v1/moderations /v1/audio/transcriptions /v1/files"; strings.Join(got, " ") != want {
		t.Errorf("second saw %v, want %s", got, want)
	}
	if s := first.seen(); len(s) != 1 || s[0].path != "/v1/moderations" || bytes.Contains(s[0].body, []byte("model")) {
		t.Errorf("first saw %v, want the moderation without a model", s)
	}
}

// A request body sent with a Content-Encoding is a 415 naming it, in the
// route's error shape, with no upstream call: the gateway reads a body as
// sent and does not relay that header, so a gzip JSON body was a
// misleading 400 ("must be a JSON object"), and an encoded upload would
// reach the provider as compressed bytes that no longer said so (noticed
// by the hostile-tenant run). identity is no encoding.
func TestEncodedRequestBodyIs415(t *testing.T) {
	up := &metered{In: 1, Out: 1}
	url := newTestServer(t, up)
	h := newHarness(t, budgeted(url))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(chatBody))
	zw.Close()
	upload, uploadType := batchFileForm()
	for _, tc := range []struct {
		path, body, ctype, encoding string
	}{
		{"/v1/chat/completions", gz.String(), "application/json", "gzip"},
		{"/v1/chat/completions", chatBody, "application/json", "identity, br"},
		{"/v1/batches", `{"input_file_id":"file-1","endpoint":"/v1/chat/completions","completion_window":"24h"}`, "application/json", "deflate"},
		{"/v1/files", upload, uploadType, "GZIP"},
	} {
		r := h.do(http.MethodPost, tc.path, tc.body, map[string]string{"Authorization": "Bearer key-alice", "Content-Type": tc.ctype, "Content-Encoding": tc.encoding})
		if e := wantOpenAIError(t, r, http.StatusUnsupportedMediaType); e["code"] != "unsupported_content_encoding" {
			t.Fatalf("%s %q: %v", tc.path, tc.encoding, e)
		}
	}
	r := h.do(http.MethodPost, "/v1/messages", `{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{"x-api-key": "key-alice", "anthropic-version": "2023-06-01", "Content-Encoding": "br"})
	if r.status != http.StatusUnsupportedMediaType || !strings.HasPrefix(string(r.body), `{"type":"error","error":{"type":"invalid_request_error"`) {
		t.Fatalf("messages: %d %s", r.status, r.body)
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("upstream calls %d, want 0", n)
	}
	if r := h.do(http.MethodPost, "/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer key-alice", "Content-Encoding": "identity"}); r.status != 200 {
		t.Fatalf("identity: %d %s", r.status, r.body)
	}
}
