package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Provider behaviours, drawn per attempt from the plan.
const (
	BehaveAnswer    = "answer"    // a whole answer
	BehaveTransient = "transient" // a 500 or 503 the gateway retries
	BehaveCut       = "cut"       // the connection drops partway through the answer
	BehaveHang      = "hang"      // no answer until the gateway gives up
	BehaveRefuse    = "refuse"    // the connection is closed before any answer
)

// ProviderRates are the chances of each behaviour but answering.
type ProviderRates struct {
	Transient, Cut, Hang, Refuse float64
}

// provider is an OpenAI-compatible chat upstream whose every attempt does
// what the plan says, and whose every answer names its run
// ("chatcmpl-sim-<run>") so the checker can tell which attempt produced
// what a client saw and what the store holds.
type provider struct {
	plan   plan
	rates  ProviderRates
	hist   *History
	bigN   int // content chunks of a "big" answer: over the record limits
	mu     sync.Mutex
	tries  map[string]int
	counts map[string]int
}

func newProvider(p plan, rates ProviderRates, h *History, bigN int) *provider {
	return &provider{plan: p, rates: rates, hist: h, bigN: bigN, tries: map[string]int{}, counts: map[string]int{}}
}

// simRequest is what the provider reads of a request.
type simRequest struct {
	Stream   bool `json:"stream"`
	Messages []struct {
		Content string `json:"content"`
	} `json:"messages"`
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req simRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
		http.Error(w, `{"error":{"message":"bad request","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	var key string
	var variant, big int
	fmt.Sscanf(req.Messages[0].Content, "key=%s variant=%d big=%d", &key, &variant, &big)
	p.mu.Lock()
	p.tries[key]++
	n := p.tries[key]
	p.mu.Unlock()
	rt := p.rates
	b := p.plan.choose("provider", key, n,
		[]string{BehaveTransient, BehaveCut, BehaveHang, BehaveRefuse, BehaveAnswer},
		[]float64{rt.Transient, rt.Cut, rt.Hang, rt.Refuse, 1 - rt.Transient - rt.Cut - rt.Hang - rt.Refuse})
	run := &Run{Key: key, Attempt: n, Behavior: b, Start: p.hist.since(), Via: via(r.URL.Path)}
	p.hist.addRun(run)
	p.mu.Lock()
	p.counts[b]++
	p.mu.Unlock()
	chunks := 3 + p.plan.intn("chunks", key, n, 5)
	if big == 1 {
		chunks = p.bigN
	}
	a := answer{run: run.ID, key: key, variant: variant, chunks: chunks}
	switch b {
	case BehaveTransient:
		code := []int{http.StatusInternalServerError, http.StatusServiceUnavailable}[n%2]
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(`{"error":{"message":"simulated overload","type":"server_error"}}`))
		p.hist.finishRun(run, false, nil)
	case BehaveHang:
		t := time.NewTimer(30 * time.Second)
		defer t.Stop()
		select {
		case <-r.Context().Done():
		case <-t.C:
		}
		p.hist.finishRun(run, false, nil)
	case BehaveRefuse:
		p.hist.finishRun(run, false, nil)
		panic(http.ErrAbortHandler)
	default:
		cutAt := -1
		if b == BehaveCut {
			cutAt = p.plan.intn("cutAt", key, n, chunks+3)
		}
		delay := time.Duration(p.plan.intn("delay", key, n, 4)) * time.Millisecond
		var out []byte
		if req.Stream {
			out = a.stream(w, cutAt, delay)
		} else {
			out = a.json(w, cutAt, delay)
		}
		if cutAt >= 0 {
			p.hist.finishRun(run, false, nil)
			panic(http.ErrAbortHandler)
		}
		p.hist.finishRun(run, true, out)
	}
}

// via is the first segment of path unless it is the API's own ("v1").
func via(path string) string {
	seg, _, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if seg == "v1" {
		return ""
	}
	return seg
}

// answer is one run's deterministic answer.
type answer struct {
	run     int
	key     string
	variant int
	chunks  int
}

const created = 1700000000

func (a answer) id() string { return fmt.Sprintf("chatcmpl-sim-%d", a.run) }

func (a answer) part(i int) string {
	return fmt.Sprintf("%s/v%d run %d part %d. ", a.key, a.variant, a.run, i)
}

// stream writes the answer as SSE, dropping the connection before event
// cutAt (never, when cutAt < 0). It returns the bytes written.
func (a answer) stream(w http.ResponseWriter, cutAt int, delay time.Duration) []byte {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	chunk := func(delta, finish string) string {
		fin := "null"
		if finish != "" {
			fin = `"` + finish + `"`
		}
		return fmt.Sprintf(`{"id":%q,"object":"chat.completion.chunk","created":%d,"model":"sim","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`,
			a.id(), created, delta, fin)
	}
	events := []string{chunk(`{"role":"assistant","content":""}`, "")}
	for i := 0; i < a.chunks; i++ {
		c, _ := json.Marshal(a.part(i))
		events = append(events, chunk(`{"content":`+string(c)+`}`, ""))
	}
	events = append(events, chunk(`{}`, "stop"),
		fmt.Sprintf(`{"id":%q,"object":"chat.completion.chunk","created":%d,"model":"sim","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d,"total_tokens":%d}}`,
			a.id(), created, a.chunks, a.chunks+7),
		"[DONE]")
	var out bytes.Buffer
	for i, e := range events {
		if i == cutAt {
			if f != nil {
				f.Flush()
			}
			return out.Bytes()
		}
		ev := "data: " + e + "\n\n"
		out.WriteString(ev)
		_, _ = w.Write([]byte(ev))
		if f != nil && i%2 == 0 {
			f.Flush()
			if delay > 0 {
				time.Sleep(delay) // the model's pace
			}
		}
	}
	return out.Bytes()
}

// json writes the answer as one JSON body, dropping the connection
// partway through when cutAt >= 0.
func (a answer) json(w http.ResponseWriter, cutAt int, delay time.Duration) []byte {
	var parts []string
	for i := 0; i < a.chunks; i++ {
		parts = append(parts, a.part(i))
	}
	content, _ := json.Marshal(strings.Join(parts, ""))
	body := []byte(fmt.Sprintf(`{"id":%q,"object":"chat.completion","created":%d,"model":"sim","choices":[{"index":0,"message":{"role":"assistant","content":%s},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":%d,"total_tokens":%d}}`,
		a.id(), created, content, a.chunks, a.chunks+7))
	if delay > 0 {
		time.Sleep(delay) // the model's latency
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if cutAt >= 0 {
		_, _ = w.Write(body[:len(body)*cutAt/(a.chunks+3)])
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		return nil
	}
	_, _ = w.Write(body)
	return body
}

func itoa(n int) string { return fmt.Sprint(n) }
