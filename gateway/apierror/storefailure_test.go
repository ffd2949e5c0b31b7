package apierror

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// fullErr is a store's own "full" error, as cache.ErrFull reports itself.
type fullErr struct{}

func (fullErr) Error() string   { return "store full" }
func (fullErr) StoreFull() bool { return true }

// A store failure at the claim says the request was not run; one at the
// commit says it ran, was not stored, and that its retry may be billed
// again — with the code of its cause (unavailable or full) either way.
func TestStoreFailureWordsByStage(t *testing.T) {
	down := errors.New("connection refused")
	for _, c := range []struct {
		name    string
		err     error
		code    string
		ran     bool
		retryGE int // Retry-After, at least, in seconds
	}{
		{"claim, store down", &StoreUnavailable{Err: down}, "idempotency_store_unavailable", false, 1},
		{"claim, store full", &StoreFull{Reason: "disk_low"}, "idempotency_store_full", false, 1},
		{"commit, store down", &CommitFailed{Err: down}, "idempotency_store_unavailable", true, 1},
		{"commit, store full", &CommitFailed{Err: fmt.Errorf("commit k: %w", fullErr{})}, "idempotency_store_full", true, 30},
		{"commit, wrapped", fmt.Errorf("keyed: %w", &CommitFailed{Err: down}), "idempotency_store_unavailable", true, 1},
	} {
		e := Wire(c.err)
		ran := strings.Contains(e.Message, "was run") && strings.Contains(e.Message, "billed again")
		notRun := strings.Contains(e.Message, "not run")
		if e.Status != http.StatusServiceUnavailable || e.Code != c.code || ran != c.ran || notRun == c.ran ||
			e.RetryAfter.Seconds() < float64(c.retryGE) {
			t.Errorf("%s: %d %s %q (Retry-After %v)", c.name, e.Status, e.Code, e.Message, e.RetryAfter)
		}
		if strings.Contains(e.Message, "connection refused") {
			t.Errorf("%s: the store's error reached the client: %q", c.name, e.Message)
		}
	}
}
