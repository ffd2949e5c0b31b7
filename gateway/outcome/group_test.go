package outcome

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"testing"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/apierror"
)

// classifyClasses reads every Class constant classify declares, so that a
// class added there without a chart group fails this test.
func classifyClasses(t *testing.T) []classify.Class {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../../classify/classify.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []classify.Class
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || vs.Type == nil || len(vs.Values) != 1 {
			return true
		}
		if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Class" {
			return true
		}
		if lit, ok := vs.Values[0].(*ast.BasicLit); ok {
			s, _ := strconv.Unquote(lit.Value)
			out = append(out, classify.Class(s))
		}
		return true
	})
	if len(out) < 10 {
		t.Fatalf("found only %v in classify.go", out)
	}
	return out
}

// TestGroupsCoverEveryClass: every class classify can give and every class
// the gateway logs of its own is in exactly one chart group.
func TestGroupsCoverEveryClass(t *testing.T) {
	gateway := []classify.Class{Replayed, BreakerOpen, GatewayError, BudgetExceeded, BudgetUnmetered, "client_limited",
		"client_deadline", "idempotency_mismatch", "idempotency_in_flight"}
	seen := map[classify.Class]int{}
	for _, c := range Classes() {
		seen[c]++
	}
	for _, c := range append(classifyClasses(t), gateway...) {
		if seen[c] != 1 {
			t.Errorf("class %q is in %d chart groups, want 1", c, seen[c])
		}
	}
	for _, tc := range []struct {
		class classify.Class
		want  Group
	}{
		{classify.Success, GroupSuccess}, {Replayed, GroupReplay}, {classify.ContentFilter, GroupNotRetried},
		{classify.Empty, GroupNotRetried}, {classify.ClientError, GroupClientError}, {classify.Quota, GroupRefused},
		{"budget_exceeded", GroupRefused}, {"budget_unmetered_endpoint", GroupRefused}, {classify.Transient, GroupTransient}, {classify.RateLimited, GroupTransient},
		{BreakerOpen, GroupBreakerOpen}, {classify.Canceled, GroupClientLeft}, {GatewayError, GroupGateway},
		{"no_such_class", GroupGateway},
	} {
		if got := GroupOf(tc.class); got != tc.want {
			t.Errorf("GroupOf(%q) = %q, want %q", tc.class, got, tc.want)
		}
	}
	g := Groups()
	g[0].Classes[0] = "changed"
	if Groups()[0].Classes[0] != classify.Success {
		t.Error("Groups() returns the package's own table")
	}
}

// TestBreakerRefusalClass: a request an open breaker refused is logged and
// counted as breaker_open, not as the gateway's own error.
func TestBreakerRefusalClass(t *testing.T) {
	bo := &apierror.BreakerOpen{Upstream: "u", Model: "m", Err: errors.New("open")}
	if v := Settle(Result{Err: bo, Tried: []string{"u"}}); v.Class != BreakerOpen || v.Breaker != breaker.Excluded ||
		v.DeadLetter == nil || v.DeadLetter.Class != "breaker_open" {
		t.Errorf("breaker refusal settled as %+v", v)
	}
	if c := ErrorClass(fmt.Errorf("refused: %w", &apierror.ClientLimited{Limit: apierror.LimitStorage})); c != "client_limited" {
		t.Errorf("ErrorClass(a client's limit) = %q", c) // a keyed duplicate refused after its wait was gateway_error (review)
	}
	if c := ErrorClass(errors.New("store down")); c != GatewayError {
		t.Errorf("ErrorClass(other) = %q", c)
	}
	if c := ErrorClass(&apierror.DeadlineSpent{}); c != GatewayError {
		t.Errorf("ErrorClass(deadline spent) = %q", c)
	}
}
