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
