// Command load measures llmgate against the honest floor — one extra
// loopback hop through a bare net/http/httputil.ReverseProxy — in the same
// run, against the same fake upstream:
//
//	go run ./e2e/load -out /tmp/llmgate-load
//
// (from the repository root; about 2½ minutes with the defaults). It prints
// a Markdown table and a targets section on stdout, and with -out writes
// results.md, results.json and chart.svg there. `go run ./e2e/load -quick`
// is the same run in a few seconds, for checking the tool itself (its
// numbers mean nothing); `go test ./e2e/load/` runs exactly that.
//
// The fake upstream (e2e/fakeprovider), the floor proxy and the gateway are
// separate processes, as in production: the tool re-executes itself with a
// hidden -serve-fake or -serve-floor mode for the first two, and builds
// cmd/gateway (unless -gateway names a binary) for the third. Everything
// listens on 127.0.0.1 and nothing else is ever dialled.
//
// Legs, each closed-loop at every -c concurrency for -duration after a
// -warmup: direct to the fake, through the floor, through llmgate unkeyed,
// with a fresh Idempotency-Key per request, replaying one committed key;
// then streams (time to first byte and to last byte) direct, floor,
// llmgate unkeyed and keyed. Each of these runs on /v1/chat/completions
// and then, next to it, on Anthropic's /v1/messages (an api: anthropic
// upstream on the same fake, answering the same content in the same
// chunks), and results.md sets each messages leg beside its chat twin
// (-apis chat or -apis messages runs one API; -only '^c=' runs only the
// closed-loop legs). Then an open-loop leg per path (requests fired
// on schedule at -rate for -open-duration, whatever completes) against a
// fake that waits -slow before answering, which holds rate×slow calls in
// flight; then the same at -target-rate (500/s: 500 in flight) through
// the floor, llmgate and llmgate with a fresh Idempotency-Key per
// request, whose added latency (a percentile less the upstream's wait)
// the targets set against the floor's. Then, with -big, one ~50 MiB stream per path, for the gateway's
// peak memory growth. -rounds N runs the closed-loop legs, then the
// open-loop ones, N times over and pools each leg's rounds (rounds.go).
// Throughout, the floor's and the gateway's RSS, peak
// RSS, threads and CPU time are read from /proc.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}
