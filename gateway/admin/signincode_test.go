package admin

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/config"
)

const testSignInCode = "one-time-code-for-the-test"

// signInServer is an Admin with a sign-in code, behind echo. Only the
// page's sign-in routes are used, so it needs no store or breakers.
func signInServer(t *testing.T, token, code string, c *clock) (*Admin, *echo.Echo) {
	t.Helper()
	cfg := config.Default()
	cfg.AdminToken = token
	a := New(Options{Config: cfg, SignInCode: code, Now: c.now})
	t.Cleanup(a.Close)
	e := echo.New()
	a.Routes(e)
	return a, e
}

// openLink opens the sign-in link from remote, with extra headers.
func openLink(e *echo.Echo, code, remote string, hdr map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, SignInCodePath+"?code="+code, nil)
	req.RemoteAddr = remote
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	e.ServeHTTP(w, req)
	return w
}

func sessionCookie(w *httptest.ResponseRecorder) string {
	for _, ck := range w.Result().Cookies() {
		if ck.Name == Cookie && ck.MaxAge > 0 {
			return ck.Value
		}
	}
	return ""
}

func TestSignInCodeWorksOnce(t *testing.T) {
	a, e := signInServer(t, "admin-token", testSignInCode, newClock())

	w := openLink(e, testSignInCode, "127.0.0.1:50000", nil)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/admin/" {
		t.Fatalf("first use: %d Location %q, want 303 to /admin/", w.Code, w.Header().Get("Location"))
	}
	id := sessionCookie(w)
	if ok, err := a.sessions.valid(t.Context(), id); !ok || err != nil {
		t.Fatalf("the cookie %q is not a live session (%v)", id, err)
	}
	if got := w.Header().Get("Referrer-Policy"); got != "no-referrer" {
		t.Errorf("Referrer-Policy %q: the code in the URL could leak", got)
	}

	w = openLink(e, testSignInCode, "127.0.0.1:50001", nil)
	if w.Code != http.StatusUnauthorized || sessionCookie(w) != "" {
		t.Fatalf("second use: %d cookie %q, want 401 and none", w.Code, sessionCookie(w))
	}
	// The session the code opened lives on.
	if ok, _ := a.sessions.valid(t.Context(), id); !ok {
		t.Error("the first session ended when the code was tried again")
	}
}

func TestSignInCodeRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remote string
		hdr    map[string]string
		code   string
		after  time.Duration // the clock moves this far before the request
		want   int
	}{
		{name: "not loopback", remote: "192.0.2.7:40000", code: testSignInCode, want: http.StatusForbidden},
		{name: "forwarded by a local proxy", remote: "127.0.0.1:40000", hdr: map[string]string{"X-Forwarded-For": "198.51.100.9"}, code: testSignInCode, want: http.StatusForbidden},
		{name: "Forwarded header", remote: "[::1]:40000", hdr: map[string]string{"Forwarded": "for=198.51.100.9"}, code: testSignInCode, want: http.StatusForbidden},
		{name: "wrong code", remote: "127.0.0.1:40000", code: "nope", want: http.StatusUnauthorized},
		{name: "no code", remote: "127.0.0.1:40000", code: "", want: http.StatusUnauthorized},
		{name: "expired", remote: "127.0.0.1:40000", code: testSignInCode, after: DefaultSignInCodeTTL, want: http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock()
			_, e := signInServer(t, "admin-token", testSignInCode, c)
			c.advance(tc.after)
			w := openLink(e, tc.code, tc.remote, tc.hdr)
			if w.Code != tc.want || sessionCookie(w) != "" {
				t.Fatalf("%d cookie %q, want %d and none", w.Code, sessionCookie(w), tc.want)
			}
			if !strings.Contains(w.Body.String(), "Sign in with the admin token") {
				t.Errorf("the page does not point to the token sign-in:\n%s", w.Body.String())
			}
			if tc.after > 0 {
				return
			}
			// A refused attempt does not spend the code.
			if w := openLink(e, testSignInCode, "[::1]:40001", nil); w.Code != http.StatusSeeOther || sessionCookie(w) == "" {
				t.Errorf("the code after a refused attempt: %d, want 303 with a session", w.Code)
			}
		})
	}
}

func TestSignInCodeUnset(t *testing.T) {
	t.Run("no code configured", func(t *testing.T) {
		_, e := signInServer(t, "admin-token", "", newClock())
		if w := openLink(e, "anything", "127.0.0.1:1", nil); w.Code != http.StatusNotFound {
			t.Errorf("%d, want 404", w.Code)
		}
	})
	t.Run("admin disabled", func(t *testing.T) {
		_, e := signInServer(t, "", testSignInCode, newClock())
		if w := openLink(e, testSignInCode, "127.0.0.1:1", nil); w.Code != http.StatusForbidden || sessionCookie(w) != "" {
			t.Errorf("%d, want 403 and no session", w.Code)
		}
	})
}

// A session that could not be stored leaves the code unused.
func TestSignInCodeStoreFailure(t *testing.T) {
	a, e := signInServer(t, "admin-token", testSignInCode, newClock())
	store := &countingStore{SessionStore: a.sessions.store, fail: http.ErrHandlerTimeout}
	a.sessions.store = store
	if w := openLink(e, testSignInCode, "127.0.0.1:1", nil); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("store down: %d, want 503", w.Code)
	}
	store.fail = nil
	if w := openLink(e, testSignInCode, "127.0.0.1:1", nil); w.Code != http.StatusSeeOther || sessionCookie(w) == "" {
		t.Errorf("after the store is back: %d, want 303 with a session", w.Code)
	}
}
