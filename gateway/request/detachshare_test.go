package request

import (
	"context"
	"testing"
	"time"
)

// Past the cap, a client within its share takes the slot of the client
// holding the most, never of one holding fewer; a client at its share
// has its own new call cancelled.
func TestDetachedShareEvictsTheBiggestHolder(t *testing.T) {
	s := newWorkSet(4)
	as := func(client string) context.Context {
		return context.WithValue(context.Background(), clientCtxKey{}, client)
	}
	detach := func(client string) (context.Context, bool) {
		ctx, it, _ := s.start(as(client), time.Time{})
		return ctx, s.detach(it)
	}
	a1, _ := detach("alice")
	a2, _ := detach("alice")
	if _, ok := detach("alice"); ok {
		t.Fatal("alice past her share of 2 was not cancelled")
	}
	b1, _ := detach("bob")
	c1, _ := detach("carol") // the cap (4) is full
	if _, ok := detach("dave"); !ok {
		t.Fatal("dave, holding none, was refused at the cap")
	}
	// Alice, holding the most, lost her newest.
	if a2.Err() == nil || a1.Err() != nil || b1.Err() != nil || c1.Err() != nil {
		t.Fatalf("after dave: alice %v %v, bob %v, carol %v; want alice's newest cancelled only", a1.Err(), a2.Err(), b1.Err(), c1.Err())
	}
	if _, ok := detach("bob"); ok {
		t.Fatal("bob, holding as many as the most, took another's slot")
	}
	if b1.Err() != nil || c1.Err() != nil || a1.Err() != nil {
		t.Fatal("a refused detach cancelled another client's call")
	}
	if n := s.detached.Load(); n != 4 {
		t.Fatalf("detached = %d, want the cap", n)
	}
}

// With no clients configured every request's client is "", one tenant:
// it may detach up to the whole cap, as it may hold the whole of
// limits.max_inflight_bytes (admission exempts "" from its share too).
// It had half: a single-tenant gateway cancelled detached calls past 128
// of the default 256, releasing their keys and writing dead letters.
func TestNoClientsDetachUpToTheCap(t *testing.T) {
	s := newWorkSet(4)
	var ctxs []context.Context
	for i := range 4 {
		ctx, it, _ := s.start(context.Background(), time.Time{})
		if !s.detach(it) {
			t.Fatalf("detached call %d of a cap of 4 was cancelled (no clients configured)", i+1)
		}
		ctxs = append(ctxs, ctx)
	}
	if _, it, _ := s.start(context.Background(), time.Time{}); s.detach(it) {
		t.Fatal("a fifth detached call past the cap of 4 was not cancelled")
	}
	for i, ctx := range ctxs {
		if ctx.Err() != nil {
			t.Fatalf("detached call %d was cancelled by one past the cap", i+1)
		}
	}
}
