package e2e

import (
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// TestCrashInjection kills the gateway with SIGKILL at the three awkward
// moments of a keyed request, reached deterministically by failpoints
// compiled into a test build, restarts it on the same data dir, and checks
// the README's promise for each:
//
//	before-upstream: nothing was sent; the retry runs once, then replays.
//	before-commit:   the upstream answered but nothing was committed; the
//	                 retry runs exactly once more, then replays.
//	after-commit:    the retry replays the committed answer, no new call.
func TestCrashInjection(t *testing.T) {
	bin := gatewayBin(t, "failpoints")
	bodies := map[string]string{
		"json":   `{"model":"gpt-4o","messages":[{"role":"user","content":"crash me"}]}`,
		"stream": `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"crash me"}]}`,
	}
	cases := []struct {
		point             string
		callsBeforeCrash  int
		callsAfterRestart int
		firstRetryReplays bool
	}{
		{"before-upstream", 0, 1, false},
		{"before-commit", 1, 2, false},
		{"after-commit", 1, 1, true},
	}
	for _, tc := range cases {
		for kind, body := range bodies {
			t.Run(tc.point+"/"+kind, func(t *testing.T) {
				fake, upURL := newFake(t, fakeprovider.Options{})
				dir := t.TempDir()
				cfg := writeConfig(t, dir, upURL, "")
				hdr := map[string]string{"Idempotency-Key": "crash/" + tc.point + "/" + kind}

				p := start(t, bin, []string{"-config", cfg}, []string{"LLMGATE_FAILPOINTS=" + tc.point})
				req, _ := http.NewRequest(http.MethodPost, p.URL+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Idempotency-Key", hdr["Idempotency-Key"])
				if res, err := httpClient.Do(req); err == nil {
					// A stream's headers may arrive before the crash; its
					// body cannot finish.
					_, rerr := readAll(res)
					if rerr == nil && kind == "json" {
						t.Fatalf("request survived the failpoint: %d", res.StatusCode)
					}
				}
				err := p.wait(10e9)
				if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
					t.Fatalf("gateway did not die by SIGKILL: %v", err)
				}
				if n := fake.Calls(""); n != tc.callsBeforeCrash {
					t.Fatalf("upstream calls before the crash %d, want %d", n, tc.callsBeforeCrash)
				}

				p2 := start(t, bin, []string{"-config", cfg}, nil)
				status, h, first := post(t, p2.URL+"/v1/chat/completions", body, hdr)
				if status != 200 {
					t.Fatalf("retry after restart: %d %s", status, first)
				}
				if replayed := h.Get("Idempotent-Replayed") == "true"; replayed != tc.firstRetryReplays {
					t.Fatalf("first retry replayed=%v, want %v", replayed, tc.firstRetryReplays)
				}
				if n := fake.Calls(""); n != tc.callsAfterRestart {
					t.Fatalf("upstream calls after restart %d, want %d", n, tc.callsAfterRestart)
				}
				status, h, again := post(t, p2.URL+"/v1/chat/completions", body, hdr)
				if status != 200 || h.Get("Idempotent-Replayed") != "true" || string(again) != string(first) {
					t.Fatalf("second retry: %d replayed=%q identical=%v", status, h.Get("Idempotent-Replayed"), string(again) == string(first))
				}
				if n := fake.Calls(""); n != tc.callsAfterRestart {
					t.Fatalf("a replay called the upstream: %d calls", n)
				}
			})
		}
	}
}

func readAll(res *http.Response) ([]byte, error) {
	defer res.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := res.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			if err.Error() == "EOF" {
				return []byte(b.String()), nil
			}
			return []byte(b.String()), err
		}
	}
}
