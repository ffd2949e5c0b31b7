package headers

import (
	"net/http"
	"testing"
)

func TestResponseAllowList(t *testing.T) {
	in := http.Header{}
	for _, k := range []string{
		"Content-Type", "Content-Disposition", "X-Request-Id", "Openai-Processing-Ms", "Retry-After",
		"X-Ratelimit-Remaining-Tokens", "Anthropic-Ratelimit-Requests-Remaining", "X-Custom-Drop",
		"Idempotent-Replayed", "X-Llmgate-Upstream", "X-Should-Retry", "Access-Control-Allow-Origin",
		"Set-Cookie", "Openai-Organization", "Openai-Project", "Transfer-Encoding", "Content-Length",
	} {
		in.Set(k, "v")
	}
	in.Set("Connection", "close, X-Request-Id")
	out := Response(in)
	want := map[string]bool{"Content-Type": true, "Content-Disposition": true, "Openai-Processing-Ms": true,
		"Retry-After": true, "X-Ratelimit-Remaining-Tokens": true, "Anthropic-Ratelimit-Requests-Remaining": true}
	for k := range out {
		if !want[k] {
			t.Errorf("%s passed", k)
		}
	}
	for k := range want {
		if out.Get(k) == "" {
			t.Errorf("%s dropped", k)
		}
	}
}

func TestRequestAllowList(t *testing.T) {
	in := http.Header{}
	for _, k := range []string{"Content-Type", "Authorization", "X-Api-Key", "Idempotency-Key", "Openai-Organization", "X-Stainless-Lang",
		"Anthropic-Version", "Anthropic-Beta", "Cookie", "Host", "X-Claude-Code-Session-Id"} {
		in.Set(k, "v")
	}
	in["Anthropic-Beta"] = []string{"interleaved-thinking-2025-05-14", "fine-grained-tool-streaming-2025-05-14"}
	for _, account := range []bool{false, true} {
		out := http.Header{}
		CopyRequest(out, in, Allow{Account: account, Anthropic: true})
		for _, k := range []string{"Authorization", "X-Api-Key", "Idempotency-Key", "Cookie", "Host"} {
			if out.Get(k) != "" {
				t.Errorf("%s forwarded", k)
			}
		}
		if out.Get("Content-Type") == "" || out.Get("X-Stainless-Lang") == "" || out.Get("Anthropic-Version") != "v" ||
			out.Get("X-Claude-Code-Session-Id") != "v" {
			t.Errorf("allowed header dropped: %v", out)
		}
		if got := out.Values("Anthropic-Beta"); len(got) != 2 || got[1] != "fine-grained-tool-streaming-2025-05-14" {
			t.Errorf("Anthropic-Beta = %q, want both values as sent", got)
		}
		if (out.Get("Openai-Organization") != "") != account {
			t.Errorf("account=%v: Openai-Organization %q", account, out.Get("Openai-Organization"))
		}
	}
	out := http.Header{}
	CopyRequest(out, in, Allow{})
	if out.Get("Anthropic-Version") != "" || out.Get("Anthropic-Beta") != "" || out.Get("Content-Type") == "" {
		t.Errorf("to an OpenAI upstream: %v", out)
	}
}
