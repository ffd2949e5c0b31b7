// Package admission bounds the request bytes held in memory across all
// requests: a burst of large bodies waits, or is refused with 503, instead
// of growing the heap past the process's memory limit.
//
// A request reserves the bytes of its body before reading it — its
// Content-Length, or, when the length is unknown, chunk by chunk as the
// body arrives — and gives them back when it ends. A reservation that
// does not fit waits, first come first served, for at most Options.Wait;
// then the request is refused with a 503 server_error, code
// gateway_overloaded, and Retry-After.
package admission

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"

	"github.com/llmgate/llmgate/gateway/apierror"
)

// DefaultWait is Options.Wait when unset.
const DefaultWait = 2 * time.Second

// chunk is what a body of unknown length reserves at a time.
const chunk = 64 << 10

// Options configures New. The zero value admits everything.
type Options struct {
	// Limit is the most bytes reserved at once. If <= 0, there is no
	// bound (reservations are still counted).
	Limit int64
	// Wait is how long a reservation that does not fit waits before the
	// request is refused. If <= 0, DefaultWait.
	Wait time.Duration
	// After is the timer of that wait. If nil, time.After.
	After func(time.Duration) <-chan time.Time
	// Registerer, if not nil, gets the metrics
	// llmgate_admission_inflight_bytes (gauge) and
	// llmgate_admission_refused_total (counter).
	Registerer prometheus.Registerer
}

// Bound is the bound on bytes in flight. Safe for concurrent use.
type Bound struct {
	sem     *semaphore.Weighted // nil without a limit
	limit   int64
	wait    time.Duration
	after   func(time.Duration) <-chan time.Time
	inUse   atomic.Int64
	refused atomic.Int64
	gauge   prometheus.GaugeFunc
	counter prometheus.CounterFunc
}

// New returns a Bound.
func New(o Options) *Bound {
	b := &Bound{limit: o.Limit, wait: o.Wait, after: o.After}
	if b.limit > 0 {
		b.sem = semaphore.NewWeighted(b.limit)
	}
	if b.wait <= 0 {
		b.wait = DefaultWait
	}
	if b.after == nil {
		b.after = time.After
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "llmgate_admission_inflight_bytes",
				Help: "Request body bytes reserved by requests in progress (limits.max_inflight_bytes bounds it)."},
				func() float64 { return float64(b.inUse.Load()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "llmgate_admission_refused_total",
				Help: "Requests refused with 503 gateway_overloaded: their body did not fit under limits.max_inflight_bytes within limits.admission_wait."},
				func() float64 { return float64(b.refused.Load()) }))
	}
	return b
}

// InUse is the number of bytes reserved now.
func (b *Bound) InUse() int64 { return b.inUse.Load() }

// Refused is the number of reservations refused so far.
func (b *Bound) Refused() int64 { return b.refused.Load() }

// Reservation is what one request holds. Its zero value holds nothing.
// It is not safe for concurrent use: one goroutine owns it, and Take hands
// what it holds to another.
type Reservation struct {
	b *Bound
	n int64
}

// Reserve reserves n more bytes for r, waiting up to the bound's Wait.
// n is capped at the bound's Limit, so a body the size of the limit is
// admitted alone. The error is an *apierror.Error (503, Retry-After) when
// the wait ran out, or ctx's error when ctx ended first.
func (r *Reservation) Reserve(ctx context.Context, b *Bound, n int64) error {
	r.b = b
	if b.sem != nil {
		n = min(n, b.limit-r.n)
		if n <= 0 {
			return nil
		}
		if err := b.acquire(ctx, n); err != nil {
			return err
		}
	}
	r.n += n
	b.inUse.Add(n)
	return nil
}

func (b *Bound) acquire(ctx context.Context, n int64) error {
	if b.sem.TryAcquire(n) {
		return nil
	}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := b.after(b.wait)
	go func() {
		select {
		case <-timer:
			cancel(errWaited)
		case <-wctx.Done():
		}
	}()
	err := b.sem.Acquire(wctx, n)
	if err == nil {
		return nil
	}
	if !errors.Is(context.Cause(wctx), errWaited) {
		return ctx.Err()
	}
	b.refused.Add(1)
	return &apierror.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "gateway_overloaded",
		Message: fmt.Sprintf("The gateway is holding as many request bytes in memory as it may (limits.max_inflight_bytes), "+
			"and this request's body did not fit within %v. Retry after the Retry-After interval.", b.wait),
		RetryAfter: time.Second, ShouldRetry: true, Err: errWaited}
}

var errWaited = errors.New("admission wait over")

// Release gives back everything r holds. Safe to call more than once, and
// on nil.
func (r *Reservation) Release() {
	if r == nil || r.b == nil || r.n == 0 {
		return
	}
	if r.b.sem != nil {
		r.b.sem.Release(r.n)
	}
	r.b.inUse.Add(-r.n)
	r.n = 0
}

// Take moves what r holds to the returned Reservation, which whoever
// outlives r's owner releases: from then on r holds nothing (r.Release does
// nothing) until it reserves again. It is how a keyed call that runs on
// after its handler returned keeps its body's bytes reserved until it ends.
// Nil-safe.
func (r *Reservation) Take() *Reservation {
	if r == nil {
		return nil
	}
	t := &Reservation{b: r.b, n: r.n}
	r.n = 0
	return t
}

// Held is the number of bytes r holds.
func (r *Reservation) Held() int64 { return r.n }

// Body reads body, which holds length bytes (-1: unknown), into memory
// under r: the whole length is reserved first, and read into a buffer of
// that size; an unknown length is reserved chunk by chunk as it is read.
// It reads at most limit+1 bytes, so that the caller can tell a body over
// limit.
func (r *Reservation) Body(ctx context.Context, b *Bound, body io.Reader, length, limit int64) ([]byte, error) {
	body = io.LimitReader(body, limit+1)
	if length >= 0 {
		n := min(length, limit+1)
		if err := r.Reserve(ctx, b, n); err != nil {
			return nil, err
		}
		return readAll(make([]byte, 0, n+1), body)
	}
	return readAll(make([]byte, 0, 512), &reservingReader{ctx: ctx, r: r, b: b, in: body})
}

// readAll is io.ReadAll into buf: a buffer sized for the whole body (one
// byte more, to see EOF without growing) is not reallocated.
func readAll(buf []byte, r io.Reader) ([]byte, error) {
	for {
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
	}
}

// reservingReader reserves a chunk before reading past what it holds.
type reservingReader struct {
	ctx  context.Context
	r    *Reservation
	b    *Bound
	in   io.Reader
	read int64
}

func (rr *reservingReader) Read(p []byte) (int, error) {
	if rr.read >= rr.r.n && (rr.b.sem == nil || rr.r.n < rr.b.limit) {
		if err := rr.r.Reserve(rr.ctx, rr.b, chunk); err != nil {
			return 0, err
		}
	}
	if room := rr.r.n - rr.read; rr.b.sem != nil && room > 0 && int64(len(p)) > room {
		p = p[:room]
	}
	n, err := rr.in.Read(p)
	rr.read += int64(n)
	return n, err
}
