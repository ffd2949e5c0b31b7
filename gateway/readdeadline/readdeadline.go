// Package readdeadline bounds how long a request's body may take to
// arrive, per request, so that a client trickling a body cannot hold a
// connection (and a goroutine) open indefinitely.
//
// The deadline is set on the connection through http.ResponseController
// when a request with a body reaches the handler (Start), moved once the
// request is known to be a client's (Extend), and lifted when the body
// reaches EOF. Why not http.Server.ReadTimeout: it is one bound for every
// route, where a sign-in form needs seconds and an authenticated upload
// minutes; and it lives in whatever http.Server serves the handler, where
// a middleware travels with the handler — the binary, the tests' loopback
// servers and any embedder all get the same bounds.
//
// A body the handler leaves unread keeps its deadline: net/http drains it
// (up to 256 KiB) before answering, and a trickled one is cut there too.
// A request without a body gets none: net/http is already reading the
// connection in the background to notice the client leave, and a deadline
// there would cancel the request's context.
package readdeadline

import (
	"io"
	"net/http"
	"sync"
	"time"
)

// Start gives r's body until now+d to arrive and returns r with a body
// that lifts the deadline at EOF. A request without a body is returned as
// is, with no deadline (see the package comment); so is a request whose
// writer cannot take a deadline (an in-process replay, a
// ResponseRecorder), and any request when d <= 0.
func Start(w http.ResponseWriter, r *http.Request, d time.Duration) *http.Request {
	if d <= 0 || r.Body == nil || r.Body == http.NoBody {
		return r
	}
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(d)); err != nil {
		return r
	}
	r2 := r.WithContext(r.Context()) // a shallow copy: net/http keeps its own *Request and body
	r2.Body = &body{ReadCloser: r.Body, rc: rc}
	return r2
}

// Extend moves the deadline Start set on r's body to now+d, unless the
// body has already arrived (a deadline then would cut net/http's
// background read and cancel the request). Call it before reading the
// body: a deadline that has passed cannot be extended.
func Extend(r *http.Request, d time.Duration) {
	b, ok := r.Body.(*body)
	if !ok || d <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.done {
		_ = b.rc.SetReadDeadline(time.Now().Add(d))
	}
}

// body lifts the connection's read deadline when the body reaches EOF.
type body struct {
	io.ReadCloser
	rc   *http.ResponseController
	mu   sync.Mutex
	done bool
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.mu.Lock()
		if !b.done {
			b.done = true
			// From here on net/http's background read waits on the
			// connection for as long as the handler runs. (It lifts the
			// deadline itself when it starts; this does not rely on that.)
			_ = b.rc.SetReadDeadline(time.Time{})
		}
		b.mu.Unlock()
	}
	return n, err
}
