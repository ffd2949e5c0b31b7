package admission

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/llmgate/llmgate/gateway/apierror"
)

// fakeTimers is Options.After: each wait registers a timer the test fires.
type fakeTimers chan chan time.Time

func (f fakeTimers) after(time.Duration) <-chan time.Time {
	c := make(chan time.Time, 1)
	f <- c
	return c
}

// TestReserveWaitsThenRefuses: under a 10-byte bound, reservations of 3
// fit three at a time; the fourth and fifth wait, and are refused with a
// 503 gateway_overloaded and Retry-After when their wait runs out; the
// bytes reserved never pass the bound; a release lets a waiter in.
func TestReserveWaitsThenRefuses(t *testing.T) {
	timers := make(fakeTimers, 8)
	b := New(Options{Limit: 10, After: timers.after})
	held := make([]Reservation, 3)
	for i := range held {
		if err := held[i].Reserve(context.Background(), b, 3); err != nil {
			t.Fatal(err)
		}
	}
	if b.InUse() != 9 {
		t.Fatalf("InUse %d, want 9", b.InUse())
	}
	errs, hold := make(chan error, 2), make(chan struct{})
	defer close(hold)
	for range 2 {
		go func() {
			var r Reservation
			err := r.Reserve(context.Background(), b, 3)
			errs <- err
			if err == nil {
				<-hold
				r.Release()
			}
		}()
	}
	t1, t2 := <-timers, <-timers // both are waiting
	if b.InUse() > 10 {
		t.Fatalf("InUse %d over the bound", b.InUse())
	}
	held[0].Release()
	if err := <-errs; err != nil { // one waiter got the room
		t.Fatalf("waiter after a release: %v", err)
	}
	t1 <- time.Time{}
	t2 <- time.Time{}
	err := <-errs
	var ae *apierror.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || ae.Code != "gateway_overloaded" ||
		ae.Type != "server_error" || ae.RetryAfter <= 0 {
		t.Fatalf("refusal: %#v", err)
	}
	if b.Refused() != 1 {
		t.Fatalf("Refused %d, want 1", b.Refused())
	}
	held[1].Release()
	held[2].Release()
	held[2].Release() // twice is harmless
	if b.InUse() != 3 {
		t.Fatalf("InUse %d with only the admitted waiter left, want 3", b.InUse())
	}
}

// A waiter whose request ends stops waiting with the context's error, not
// a refusal.
func TestReserveContextEnds(t *testing.T) {
	timers := make(fakeTimers, 1)
	b := New(Options{Limit: 4, After: timers.after})
	var full Reservation
	if err := full.Reserve(context.Background(), b, 4); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		var r Reservation
		done <- r.Reserve(ctx, b, 1)
	}()
	<-timers
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Reserve after cancel: %v", err)
	}
	if b.Refused() != 0 || b.InUse() != 4 {
		t.Fatalf("Refused %d, InUse %d", b.Refused(), b.InUse())
	}
}

// Body reserves as it reads, known length or not: its buffer, doubling
// from one chunk up to the length and one byte (to see EOF), never more
// than the bound; the bytes read are the body's.
func TestBody(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789abcdef"), 20<<10) // 320 KiB
	for _, tc := range []struct {
		name   string
		length int64
		limit  int64 // the bound
		want   int64 // held after
	}{
		{"known length", int64(len(body)), 1 << 20, int64(len(body))}, // not a byte past it
		{"unknown length", -1, 1 << 20, 512 << 10},                    // 64, 128, 256, 512 KiB
		{"unknown length, at the bound", -1, int64(len(body)), int64(len(body))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New(Options{Limit: tc.limit})
			var r Reservation
			got, err := r.Body(context.Background(), b, bytes.NewReader(body), tc.length, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, body) {
				t.Fatalf("read %d bytes, not the body", len(got))
			}
			if r.Held() != tc.want || b.InUse() != tc.want {
				t.Fatalf("held %d (InUse %d), want %d", r.Held(), b.InUse(), tc.want)
			}
			r.Release()
		})
	}
}

// A body one byte over its limit is ErrOverLimit, holding no more than the
// limit; one of exactly the limit is read whole, whether its length is
// known or not.
func TestBodyOverLimit(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 100<<10)
	for _, length := range []int64{-1, int64(len(body))} {
		b := New(Options{Limit: 1 << 20})
		var r Reservation
		got, err := r.Body(context.Background(), b, bytes.NewReader(body), length, int64(len(body)))
		if err != nil || len(got) != len(body) || r.Held() != int64(len(body)) {
			t.Fatalf("length %d, a body of exactly the limit: %d bytes, held %d, %v", length, len(got), r.Held(), err)
		}
		r.Release()
		_, err = r.Body(context.Background(), b, bytes.NewReader(append(body, 'y')), -1, int64(len(body)))
		if !errors.Is(err, ErrOverLimit) || r.Held() > int64(len(body)) {
			t.Fatalf("a body one byte over: %v, held %d", err, r.Held())
		}
		r.Release()
	}
}

// Without a limit nothing waits, and bytes are still counted.
func TestNoLimit(t *testing.T) {
	b := New(Options{})
	var r Reservation
	if err := r.Reserve(context.Background(), b, 1<<40); err != nil || b.InUse() != 1<<40 {
		t.Fatalf("Reserve: %v, InUse %d", err, b.InUse())
	}
	r.Release()
}

// A body that declares 32 MiB and has sent 10 bytes holds one chunk, not
// its declared length (BROKE-1): a slow client holds about what it sent.
func TestBodyReservesAsItArrives(t *testing.T) {
	b := New(Options{Limit: 64 << 20})
	pr, pw := io.Pipe()
	var r Reservation
	done := make(chan error, 1)
	go func() {
		_, err := r.Body(context.Background(), b, pr, 32<<20, 32<<20)
		done <- err
	}()
	if _, err := pw.Write([]byte("0123456789")); err != nil { // returns once Body has read it
		t.Fatal(err)
	}
	if got := b.InUse(); got != chunk {
		t.Errorf("after 10 bytes of a declared 32 MiB: %d bytes reserved, want one chunk (%d)", got, chunk)
	}
	pw.CloseWithError(io.ErrUnexpectedEOF)
	if err := <-done; !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Body: %v", err)
	}
	r.Release()
}

// With a Share, one client's reservations past it are refused at once
// (503 gateway_overloaded, no wait), another client's fit, and a release
// gives the share back.
func TestShare(t *testing.T) {
	timers := make(fakeTimers) // unbuffered: a wait would block the test
	b := New(Options{Limit: 20, Share: 10, After: timers.after})
	m1, m2, a := Reservation{Client: "mallory"}, Reservation{Client: "mallory"}, Reservation{Client: "alice"}
	if err := m1.Reserve(context.Background(), b, 6); err != nil {
		t.Fatal(err)
	}
	err := m2.Reserve(context.Background(), b, 5)
	var ae *apierror.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || ae.Code != "gateway_overloaded" || ae.RetryAfter <= 0 {
		t.Fatalf("past the share: %#v", err)
	}
	if err := a.Reserve(context.Background(), b, 9); err != nil {
		t.Fatalf("another client: %v", err)
	}
	if b.InUse() != 15 || b.Refused() != 1 {
		t.Fatalf("InUse %d, Refused %d; want 15, 1", b.InUse(), b.Refused())
	}
	m1.Release()
	if err := m2.Reserve(context.Background(), b, 5); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	m2.Release()
	a.Release()
	if len(b.clients) != 0 || b.InUse() != 0 {
		t.Fatalf("after every release: clients %v, InUse %d", b.clients, b.InUse())
	}
}

// Take moves the bytes: the owner's Release after a Take gives back
// nothing, the taker's gives back all of them.
func TestTake(t *testing.T) {
	b := New(Options{Limit: 10})
	var r Reservation
	if err := r.Reserve(context.Background(), b, 6); err != nil {
		t.Fatal(err)
	}
	taken := r.Take()
	r.Release()
	if b.InUse() != 6 || taken.Held() != 6 || r.Held() != 0 {
		t.Fatalf("after Take and the owner's Release: InUse %d, taken %d, owner %d; want 6, 6, 0", b.InUse(), taken.Held(), r.Held())
	}
	taken.Release()
	if b.InUse() != 0 {
		t.Fatalf("after the taker's Release: InUse %d", b.InUse())
	}
	if err := r.Reserve(context.Background(), b, 10); err != nil {
		t.Fatalf("the whole bound after both released: %v", err)
	}
	r.Release()
	var none *Reservation
	none.Take().Release()
}
