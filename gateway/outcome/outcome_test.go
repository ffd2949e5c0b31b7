package outcome

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/apierror"
)

// TestSettle is the table of how a request ends: one row per kind of end.
func TestSettle(t *testing.T) {
	o := func(c classify.Class) classify.Outcome { return classify.Outcome{Class: c, Reason: string(c)} }
	tests := []struct {
		name       string
		r          Result
		commit     bool
		unrecorded bool
		br         breaker.Result
		noRetry    bool
		deadLetter string // class, "" for none
		replace    string // apierror wire code of what the client gets instead, "" for none
	}{
		{"200 answer", Result{Outcome: o(classify.Success), Status: 200}, true, false, breaker.Success, false, "", ""},
		{"200 content filter", Result{Outcome: o(classify.ContentFilter), Status: 200}, true, false, breaker.Success, false, "", ""},
		{"200 empty", Result{Outcome: o(classify.Empty), Status: 200}, true, false, breaker.Success, false, "", ""},
		{"stream answer", Result{Outcome: o(classify.Success), Status: 200, Streamed: true}, true, false, breaker.Success, false, "", ""},
		{"200 too large", Result{Outcome: o(classify.Success), Status: 200, Unrecordable: true}, false, true, breaker.Success, false, "", ""},
		{"stream too large", Result{Outcome: o(classify.Success), Status: 200, Streamed: true, Unrecordable: true}, false, true, breaker.Success, false, "", ""},
		{"stream too large and cut", Result{Outcome: o(classify.Transient), Status: 200, Streamed: true, Unrecordable: true}, false, false, breaker.Failure, true, "transient", ""},
		{"200 malformed after retries", Result{Outcome: o(classify.Transient), Status: 200}, false, false, breaker.Failure, true, "transient", "upstream_bad_response"},
		{"stream cut", Result{Outcome: o(classify.Transient), Status: 200, Streamed: true}, false, false, breaker.Failure, true, "transient", ""},
		{"503 after retries", Result{Outcome: o(classify.Transient), Status: 503}, false, false, breaker.Failure, true, "transient", "upstream_retries_exhausted"},
		{"429 after retries", Result{Outcome: o(classify.RateLimited), Status: 429}, false, false, breaker.Failure, true, "rate_limited", "upstream_retries_exhausted"},
		{"500 after its one retry", Result{Outcome: o(classify.ServerError), Status: 500}, false, false, breaker.Failure, true, "server_error", "upstream_retries_exhausted"},
		{"400", Result{Outcome: o(classify.ClientError), Status: 400}, false, false, breaker.Success, true, "", ""},
		{"401", Result{Outcome: o(classify.Unauthorized), Status: 401}, false, false, breaker.Failure, true, "unauthorized", "upstream_auth_failed"},
		{"403", Result{Outcome: o(classify.Auth), Status: 403}, false, false, breaker.Success, true, "", "upstream_auth_failed"},
		{"transport timeout", Result{Outcome: classify.Outcome{Class: classify.Transient, Timeout: true}}, false, false, breaker.Failure, true, "transient", "upstream_timeout"},
		{"client's deadline", Result{Outcome: o(classify.Transient), End: EndClient}, false, false, breaker.Excluded, true, "transient", "upstream_unreachable"},
		{"client left", Result{Outcome: o(classify.Canceled), End: EndClient}, false, false, breaker.Excluded, true, "", "client_closed_request"},
		{"operator's deadline, no answer", Result{Outcome: o(classify.Transient), End: EndOperator}, false, false, breaker.Failure, true, "transient", "upstream_unreachable"},
		{"operator's deadline, stream progressing", Result{Outcome: o(classify.Transient), Status: 200, Streamed: true, End: EndOperator}, false, false, breaker.Excluded, true, "transient", ""},
		{"gateway shut down", Result{Outcome: o(classify.Canceled), End: EndGateway}, false, false, breaker.Excluded, false, "canceled_by_gateway", "client_closed_request"},
		{"503 whose retry wait shutdown cut", Result{Outcome: o(classify.Transient), Status: 503, End: EndGateway}, false, false, breaker.Excluded, false, "canceled_by_gateway", ""},
		{"breaker open", Result{Err: &apierror.BreakerOpen{Upstream: "u", RetryAfter: time.Second}}, false, false, breaker.Excluded, false, "breaker_open", ""},
		{"deadline before any upstream", Result{Err: &apierror.DeadlineSpent{}}, false, false, breaker.Excluded, false, "deadline", ""},
		{"store down", Result{Err: &apierror.StoreUnavailable{Err: errors.New("x")}}, false, false, breaker.Excluded, false, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := Settle(tc.r)
			if v.Commit != tc.commit || (v.Uncommitted != "") != tc.unrecorded || v.Breaker != tc.br || v.NoRetry != tc.noRetry {
				t.Errorf("commit=%v uncommitted=%q breaker=%v noRetry=%v", v.Commit, v.Uncommitted, v.Breaker, v.NoRetry)
			}
			dl := ""
			if v.DeadLetter != nil {
				dl = v.DeadLetter.Class
			}
			if dl != tc.deadLetter {
				t.Errorf("dead letter %q, want %q", dl, tc.deadLetter)
			}
			code := ""
			if v.Replace != nil {
				code = apierror.Wire(v.Replace).Code
			}
			if code != tc.replace {
				t.Errorf("replaced by %q, want %q", code, tc.replace)
			}
		})
	}
}

func TestEndOf(t *testing.T) {
	live := context.Background()
	gone, cancel := context.WithCancel(live)
	cancel()
	ended := func(cause error) context.Context {
		ctx, cancel := context.WithCancelCause(live)
		cancel(cause)
		return ctx
	}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want End
	}{
		{"live", live, EndNone},
		{"client left", gone, EndClient},
		{"client's deadline", ended(ErrClientDeadline), EndClient},
		{"operator's deadline", ended(ErrOperatorDeadline), EndOperator},
		{"shutdown", ended(ErrShutdown), EndGateway},
	} {
		if got := EndOf(tc.ctx); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestSettleAction: what a keyed request does with its key, by what the
// answer was and what its client received of it when settled.
func TestSettleAction(t *testing.T) {
	ok := classify.Outcome{Class: classify.Success}
	for _, tc := range []struct {
		name string
		r    Result
		want Action
	}{
		{"answer, settled before its end goes out", Result{Outcome: ok, Status: 200}, Commit},
		{"stream answer", Result{Outcome: ok, Status: 200, Streamed: true}, Commit},
		{"too large, not sent yet", Result{Outcome: ok, Status: 200, Unrecordable: true}, Deliver},
		{"too large, received whole", Result{Outcome: ok, Status: 200, Unrecordable: true, Delivery: Whole}, Marker},
		{"too large, cut before the client had it all", Result{Outcome: ok, Status: 200, Unrecordable: true, Delivery: Cut}, Release},
		{"stream too large, received whole", Result{Outcome: ok, Status: 200, Streamed: true, Unrecordable: true, Delivery: Whole}, Marker},
		{"stream too large and cut upstream", Result{Outcome: classify.Outcome{Class: classify.Transient}, Status: 200, Streamed: true, Unrecordable: true, Delivery: Whole}, Release},
		{"503 after retries", Result{Outcome: classify.Outcome{Class: classify.Transient}, Status: 503}, Release},
		{"breaker open", Result{Err: &apierror.BreakerOpen{Upstream: "u"}}, Release},
	} {
		if got := Settle(tc.r).Action; got != tc.want {
			t.Errorf("%s: action %d, want %d", tc.name, got, tc.want)
		}
	}
}
