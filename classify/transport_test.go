package classify

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// The helpers below produce transport errors the way the gateway meets
// them: from net/http talking to a real (loopback or in-memory) peer, so
// the error chains are the real ones (*url.Error → *net.OpError →
// *os.SyscallError → syscall.Errno, and so on).

// get does one GET through a fresh transport (no connection reuse, so
// net/http never retries on its own) and reads the whole body.
func get(t *testing.T, ctx context.Context, tr *http.Transport, url string) error {
	t.Helper()
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.ReadAll(resp.Body)
	return err
}

// rawServer serves each loopback connection with handle, after reading
// the request's headers.
func rawServer(t *testing.T, handle func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				handle(c)
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/v1/chat/completions"
}

// closedAddr is a loopback address nobody listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func errDialRefused(t *testing.T) error {
	_, err := net.Dial("tcp", closedAddr(t))
	return err
}

func errHTTPRefused(t *testing.T) error {
	return get(t, context.Background(), &http.Transport{}, "http://"+closedAddr(t)+"/")
}

func errHTTPReset(t *testing.T) error {
	url := rawServer(t, func(c net.Conn) {
		c.(*net.TCPConn).SetLinger(0) // close sends RST
	})
	return get(t, context.Background(), &http.Transport{}, url)
}

func errHTTPClosedBeforeAnswer(t *testing.T) error {
	url := rawServer(t, func(net.Conn) {}) // closes gracefully, no response
	return get(t, context.Background(), &http.Transport{}, url)
}

func errHTTPTruncatedBody(t *testing.T) error {
	url := rawServer(t, func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":")
	})
	return get(t, context.Background(), &http.Transport{}, url)
}

func errHTTPDNS(t *testing.T) error {
	// A resolver that cannot reach any DNS server: the *net.DNSError is
	// real, and the test needs no network.
	r := &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("no DNS server in tests")
	}}
	tr := &http.Transport{DialContext: (&net.Dialer{Resolver: r}).DialContext}
	return get(t, context.Background(), tr, "http://upstream.invalid/")
}

func errDNSNotFound(*testing.T) error {
	return &net.DNSError{Err: "no such host", Name: "upstream.invalid", IsNotFound: true}
}

func errDNSTimeout(*testing.T) error {
	return &net.DNSError{Err: "i/o timeout", Name: "upstream.test", IsTimeout: true}
}

// pipeTransport dials an in-memory connection whose other end is served
// by serve, so that it can run inside a synctest bubble (real sockets are
// not durably blocking, net.Pipe is).
func pipeTransport(serve func(net.Conn)) *http.Transport {
	return &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			srv, cli := net.Pipe()
			go func() {
				defer srv.Close()
				serve(srv)
			}()
			return cli, nil
		},
		TLSHandshakeTimeout: 10 * time.Second,
	}
}

func errTLSHandshakeTimeout(t *testing.T) (err error) {
	synctest.Test(t, func(t *testing.T) {
		// The peer reads the ClientHello and never answers; after 10s of
		// bubble time net/http gives up with its TLS handshake timeout.
		tr := pipeTransport(func(c net.Conn) { io.Copy(io.Discard, c) })
		err = get(t, context.Background(), tr, "https://upstream.test/v1/chat/completions")
	})
	return err
}

func errClientTimeout(t *testing.T) (err error) {
	synctest.Test(t, func(t *testing.T) {
		// The peer reads the request and never answers.
		tr := pipeTransport(func(c net.Conn) { io.Copy(io.Discard, c) })
		defer tr.CloseIdleConnections()
		c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
		var resp *http.Response
		resp, err = c.Get("http://upstream.test/v1/chat/completions")
		if err == nil {
			resp.Body.Close()
		}
	})
	return err
}

func errContextDeadline(t *testing.T) (err error) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		tr := pipeTransport(func(c net.Conn) { io.Copy(io.Discard, c) })
		err = get(t, ctx, tr, "http://upstream.test/v1/chat/completions")
	})
	return err
}

func errReadDeadline(t *testing.T) error {
	url := rawServer(t, func(c net.Conn) { io.Copy(io.Discard, c) })
	c, err := net.Dial("tcp", url[len("http://"):len(url)-len("/v1/chat/completions")])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(-time.Second)) // already passed: no waiting
	_, err = c.Read(make([]byte, 1))
	return err
}

func errBrokenPipe(*testing.T) error {
	// What a write on a connection the peer reset returns; provoking it for
	// real depends on kernel buffer timing, so the chain is built as
	// net.(*conn).Write builds it.
	return &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}
}

func errOtherOp(*testing.T) error {
	return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}
}

func errUnknown(*testing.T) error { return errors.New("something else went wrong") }

func errHTTPCanceled(t *testing.T) error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return get(t, ctx, &http.Transport{}, "http://"+closedAddr(t)+"/")
}

func errCanceledCause(*testing.T) error {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("client disconnected"))
	return ctx.Err()
}
