package gateway

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
)

// keyEchoUpstream answers every request with status and an error body that
// quotes the credential it was sent, as some OpenAI-compatible servers do
// (LiteLLM's proxy: "Received API Key = sk-…").
type keyEchoUpstream struct{ status atomic.Int32 }

func (e *keyEchoUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cred := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if k := r.Header.Get("X-Api-Key"); k != "" {
		cred = k
	}
	body, _ := io.ReadAll(r.Body)
	status := int(e.status.Load())
	switch {
	case status == http.StatusOK && strings.Contains(string(body), `"stream":true`) && strings.HasSuffix(r.URL.Path, "/messages"):
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"usage\":{\"input_tokens\":1,\"output_tokens\":0}}}\n\n"+
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"+
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"+
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"authentication_error\",\"message\":\"bad key %s\"}}\n\n", cred)
	case status == http.StatusOK && strings.Contains(string(body), `"stream":true`):
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n"+
			"data: {\"error\":{\"message\":\"Incorrect API key provided: %s\",\"type\":\"invalid_request_error\",\"code\":\"invalid_api_key\"}}\n\n", cred)
	case status == http.StatusOK:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"your key is %s"},"finish_reason":"stop"}]}`, cred)
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"message":"Invalid request. Received API Key = %s, key=%s.","type":"invalid_request_error"}}`, cred, cred)
	}
}

// TestUpstreamErrorEchoingKeyRedacted: an upstream error body that quotes
// the key the gateway sent it (the upstream's api_key, or a client's own
// upstream_api_keys entry) reaches no client, log, dead letter or stored
// byte: every copy is replaced with [redacted], the rest of the body is
// relayed as it came. The same for a 200 that quotes it, JSON or a
// stream's error event, and for what a keyed one commits.
func TestUpstreamErrorEchoingKeyRedacted(t *testing.T) {
	const ownKey = "sk-alice-own-provider-key-778899"
	echo := &keyEchoUpstream{}
	url := newTestServer(t, echo)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = url + "/v1"
		c.Upstreams[0].Models = []string{"gpt-*"}
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "anthropic", BaseURL: url, APIKey: anthropicKey,
			API: config.APIAnthropic, Models: []string{"claude-*"}, Timeout: config.Duration(5 * time.Second)})
		c.Clients = []config.Client{
			{Name: "alice", Key: aliceKey, UpstreamAPIKeys: map[string]string{"primary": ownKey}},
			{Name: "bob", Key: bobKey},
		}
	})
	secrets := map[string]string{"upstream key": upstreamKey, "anthropic key": anthropicKey, "alice's own key": ownKey}
	var seen strings.Builder
	check := func(name string, r result, status int) {
		t.Helper()
		fmt.Fprintf(&seen, "%d %v %s\n", r.status, r.header, r.body)
		if r.status != status {
			t.Fatalf("%s: status %d, want %d: %s", name, r.status, status, r.body)
		}
	}

	echo.status.Store(http.StatusBadRequest)
	r := h.do(http.MethodPost, "/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer " + bobKey})
	check("shared key, 400", r, http.StatusBadRequest)
	if want := `{"error":{"message":"Invalid request. Received API Key = [redacted], key=[redacted].","type":"invalid_request_error"}}`; string(r.body) != want {
		t.Errorf("400 body = %s, want %s", r.body, want)
	}
	r = h.do(http.MethodPost, "/v1/messages", messagesBody, map[string]string{"Authorization": "Bearer " + bobKey, "Anthropic-Version": "2023-06-01"})
	check("anthropic, 400", r, http.StatusBadRequest)

	echo.status.Store(http.StatusServiceUnavailable)
	r = h.do(http.MethodPost, "/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer " + aliceKey, "Idempotency-Key": "echo-1"})
	if r.status < 500 {
		t.Fatalf("own key, keyed 503: status %d: %s", r.status, r.body)
	}
	fmt.Fprintf(&seen, "%d %v %s\n", r.status, r.header, r.body)
	// A 200 that quotes it: in a JSON body, in a stream's error event
	// (chat's, and Anthropic's after the answer began), keyed or not.
	echo.status.Store(http.StatusOK)
	for _, tc := range []struct{ path, body, client, key string }{
		{"/v1/chat/completions", chatBody, bobKey, ""},
		{"/v1/chat/completions", chatBody, aliceKey, "echo-2"},
		{"/v1/chat/completions", streamBody, bobKey, ""},
		{"/v1/chat/completions", streamBody, aliceKey, "echo-3"},
		{"/v1/messages", strings.Replace(messagesBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1), bobKey, "echo-4"},
	} {
		hdr := map[string]string{"Authorization": "Bearer " + tc.client, "Anthropic-Version": "2023-06-01"}
		if tc.key != "" {
			hdr["Idempotency-Key"] = tc.key
		}
		r := h.do(http.MethodPost, tc.path, tc.body, hdr)
		fmt.Fprintf(&seen, "%d %v %s\n", r.status, r.header, r.body)
		if !strings.Contains(string(r.body), "[redacted]") {
			t.Errorf("%s %s (key %q): no [redacted] in %d %s", tc.path, tc.body, tc.key, r.status, r.body)
		}
		if tc.key != "" { // and its replay, if it was committed
			r := h.do(http.MethodPost, tc.path, tc.body, hdr)
			fmt.Fprintf(&seen, "%d %v %s\n", r.status, r.header, r.body)
		}
	}
	for _, path := range []string{"/admin/deadletters", "/admin/breakers", "/admin/stats"} {
		r := h.admin(http.MethodGet, path)
		check(path, r, http.StatusOK)
	}
	if !strings.Contains(seen.String(), "[redacted]") {
		t.Errorf("no echo came back redacted: %s", seen.String())
	}
	var files strings.Builder
	_ = filepath.WalkDir(h.cfg.DataDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(path)
			files.Write(b)
		}
		return nil
	})
	for name, s := range secrets {
		for where, text := range map[string]string{"logs": h.logs.String(), "answers": seen.String(), "data dir": files.String()} {
			if strings.Contains(text, s) {
				t.Errorf("the %s appears in the %s", name, where)
			}
		}
	}
}

// TestLongPathLoggedShort: a path carrying a long object id (up to the
// 64 KiB header limit) is logged cut to its first 512 bytes and its
// length, an error quoting a long id from the body and a long method are
// cut too, so that one tenant's requests cannot write 64 KiB log lines.
func TestLongPathLoggedShort(t *testing.T) {
	h, _ := ownersHarness(t, nil)
	id := "file-" + strings.Repeat("x", 40<<10)
	h.do(http.MethodGet, "/v1/files/"+id, "", asAlice)
	// An error that quotes an id from the body (the ownership 404 under a
	// shared key), and a long method.
	r := h.do(http.MethodPost, "/v1/responses", `{"model":"gpt-4o-mini","input":"hi","previous_response_id":"resp_`+strings.Repeat("q", 40<<10)+`"}`, asAlice)
	if r.status != http.StatusNotFound {
		t.Fatalf("another's response id: %d, want the ownership 404", r.status)
	}
	h.do(strings.Repeat("M", 40<<10), "/v1/models", "", asAlice)
	// The line is written as the handler returns, after the answer.
	waitFor(t, "the requests' log lines", func() bool { return strings.Count(h.logs.String(), `"msg":"request"`) == 3 })
	var logged string
	for _, line := range strings.Split(h.logs.String(), "\n") {
		var rec struct {
			Path string `json:"path"`
			Msg  string `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && strings.HasPrefix(rec.Path, "/v1/files/file-") {
			logged = rec.Path
		}
		if len(line) > 4<<10 {
			t.Errorf("a log line of %d bytes: %.200s", len(line), line)
		}
	}
	if want := ("/v1/files/" + id)[:512] + fmt.Sprintf("…(%d bytes)", len("/v1/files/"+id)); logged != want {
		t.Fatalf("logged path %.600q, want %.600q", logged, want)
	}
}

// TestUpstreamKeyWithSpacesRedacted: a configured key with surrounding
// whitespace (an environment value with a trailing space) goes out
// trimmed, as net/http sends header values, and its echo is redacted too.
func TestUpstreamKeyWithSpacesRedacted(t *testing.T) {
	const key = "sk-upstream-TRAIL-SECRET-1234567"
	echo := &keyEchoUpstream{}
	echo.status.Store(http.StatusBadRequest)
	url := newTestServer(t, echo)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = url + "/v1"
		c.Upstreams[0].APIKey = key + " "
	})
	r := h.do(http.MethodPost, "/v1/chat/completions", chatBody, nil)
	if r.status != http.StatusBadRequest || strings.Contains(string(r.body), key) || !strings.Contains(string(r.body), "[redacted]") {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

// TestUpstreamKeyAtTheErrorBodyLimitRedacted: an upstream error body is
// read up to 1 MiB; one that quotes the key across that limit (padded
// with text a tenant chose, echoed first) used to be cut first and
// redacted after, so the key's first bytes reached the client.
func TestUpstreamKeyAtTheErrorBodyLimitRedacted(t *testing.T) {
	for _, before := range []int{12, 3, len(upstreamKey) - 1} {
		url := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cred := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			head := `{"error":{"message":"`
			pad := strings.Repeat("p", 1<<20-len(head)-before)
			io.WriteString(w, head+pad+cred+` is not a valid key"}}`)
		}))
		h := newHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = url + "/v1" })
		r := h.do(http.MethodPost, "/v1/chat/completions", chatBody, nil)
		if r.status != http.StatusBadRequest {
			t.Fatalf("%d bytes of the key before the limit: status %d", before, r.status)
		}
		for i := 6; i <= len(upstreamKey); i++ {
			if strings.Contains(string(r.body), upstreamKey[:i]) {
				t.Fatalf("%d bytes of the key before the limit: the client got its first %d bytes (…%s)", before, i, r.body[len(r.body)-60:])
			}
		}
	}
}

// TestUpstreamKeyInHeadersRedacted: an upstream that quotes the key it
// was sent in a header the gateway relays (x-request-id, a rate-limit
// header) has it replaced there too, in the answer, in what a keyed call
// commits and so in its replay (the hostile-tenant run read it back
// from all three).
func TestUpstreamKeyInHeadersRedacted(t *testing.T) {
	url := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cred := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		w.Header().Set("X-Request-Id", "req-"+cred)
		w.Header().Add("X-Ratelimit-Remaining-Requests", "9")
		w.Header().Add("X-Ratelimit-Remaining-Requests", cred)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	}))
	h := newHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = url + "/v1" })
	for _, try := range []string{"answer", "replay"} {
		r := h.do(http.MethodPost, "/v1/chat/completions", chatBody, map[string]string{"Idempotency-Key": "hdr-key-1"})
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", try, r.status, r.body)
		}
		for k, vs := range r.header {
			for _, v := range vs {
				if strings.Contains(v, upstreamKey) {
					t.Errorf("%s: %s: %s", try, k, v)
				}
			}
		}
		if got := r.header.Get("X-Request-Id"); got != "req-[redacted]" {
			t.Errorf("%s: X-Request-Id %q, want req-[redacted]", try, got)
		}
		if got := r.header.Values("X-Ratelimit-Remaining-Requests"); len(got) != 2 || got[0] != "9" {
			t.Errorf("%s: X-Ratelimit-Remaining-Requests %q, want 9 and [redacted]", try, got)
		}
	}
}

// TestUpstreamKeyInRelayedBodyRedacted: a body the gateway relays as it
// comes, unbuffered (a file's content) or past its buffered prefix (an
// answer over idempotency.max_record_bytes), has every copy of the key
// replaced as well, a copy split across the upstream's writes or across
// the prefix's end too (the hostile-tenant run read the key back from a
// file's content).
func TestUpstreamKeyInRelayedBodyRedacted(t *testing.T) {
	url := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cred := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		fl := w.(http.Flusher)
		if strings.HasSuffix(r.URL.Path, "/content") {
			w.Header().Set("Content-Type", "application/octet-stream")
			io.WriteString(w, "line one "+cred[:5])
			fl.Flush()
			io.WriteString(w, cred[5:]+" line two "+cred+"\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		// The first copy straddles the end of the 3,001 bytes buffered.
		head := `{"id":"c1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"`
		pad := strings.Repeat("p", 3001-len(head)-10)
		io.WriteString(w, head+pad+cred+" and "+cred+`"},"finish_reason":"stop"}]}`)
	}))
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = url + "/v1"
		c.Idempotency.MaxRecordBytes = 3000
	})
	r := h.do(http.MethodGet, "/v1/files/file-abc/content", "", nil)
	if r.status != http.StatusOK || string(r.body) != "line one [redacted] line two [redacted]\n" {
		t.Fatalf("file content: %d %q", r.status, r.body)
	}
	r = h.do(http.MethodPost, "/v1/chat/completions", chatBody, nil)
	if r.status != http.StatusOK || strings.Contains(string(r.body), upstreamKey[:8]) || strings.Count(string(r.body), "[redacted]") != 2 {
		t.Fatalf("an answer over the record limit: %d …%s", r.status, r.body[max(0, len(r.body)-200):])
	}
}

// TestUpstreamKeyJSONEscapedRedacted: an upstream that quotes the key
// JSON-escaped (PHP writes "/" as `\/`, Go "<" as `\u003c`, .NET "+" as
// `\u002B`) has that copy replaced too: in a 400 relayed as it came, and
// in a 503 whose message the gateway decodes into its own
// upstream_retries_exhausted error (which put the key there in plain
// text, and in the log line). So does an error body that writes every
// character of a key of letters, digits and "-" as \u00XX, which no
// search of its bytes finds but which decodes to the key (found by the
// hostile-tenant run): in the message, in another member (code), in the
// log line.
func TestUpstreamKeyJSONEscapedRedacted(t *testing.T) {
	allEscaped := func(key string) string {
		var b strings.Builder
		for _, c := range key {
			fmt.Fprintf(&b, `\u%04x`, c)
		}
		return b.String()
	}
	for _, c := range []struct{ key, escaped, secret string }{
		{"sk/upstream+SECRET<x>==", `sk\/upstream\u002BSECRET\u003cx\u003e==`, "SECRET"},
		{"sk-shared-UPSTREAM-secret-0123456789", allEscaped("sk-shared-UPSTREAM-secret-0123456789"), "UPSTREAM-secret"},
	} {
		for _, status := range []int{http.StatusBadRequest, http.StatusServiceUnavailable} {
			url := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "); got != c.key {
					t.Errorf("upstream got key %q", got)
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				io.WriteString(w, `{"error":{"message":"Invalid key `+c.escaped+`","type":"invalid_request_error","code":"`+c.escaped+`"}}`)
			}))
			h := newHarness(t, func(cfg *config.Config) {
				cfg.Upstreams[0].BaseURL = url + "/v1"
				cfg.Upstreams[0].APIKey = c.key
				cfg.Retry.MaxAttempts = 2
			})
			r := h.do(http.MethodPost, "/v1/chat/completions", chatBody, nil)
			if r.status != status {
				t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
			}
			var decoded struct {
				Error struct{ Message, Code string } `json:"error"`
			}
			if err := json.Unmarshal(r.body, &decoded); err != nil {
				t.Fatalf("%s: %v", r.body, err)
			}
			for what, s := range map[string]string{"body": string(r.body), "message": decoded.Error.Message, "code": decoded.Error.Code, "log": h.logs.String()} {
				if strings.Contains(s, c.escaped) || strings.Contains(s, c.key) || strings.Contains(s, c.secret) {
					t.Errorf("%s, %d: the key in the %s: %s", c.key, status, what, s)
				}
			}
			if !strings.Contains(decoded.Error.Message, "Invalid key [redacted]") {
				t.Errorf("%s, %d: message %q", c.key, status, decoded.Error.Message)
			}
		}
	}
}

// TestUpstreamContentEncodings: the transport asks for gzip and decodes a
// body labelled "gzip"; one labelled "x-gzip" (the same, RFC 9110) is
// decoded too, so it reaches the client readable, with the key it quotes
// redacted. One in an encoding the gateway did not ask for (br) is no
// answer: 502 upstream_bad_response, never its bytes. Before, both were
// relayed compressed without their Content-Encoding: undecodable, and the
// key inside past redaction (found by the hostile-tenant run).
func TestUpstreamContentEncodings(t *testing.T) {
	// An error status in an encoding not asked for keeps its status (its
	// body dropped): not retried, not a 502.
	url := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "br")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte{0x1b, 0x2f, 0x00, 0xf8})
	}))
	h := newHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = url + "/v1" })
	if r := h.do(http.MethodPost, "/v1/chat/completions", chatBody, nil); r.status != http.StatusNotFound || bytes.Contains(r.body, []byte{0x1b, 0x2f}) {
		t.Fatalf("a br 404: %d %q", r.status, r.body)
	}
	for _, enc := range []string{"x-gzip", "br"} {
		url := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cred := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			var buf bytes.Buffer
			zw := gzip.NewWriter(&buf)
			fmt.Fprintf(zw, `{"id":"c1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"your key is %s"},"finish_reason":"stop"}]}`, cred)
			zw.Close()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", enc)
			w.Write(buf.Bytes())
		}))
		h := newHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = url + "/v1" })
		r := h.do(http.MethodPost, "/v1/chat/completions", chatBody, nil)
		if strings.Contains(string(r.body), upstreamKey) || r.header.Get("Content-Encoding") != "" {
			t.Fatalf("%s: the key, or an encoding, reached the client: %v %s", enc, r.header, r.body)
		}
		switch enc {
		case "x-gzip":
			if r.status != http.StatusOK || !strings.Contains(string(r.body), `"content":"your key is [redacted]"`) {
				t.Fatalf("x-gzip: %d %s", r.status, r.body)
			}
		default:
			if e := wantOpenAIError(t, r, http.StatusBadGateway); e["code"] != "upstream_bad_response" {
				t.Fatalf("%s: %v", enc, e)
			}
		}
	}
}
