package classify

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

// The fuzz tests run their seeds under plain `go test`; explore with e.g.
// `go test -fuzz=FuzzFromResponse ./classify`.

var knownClasses = map[Class]bool{
	Success: true, Transient: true, RateLimited: true, ServerError: true, Quota: true,
	ClientError: true, Auth: true, Unauthorized: true, ContentFilter: true, Empty: true, Canceled: true,
}

func checkOutcome(t *testing.T, o Outcome) {
	t.Helper()
	if !knownClasses[o.Class] {
		t.Fatalf("unknown class %q", o.Class)
	}
	if o.Reason == "" {
		t.Fatalf("empty reason: %+v", o)
	}
	if o.RetryAfter < 0 || o.RetryAfter > MaxRetryAfter {
		t.Fatalf("RetryAfter out of range: %+v", o)
	}
	if !o.HasRetryAfter && o.RetryAfter != 0 {
		t.Fatalf("RetryAfter without HasRetryAfter: %+v", o)
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	f.Add("30", "", "", "", int64(0))
	f.Add("1.5", "", "", "", int64(0))
	f.Add("Fri, 14 Mar 2025 15:10:56 GMT", "", "", "", now.Unix())
	f.Add("Thu, 01 Jan 1970 00:00:00 GMT", "", "", "", now.Unix())
	f.Add("Friday, 14-Mar-25 15:10:56 GMT", "", "", "", now.Unix())
	f.Add("", "1500", "", "", int64(0))
	f.Add("", "", "1s", "6m0s", int64(0))
	f.Add("", "", "20ms", "1m30.5s", int64(0))
	f.Add("", "", "-1s", "0.5s", int64(0))
	f.Add("-5", "-1", "9999999999h", "2562047h47m16.854775807s", int64(-1))
	f.Add("99999999999999999999999999999", "1e309", "NaN", "Inf", int64(1<<62))
	f.Add(" \t", "0x1p3", "1_000", "1..2", int64(0))
	f.Fuzz(func(t *testing.T, retryAfter, ms, reqs, toks string, unix int64) {
		h := http.Header{}
		for k, v := range map[string]string{
			"Retry-After": retryAfter, "Retry-After-Ms": ms,
			"X-Ratelimit-Reset-Requests": reqs, "X-Ratelimit-Reset-Tokens": toks,
		} {
			if v != "" {
				h.Set(k, v)
			}
		}
		d, ok := ParseRetryAfter(h, time.Unix(unix, 0))
		if d < 0 || d > MaxRetryAfter {
			t.Fatalf("ParseRetryAfter = %v, out of [0, 24h]", d)
		}
		if !ok && d != 0 {
			t.Fatalf("ParseRetryAfter = %v, false", d)
		}
	})
}

func FuzzFromResponse(f *testing.F) {
	f.Add(429, "20", []byte(`{"error":{"message":"x","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`))
	f.Add(429, "", []byte(`{"error":{"type":"tokens","code":"rate_limit_exceeded"}}`))
	f.Add(400, "", []byte(`{"error":{"code":"content_filter","innererror":{"code":"ResponsibleAIPolicyViolation"}}}`))
	f.Add(503, "Fri, 14 Mar 2025 15:10:56 GMT", []byte(`<html>503</html>`))
	f.Add(529, "", []byte(`{"type":"error","error":{"type":"overloaded_error"}}`))
	f.Add(0, "", []byte(`{"error":{"code":503}}`))
	f.Add(0, "", []byte(`{"error":{"code":-1e999}}`))
	f.Add(429, "", []byte(`{"error":{"code":"insufficient_quota","type":`))
	f.Add(400, "", []byte(`[{"error":{"code":400,"status":"INVALID_ARGUMENT"}}]`))
	f.Add(500, "", []byte(`{"error":"string","type":5,"code":{"a":[1,2]}}`))
	f.Add(-1, "-1", []byte(`{"error":{"code":"\ud800"}}`))
	f.Add(200, "1", []byte(`garbage`))
	f.Add(429, "", []byte(`{"type":"error","error":{"type":"rate_limit_error","details":{"error_code":"enforced_spend_limit_reached"}}}`))
	f.Add(429, "", []byte(`{"error":{"code":429,"details":[{"error_code":"x"}],"status":"RESOURCE_EXHAUSTED"}}`))
	f.Fuzz(func(t *testing.T, status int, retryAfter string, body []byte) {
		h := http.Header{"Retry-After": {retryAfter}, "X-Ratelimit-Reset-Tokens": {retryAfter}}
		o := FromResponse(status, h, body, now)
		checkOutcome(t, o)
		if status >= 200 && status < 300 && o.Class != Success {
			t.Fatalf("FromResponse(%d) = %+v, want success", status, o)
		}
		if o.Class == Canceled || o.Class == Empty {
			t.Fatalf("FromResponse(%d) = %+v", status, o)
		}
		if status != 0 && o.Status != status {
			t.Fatalf("Status = %d, want %d", o.Status, status)
		}
	})
}

func FuzzFromCompletion(f *testing.F) {
	f.Add([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}]}`))
	f.Add([]byte(`{"choices":[{"message":{"content":null,"tool_calls":[{"id":"c"}]}}]}`))
	f.Add([]byte(`{"choices":[{"message":{"content":null},"finish_reason":"content_filter"}]}`))
	f.Add([]byte(`{"choices":[{"text":"","finish_reason":"length"}]}`))
	f.Add([]byte(`{"choices":[]}`))
	f.Add([]byte(`{"choices":[{"message":{"content":"Hel`))
	f.Add([]byte(`{"error":{"type":"server_error"}}`))
	f.Add([]byte(`{"choices":null,"error":null}`))
	f.Add([]byte(`{"choices":{"0":1},"error":[]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, body []byte) {
		o := FromCompletion(body)
		checkOutcome(t, o)
		if o.HasRetryAfter || o.Timeout || o.Class == Canceled || o.Class == Success && !json.Valid(body) {
			t.Fatalf("FromCompletion = %+v", o)
		}
		// The walker must agree with encoding/json on what is valid JSON.
		malformed := o.Reason == "malformed completion body"
		object := json.Valid(body) && bytes.TrimSpace(body)[0] == '{'
		if malformed == object {
			t.Fatalf("valid object: %v, but classified %+v", object, o)
		}
	})
}

func FuzzStreamObserver(f *testing.F) {
	f.Add([]byte("{\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n{\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n[DONE]"))
	f.Add([]byte("{\"choices\":[{\"delta\":{},\"finish_reason\":\"content_filter\"}]}\n[DONE]"))
	f.Add([]byte("{\"choices\":[{\"text\":\"x\"}]}\n{\"error\":{\"code\":\"insufficient_quota\"}}"))
	f.Add([]byte("{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}},{\"delta\":{}}]}\n{\"choices\":[]}"))
	f.Add([]byte("{\"choi\n[DONE]\n\n"))
	f.Fuzz(func(t *testing.T, events []byte) {
		var o StreamObserver
		done := false
		for e := range bytes.SplitSeq(events, []byte("\n")) {
			o.Observe(e)
			done = done || string(bytes.TrimSpace(e)) == "[DONE]"
		}
		out := o.Outcome()
		checkOutcome(t, out)
		if o.SawDone() != done {
			t.Fatalf("SawDone() = %v, want %v", o.SawDone(), done)
		}
		if out.Class == Canceled || out.HasRetryAfter {
			t.Fatalf("Outcome() = %+v", out)
		}
		if again := o.Outcome(); again != out {
			t.Fatalf("Outcome() changed: %+v then %+v", out, again)
		}
	})
}
