package readdeadline

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// server answers with what reading the body gave: its length, or the
// error's kind. extend, when > 0, is applied before reading.
func server(t *testing.T, d, extend time.Duration) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = Start(w, r, d)
		if extend > 0 {
			Extend(r, extend)
		}
		b, err := io.ReadAll(r.Body)
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			http.Error(w, "timeout", http.StatusRequestTimeout)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, strings.Repeat("x", len(b)))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// post sends a body whose second half arrives after pause.
func post(t *testing.T, url string, pause time.Duration) (int, error) {
	t.Helper()
	pr, pw := io.Pipe()
	go func() {
		_, _ = io.WriteString(pw, "first half,")
		<-time.After(pause) // the slow client this test is about
		_, _ = io.WriteString(pw, "second half")
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, url, pr)
	req.ContentLength = int64(len("first half,second half"))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
	return res.StatusCode, nil
}

func TestDeadline(t *testing.T) {
	const short, pause = 100 * time.Millisecond, 400 * time.Millisecond
	t.Run("a body slower than the deadline is cut", func(t *testing.T) {
		status, err := post(t, server(t, short, 0).URL, pause)
		if err == nil && status != http.StatusRequestTimeout {
			t.Fatalf("status %d, want 408 (or the connection closed)", status)
		}
	})
	t.Run("extended, it arrives", func(t *testing.T) {
		status, err := post(t, server(t, short, 10*time.Second).URL, pause)
		if err != nil || status != http.StatusOK {
			t.Fatalf("status %d, %v, want 200", status, err)
		}
	})
	t.Run("within the deadline, it arrives", func(t *testing.T) {
		status, err := post(t, server(t, 10*time.Second, 0).URL, pause)
		if err != nil || status != http.StatusOK {
			t.Fatalf("status %d, %v, want 200", status, err)
		}
	})
	t.Run("no deadline without a writer that takes one", func(t *testing.T) {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("x"))
		if got := Start(httptest.NewRecorder(), r, short); got != r {
			t.Fatal("Start wrapped a request it could not bound")
		}
		r = httptest.NewRequest(http.MethodGet, "/", nil)
		if got := Start(httptest.NewRecorder(), r, short); got != r {
			t.Fatal("Start wrapped a request without a body")
		}
	})
}
