package admin

import (
	"testing"
	"time"

	"github.com/llmgate/llmgate/gateway/budget"
)

// A cost budget's chart says its amounts in money; spend past the limit
// raises the scale so the line stays in the plot, and the limit line is
// drawn below its top.
func TestBudgetChartOfCostOverLimit(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	s := budget.Series{Client: "alice", Start: start, Status: budget.Status{Budget: "month.cost.total", Window: "month", Unit: "cost",
		Limit: 2_000_000, Spent: 3_000_000, Remaining: 0, Reset: start.AddDate(0, 1, 0)},
		Samples: []budget.Sample{{Slot: 0, At: start, Spent: 0}, {Slot: 30, At: start.AddDate(0, 0, 15), Spent: 3_000_000}}}
	c := budgetChartOf(s)
	if c.LimitText != "2.00" || c.SpentText != "3.00" || c.ScaleText != "3.30" {
		t.Fatalf("texts: limit %q spent %q scale %q", c.LimitText, c.SpentText, c.ScaleText)
	}
	if c.Points != "130,98 580,16.2" {
		t.Fatalf("points %q", c.Points)
	}
	if c.LimitY <= c.Top || c.LimitY >= c.Bottom || c.LimitY <= c.Dots[1].Y {
		t.Fatalf("limit line at y %v, plot %v–%v, top sample at %v", c.LimitY, c.Top, c.Bottom, c.Dots[1].Y)
	}
	if c.Axis[0].Label != "Dec 1 00:00" || c.Axis[4].Label != "Jan 1 00:00" || c.Axis[4].X != 1030 {
		t.Fatalf("axis %+v", c.Axis)
	}
}
