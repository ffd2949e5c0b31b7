// Command gateway runs llmgate: an OpenAI-compatible gateway that retries
// what is worth retrying, stops calling a provider that is down, and
// commits every keyed completion so a retry replays it.
//
//	gateway [-config FILE] [-addr HOST:PORT] [-check-config] [-demo]
//
// The listen address is -addr if given, else GATEWAY_ADDR, else the
// file's listen, else 127.0.0.1:8080.
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
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}
