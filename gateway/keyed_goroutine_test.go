package gateway

import (
	"bytes"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// TestKeyedCallGoroutine: a keyed call whose client sent no
// X-Llmgate-Deadline runs on its handler's goroutine — the handler waits
// for it whatever happens, and a second goroutine cost every keyed request
// a hand-off there and back (issue 26) —; one with a deadline runs on a
// goroutine of its own, which the handler can leave when the deadline
// passes. Read from the goroutine that is in the upstream call while the
// fake upstream answers it.
func TestKeyedCallGoroutine(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	h, _ := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, keyedCallStack())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"c","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`))
	}, nil)
	for _, c := range []struct {
		name, deadline string
		onHandler      bool
	}{
		{"no deadline", "", true},
		{"deadline", "30s", false},
	} {
		hdr := key("goroutine-" + c.name)
		if c.deadline != "" {
			hdr["X-Llmgate-Deadline"] = c.deadline
		}
		if r := h.chat(chatBody, hdr); r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", c.name, r.status, r.body)
		}
		mu.Lock()
		stack := seen[len(seen)-1]
		mu.Unlock()
		switch {
		case stack == "":
			t.Fatalf("%s: no goroutine was running a keyed call during its upstream call", c.name)
		case c.onHandler && !strings.Contains(stack, "net/http.(*conn).serve"):
			t.Errorf("%s: the keyed call did not run on its handler's goroutine:\n%s", c.name, stack)
		case !c.onHandler && !strings.Contains(stack, "(*callers).serve"):
			t.Errorf("%s: the keyed call did not run on a goroutine of its own:\n%s", c.name, stack)
		}
	}
}

// keyedCallStack is the stack of the goroutine running a keyed call, or
// "" when none is.
func keyedCallStack() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf)) // cut short: every goroutine's, or none
	}
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("(*keyedCall).run")) {
			return string(g)
		}
	}
	return ""
}
