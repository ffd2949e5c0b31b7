package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			w.Write([]byte("ok\n"))
		case "/readyz":
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)

	// An address nothing listens on: bind a port, then free it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	ln.Close()

	tests := []struct {
		name    string
		args    []string
		want    int
		wantErr string // substring of stderr; "" means stderr is empty
	}{
		{"200 is healthy", []string{srv.URL + "/healthz"}, 0, ""},
		{"503 is unhealthy", []string{srv.URL + "/readyz"}, 1, "503"},
		{"404 is unhealthy", []string{srv.URL + "/nope"}, 1, "404"},
		{"connection refused is unhealthy", []string{"http://" + deadAddr + "/healthz"}, 1, deadAddr},
		{"bad URL is unhealthy", []string{"::not a url"}, 1, "healthcheck:"},
		{"two arguments is usage", []string{"a", "b"}, 2, "usage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr strings.Builder
			if got := run(tt.args, &stderr); got != tt.want {
				t.Errorf("run(%q) = %d, want %d (stderr %q)", tt.args, got, tt.want, stderr.String())
			}
			if tt.wantErr == "" && stderr.Len() > 0 {
				t.Errorf("stderr = %q, want empty", stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.wantErr) {
				t.Errorf("stderr = %q, want it to contain %q", stderr.String(), tt.wantErr)
			}
		})
	}
}
