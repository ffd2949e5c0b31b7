package classify

import (
	"net/http"
	"strings"
	"testing"
)

// benchCompletion is a typical 1 KiB chat completion.
var benchCompletion = []byte(`{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion","created":1741569952,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"` +
	strings.Repeat("The quick brown fox jumps over the lazy dog. ", 14) +
	`","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_fc9f1d7035"}`)

func BenchmarkFromCompletion(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchCompletion)))
	for b.Loop() {
		if o := FromCompletion(benchCompletion); o.Class != Success {
			b.Fatal(o)
		}
	}
}

func BenchmarkFromResponse(b *testing.B) {
	h := http.Header{
		"Retry-After":                {"20"},
		"X-Ratelimit-Reset-Requests": {"1s"},
		"X-Ratelimit-Reset-Tokens":   {"6m0s"},
		"Content-Type":               {"application/json"},
	}
	cases := []struct {
		name   string
		status int
		body   string
		want   Class
	}{
		{"429 quota", 429, `{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`, Quota},
		{"429 rate limit", 429, `{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`, RateLimited},
		{"503 html", 503, `<html><head><title>503 Service Temporarily Unavailable</title></head></html>`, Transient},
		{"200", 200, ``, Success},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			body := []byte(c.body)
			b.ReportAllocs()
			for b.Loop() {
				if o := FromResponse(c.status, h, body, now); o.Class != c.want {
					b.Fatal(o)
				}
			}
		})
	}
}

func BenchmarkStreamObserver(b *testing.B) {
	chunk := []byte(`{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_fc9f1d7035","choices":[{"index":0,"delta":{"content":" brown"},"logprobs":null,"finish_reason":null}]}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(chunk)))
	var o StreamObserver
	for b.Loop() {
		o.Observe(chunk)
	}
	if o.Outcome().Class != Success {
		b.Fatal(o.Outcome())
	}
}

func BenchmarkParseRetryAfter(b *testing.B) {
	h := http.Header{"X-Ratelimit-Reset-Requests": {"20ms"}, "X-Ratelimit-Reset-Tokens": {"1m30.5s"}}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := ParseRetryAfter(h, now); !ok {
			b.Fatal("no retry-after")
		}
	}
}
