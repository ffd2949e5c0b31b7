package outcome

import (
	"bufio"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/apierror"
)

// settleDoc is the README's outcome table as Settle's inputs: each row
// names how the chain ended and what the client had received.
var settleDoc = []struct {
	ended, received string
	r               Result
}{
	{"2xx answer (content filtered, empty output included)", "not yet", Result{Outcome: out(classify.Success), Status: 200}},
	{"2xx answer too large to record", "not yet", Result{Outcome: out(classify.Success), Status: 200, Unrecordable: true}},
	{"2xx answer too large to record", "whole", Result{Outcome: out(classify.Success), Status: 200, Unrecordable: true, Delivery: Whole}},
	{"2xx answer too large to record", "cut", Result{Outcome: out(classify.Success), Status: 200, Unrecordable: true, Delivery: Cut}},
	{"stream cut by the upstream", "a prefix", Result{Outcome: out(classify.Transient), Status: 200, Streamed: true}},
	{"2xx with no usable answer, after the retries", "nothing", Result{Outcome: out(classify.Transient), Status: 200}},
	{"503 after the retries", "nothing", Result{Outcome: out(classify.Transient), Status: 503}},
	{"429 after the retries", "nothing", Result{Outcome: out(classify.RateLimited), Status: 429}},
	{"400", "nothing", Result{Outcome: out(classify.ClientError), Status: 400}},
	{"401 (the gateway's key refused)", "nothing", Result{Outcome: out(classify.Unauthorized), Status: 401}},
	{"403", "nothing", Result{Outcome: out(classify.Auth), Status: 403}},
	{"no answer: upstream timed out", "nothing", Result{Outcome: classify.Outcome{Class: classify.Transient, Timeout: true}}},
	{"no answer: the client's deadline passed", "nothing", Result{Outcome: out(classify.Transient), End: EndClient}},
	{"no answer: the client left", "nothing", Result{Outcome: out(classify.Canceled), End: EndClient}},
	{"no answer: the gateway shut down", "nothing", Result{Outcome: out(classify.Canceled), End: EndGateway}},
	{"breaker open, no fallback", "nothing", Result{Err: &apierror.BreakerOpen{Upstream: "u", RetryAfter: time.Second}}},
	{"deadline spent before any upstream", "nothing", Result{Err: &apierror.DeadlineSpent{}}},
	{"store unavailable", "nothing", Result{Err: &apierror.StoreUnavailable{Err: errors.New("x")}}},
}

func out(c classify.Class) classify.Outcome { return classify.Outcome{Class: c, Reason: string(c)} }

// docRow is how the README writes v: the key's action, what the breaker
// learns, the dead letter, x-should-retry: false, what the client gets.
func docRow(r Result, v Verdict) []string {
	key := map[Action]string{Release: "release", Commit: "commit", Deliver: "deliver first", Marker: "not-stored marker"}[v.Action]
	br := map[breaker.Result]string{breaker.Success: "success", breaker.Failure: "failure", breaker.Excluded: "excluded"}[v.Breaker]
	dl, noRetry, gets := "no", "no", "as relayed"
	if v.DeadLetter != nil {
		dl = v.DeadLetter.Class
	}
	if v.NoRetry {
		noRetry = "yes"
	}
	switch {
	case v.Replace != nil:
		gets = apierror.Wire(v.Replace).Code
	case r.Err != nil:
		gets = apierror.Wire(r.Err).Code
	}
	return []string{key, br, dl, noRetry, gets}
}

// TestOutcomeDoc holds the README's outcome table to Settle, row by row.
func TestOutcomeDoc(t *testing.T) {
	rows := outcomeTable(t, "../../README.md")
	if len(rows) != len(settleDoc) {
		t.Errorf("README's outcome table has %d rows, the test %d", len(rows), len(settleDoc))
	}
	for i := range min(len(rows), len(settleDoc)) {
		d := settleDoc[i]
		want := append([]string{d.ended, d.received}, docRow(d.r, Settle(d.r))...)
		if strings.Join(rows[i], " | ") != strings.Join(want, " | ") {
			t.Errorf("row %d:\n got  %q\n want %q", i+1, rows[i], want)
		}
	}
}

// outcomeTable returns the rows of the table in file whose header's first
// cell is "how the chain ended", backquotes dropped.
func outcomeTable(t *testing.T, file string) [][]string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows [][]string
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "|---"):
			continue
		case !strings.HasPrefix(line, "| "):
			if found {
				return rows
			}
			continue
		}
		cells := strings.Split(strings.ReplaceAll(strings.Trim(line, "| "), "`", ""), " | ")
		if !found {
			found = cells[0] == "how the chain ended"
			continue
		}
		rows = append(rows, cells)
	}
	if !found {
		t.Fatalf("%s has no outcome table", file)
	}
	return rows
}
