// Package admission bounds the request bytes held in memory across all
// requests: a burst of large bodies waits, or is refused with 503, instead
// of growing the heap past the process's memory limit.
//
// A request reserves the bytes of its body as they arrive — chunk by
// chunk, whatever Content-Length it declares, so that a client trickling a
// large body holds only what it sent — and gives them back when it ends. A reservation that
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"

	"github.com/llmgate/llmgate/gateway/apierror"
)

// DefaultWait is Options.Wait when unset.
const DefaultWait = 2 * time.Second

// chunk is the first buffer, and reservation, of a body being read.
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
	// Share, if > 0, is the most bytes the requests of one client (see
	// Reservation.Client) may hold at once, so that one tenant cannot take
	// the whole Limit. A reservation past it is refused at once: what it
	// would wait for is held by the client's own requests.
	Share int64
	// Setting is the configuration setting named in a refusal. If empty,
	// limits.max_inflight_bytes.
	Setting string
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
	setting string
	share   int64
	mu      sync.Mutex
	clients map[string]int64 // bytes held per client, under share
	inUse   atomic.Int64
	refused atomic.Int64
}

// New returns a Bound.
func New(o Options) *Bound {
	b := &Bound{limit: o.Limit, wait: o.Wait, after: o.After, setting: o.Setting, share: o.Share, clients: map[string]int64{}}
	if b.setting == "" {
		b.setting = "limits.max_inflight_bytes"
	}
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
	// Client is whose share (Options.Share) r counts against; "" none.
	// Set it before the first Reserve.
	Client string
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
		if err := b.takeShare(r.Client, n); err != nil {
			return err
		}
		if err := b.acquire(ctx, n); err != nil {
			b.giveShare(r.Client, n)
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
		Message: fmt.Sprintf("The gateway is holding as many request bytes as it may (%s), "+
			"and this request's body did not fit within %v. Retry after the Retry-After interval.", b.setting, b.wait),
		RetryAfter: time.Second, ShouldRetry: true, Err: errWaited}
}

var errWaited = errors.New("admission wait over")

// ShareOf is the most bytes client may hold at once: its share, or the
// limit where it has none (client "", or no share set); 0 when nothing is
// bounded.
func (b *Bound) ShareOf(client string) int64 {
	if b.shares(client) {
		return b.share
	}
	return b.limit
}

// shares reports whether client's bytes count against a share of their
// own: a share is set and client is one ("" is none configured).
func (b *Bound) shares(client string) bool { return b.share > 0 && client != "" }

// takeShare counts n more bytes against client's share, or refuses them.
func (b *Bound) takeShare(client string, n int64) error {
	if !b.shares(client) {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.clients[client]+n > b.share {
		b.refused.Add(1)
		return &apierror.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "gateway_overloaded",
			Message: fmt.Sprintf("Your requests in progress already hold as many request bytes as one client may (%d, a share of %s). "+
				"Retry after the Retry-After interval, or when they have ended.", b.share, b.setting),
			RetryAfter: time.Second, ShouldRetry: true}
	}
	b.clients[client] += n
	return nil
}

// giveShare gives back n bytes of client's share.
func (b *Bound) giveShare(client string, n int64) {
	if !b.shares(client) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.clients[client] -= n; b.clients[client] <= 0 {
		delete(b.clients, client)
	}
}

// Release gives back everything r holds. Safe to call more than once, and
// on nil.
func (r *Reservation) Release() {
	if r == nil || r.b == nil || r.n == 0 {
		return
	}
	if r.b.sem != nil {
		r.b.sem.Release(r.n)
		r.b.giveShare(r.Client, r.n)
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
	t := &Reservation{b: r.b, n: r.n, Client: r.Client}
	r.n = 0
	return t
}

// Held is the number of bytes r holds.
func (r *Reservation) Held() int64 { return r.n }

// Body reads body, which holds length bytes (-1: unknown), into memory
// under r, reserving as the bytes arrive, never the declared length up
// front: a client that declares a large body and sends it slowly holds
// only about what it sent. The buffer starts at one chunk and doubles as
// it fills, up to length or limit, and r reserves each growth before it is
// made, so what r holds is what the buffer takes — never a byte more than
// the body's own: a full buffer is checked for the body's end with a read
// of one byte outside it. A body longer than limit is ErrOverLimit (also
// one longer than length, which net/http never gives).
func (r *Reservation) Body(ctx context.Context, b *Bound, body io.Reader, length, limit int64) ([]byte, error) {
	most := limit
	if length >= 0 {
		most = min(length, most)
	}
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) >= most {
				return buf, atEnd(body)
			}
			n := min(max(2*int64(cap(buf)), chunk), most)
			if err := r.Reserve(ctx, b, n-int64(cap(buf))); err != nil {
				return buf, err
			}
			buf = append(make([]byte, 0, n), buf...)
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// ErrOverLimit: a body read by Body holds more than its limit.
var ErrOverLimit = errors.New("the body is longer than its limit")

// atEnd reads on from a body whose bytes fill the buffer: nil at its end,
// ErrOverLimit if it has another byte, or the read's error.
func atEnd(body io.Reader) error {
	var one [1]byte
	for {
		n, err := body.Read(one[:])
		switch {
		case n > 0:
			return ErrOverLimit
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		}
	}
}
