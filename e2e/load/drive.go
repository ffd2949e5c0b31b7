package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The models the gateway routes to each fake (see gatewayConfig).
// modelMessages is served on /v1/messages by an api: anthropic upstream
// on the ordinary fake, whose Messages answers carry the same content, in
// the same chunks, as its chat answers.
const (
	modelFast     = "gpt-4o-mini"
	modelSlow     = "slow-gpt"
	modelBig      = "big-gpt"
	modelMessages = "claude-load"
)

// The APIs a closed-loop leg may call (Leg.API).
const (
	apiChat     = "chat"     // POST /v1/chat/completions
	apiMessages = "messages" // POST /v1/messages
)

func chatBody(model string, stream bool) []byte {
	s := ""
	if stream {
		s = `,"stream":true`
	}
	return []byte(`{"model":"` + model + `","messages":[{"role":"user","content":"Hello"}]` + s + `}`)
}

// messagesBody is chatBody's Messages twin: the same prompt, and the
// max_tokens the API requires.
func messagesBody(stream bool) []byte {
	s := ""
	if stream {
		s = `,"stream":true`
	}
	return []byte(`{"model":"` + modelMessages + `","max_tokens":1024,"messages":[{"role":"user","content":"Hello"}]` + s + `}`)
}

// How a whole stream ends: a chat stream with data: [DONE], a Messages
// stream with its message_stop event (the last bytes of
// `data: {"type":"message_stop"}`).
var (
	chatStreamEnd     = []byte("data: [DONE]")
	messagesStreamEnd = []byte(`message_stop"}`)
)

// keyMode says what Idempotency-Key a leg's requests carry.
type keyMode string

const (
	noKey    keyMode = "none"
	freshKey keyMode = "fresh"
	replay   keyMode = "replay"
)

// shot is one kind of request: where it goes and what it carries.
type shot struct {
	url    string // full URL of /v1/chat/completions or /v1/messages
	body   []byte
	stream bool
	// streamEnd is what a whole stream ends with; if nil, chatStreamEnd.
	streamEnd []byte
	keys      keyMode
	key       string // the replayed key, or the prefix of fresh ones
	// auth is the gateway client key it sends; if "", loadClientKey. The
	// fakes and floors ignore it.
	auth string
}

// The gateway's client keys (gatewayConfig): the legs' own client, and
// the budgeted one of the budgeted legs.
const (
	loadClientKey     = "sk-gw-load"
	budgetedClientKey = "sk-gw-load-budgeted"
)

// sample is one request's outcome.
type sample struct {
	lat  time.Duration // send to last byte
	ttfb time.Duration // send to first body byte
	n    int64         // body bytes received
	err  error
}

// do sends one request and reads the whole answer. seq numbers it, for a
// fresh key.
func (s *shot) do(ctx context.Context, c *http.Client, seq string, buf []byte) sample {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(s.body))
	if err != nil {
		return sample{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	auth := s.auth
	if auth == "" {
		auth = loadClientKey
	}
	req.Header.Set("Authorization", "Bearer "+auth)
	switch s.keys {
	case freshKey:
		req.Header.Set("Idempotency-Key", s.key+seq)
	case replay:
		req.Header.Set("Idempotency-Key", s.key)
	}
	start := time.Now()
	res, err := c.Do(req)
	if err != nil {
		return sample{err: err}
	}
	defer res.Body.Close()
	var smp sample
	var total int64
	// last keeps the answer's last bytes, to check that it ended. The loop
	// ends at EOF; its bound is a formality.
	last := make([]byte, 0, 32)
	for range 1 << 30 {
		n, rerr := res.Body.Read(buf)
		if n > 0 {
			if total == 0 {
				smp.ttfb = time.Since(start)
			}
			total += int64(n)
			last = append(last, buf[max(0, n-16):n]...)
			if len(last) > 16 {
				last = append(last[:0], last[len(last)-16:]...)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			smp.err = fmt.Errorf("read body: %w", rerr)
			return smp
		}
	}
	smp.lat = time.Since(start)
	smp.n = total
	end := bytes.TrimSpace(last)
	streamEnd := s.streamEnd
	if streamEnd == nil {
		streamEnd = chatStreamEnd
	}
	switch {
	case res.StatusCode != http.StatusOK:
		smp.err = fmt.Errorf("status %d: %s", res.StatusCode, end)
	case s.stream && !bytes.HasSuffix(end, streamEnd):
		smp.err = fmt.Errorf("stream did not end with %s (%d bytes, ends %q)", streamEnd, total, end)
	case !s.stream && !bytes.HasSuffix(end, []byte("}")):
		smp.err = fmt.Errorf("body is not a whole JSON object (%d bytes, ends %q)", total, end)
	case s.keys == replay && res.Header.Get("Idempotent-Replayed") != "true":
		smp.err = fmt.Errorf("not a replay (Idempotent-Replayed %q)", res.Header.Get("Idempotent-Replayed"))
	case s.keys == freshKey && res.Header.Get("Idempotent-Replayed") != "":
		smp.err = fmt.Errorf("a fresh key was replayed")
	}
	return smp
}

// newClient is one leg's client: a transport whose idle pool holds every
// connection the leg uses, so no request waits on a dial after warm-up.
func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		// A loopback-only tool never uses a proxy (Proxy nil).
	}}
}

// outcome is a leg's raw measurements.
type outcome struct {
	samples     []sample // successes and failures
	elapsed     time.Duration
	issued      int
	maxInFlight int64
	maxLag      time.Duration // open loop: worst delay of a send past its schedule
}

// maxPerWorker bounds a closed-loop worker's requests (and memory) however
// fast the path is.
const maxPerWorker = 4 << 20

// closedPlan is a closed loop's shape: conc workers, for warm (discarded)
// and then dur (measured); measuring is called between the two.
type closedPlan struct {
	conc      int
	warm, dur time.Duration
	measuring func()
}

// closedLoop runs pl.conc workers, each sending its next request when the
// previous one finished, for pl.warm (discarded) and then pl.dur
// (measured). pl.measuring is called between the two.
func closedLoop(ctx context.Context, c *http.Client, s *shot, pl closedPlan) outcome {
	conc, warm, dur := pl.conc, pl.warm, pl.dur
	phase := func(tag string, d time.Duration) ([]sample, time.Duration) {
		start := time.Now()
		deadline := start.Add(d)
		per := make([][]sample, conc)
		var wg sync.WaitGroup
		for w := range conc {
			wg.Go(func() {
				buf := make([]byte, 32<<10)
				out := make([]sample, 0, 1024)
				for i := 0; i < maxPerWorker && time.Now().Before(deadline) && ctx.Err() == nil; i++ {
					rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
					out = append(out, s.do(rctx, c, fmt.Sprintf("%s-w%d-%d", tag, w, i), buf))
					cancel()
				}
				per[w] = out
			})
		}
		wg.Wait()
		return slices.Concat(per...), time.Since(start)
	}
	if warm > 0 {
		phase("warm", warm)
	}
	pl.measuring()
	samples, elapsed := phase("run", dur)
	return outcome{samples: samples, elapsed: elapsed, issued: len(samples), maxInFlight: int64(conc)}
}

// openPlan is an open loop's shape: rate requests per second for dur, each
// bounded by timeout.
type openPlan struct {
	rate    int
	dur     time.Duration
	timeout time.Duration
}

// openLoop fires rate requests per second for dur on a fixed schedule,
// whether or not earlier ones have finished (as vegeta does): request i is
// due at start + i/rate; a send that falls behind goes at once and the
// lag is reported. Latency is measured from the actual send. It returns
// when every request has finished (each is bounded by timeout).
func openLoop(ctx context.Context, c *http.Client, s *shot, pl openPlan) outcome {
	rate, dur, timeout := pl.rate, pl.dur, pl.timeout
	n := max(1, int(float64(rate)*dur.Seconds()))
	period := time.Second / time.Duration(rate)
	samples := make([]sample, n)
	var done atomic.Int64
	var peak int64
	var wg sync.WaitGroup
	var maxLag time.Duration
	start := time.Now()
	issued := 0
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		due := start.Add(time.Duration(i) * period)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		maxLag = max(maxLag, time.Since(due))
		issued++
		peak = max(peak, int64(issued)-done.Load())
		wg.Go(func() {
			defer done.Add(1)
			rctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			samples[i] = s.do(rctx, c, fmt.Sprintf("open-%d", i), make([]byte, 4<<10))
		})
	}
	wg.Wait()
	return outcome{samples: samples[:issued], elapsed: time.Since(start), issued: issued, maxInFlight: peak, maxLag: maxLag}
}
