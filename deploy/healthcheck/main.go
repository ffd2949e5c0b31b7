// Command healthcheck is the container image's health probe. The final
// image is distroless: it has no shell, curl or wget, so Docker's
// HEALTHCHECK runs this instead. It GETs one URL (by default the gateway's
// /healthz on loopback) and exits 0 on a 2xx answer, 1 on anything else
// within a 2s timeout, 2 on bad usage.
//
//	healthcheck [URL]
//
// Kubernetes does not need it: its probes are httpGet, made by the kubelet.
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// defaultURL is the gateway's liveness endpoint on the port it listens on
// in deploy/gateway.yaml (deploy_test.go checks the two agree).
const defaultURL = "http://127.0.0.1:8080/healthz"

// timeout bounds the whole check; Docker's own --timeout is a backstop.
const timeout = 2 * time.Second

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

// run is the whole program, returning the exit code.
func run(args []string, stderr io.Writer) int {
	url := defaultURL
	switch len(args) {
	case 0:
	case 1:
		url = args[0]
	default:
		fmt.Fprintln(stderr, "usage: healthcheck [URL]")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := check(ctx, url); err != nil {
		fmt.Fprintln(stderr, "healthcheck:", err)
		return 1
	}
	return 0
}

// check GETs url and reports an error unless the answer is 2xx. No proxy
// is used: the target is the gateway in the same container.
func check(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return err // names the URL
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
