package admin

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/timeline"
)

// TestChartsLayout checks the geometry: every shape inside its lane and
// the plot, stacks adding up to what they stand for.
func TestChartsLayout(t *testing.T) {
	now := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	tl := timeline.New(timeline.Options{Upstreams: []string{"a", "quiet"}, Now: clock})
	for i := range 30 {
		now = now.Add(50 * time.Second)
		for j := range i % 7 {
			class := []string{"success", "transient", "client_error"}[j%3]
			tl.Request("a", class, time.Duration(1+i*j)*time.Millisecond, j%2)
		}
		if i%5 == 0 {
			tl.DeadLetter("a")
			tl.BreakerState("a", []breaker.State{breaker.Open, breaker.HalfOpen, breaker.Closed}[i%3])
		}
		tl.StoreSize(cache.Stats{Records: int64(i * 10)})
	}
	v := buildCharts(tl.Snapshot(), tl.MemoryBytes())
	if len(v.Upstreams) != 2 || v.Upstreams[1].Lat.Empty == "" {
		t.Fatalf("upstreams %d; the quiet one's latency lane says %q", len(v.Upstreams), v.Upstreams[1].Lat.Empty)
	}
	c := v.Upstreams[0]
	inPlot := func(x float64) bool { return x >= chartLeft-0.1 && x <= chartLeft+chartPlot+0.1 }
	for _, l := range []barLane{c.Req, c.Retry, c.Dead} {
		for _, b := range l.Bars {
			sum, n := 0.0, 0
			for _, s := range b.Segs {
				if !inPlot(s.X) || !inPlot(s.X+s.W) || s.Y < l.Top-0.1 || s.Y+s.H > l.Bottom+0.1 {
					t.Errorf("%s %s: rect %+v outside [%v, %v]", l.Label, b.Minute, s, l.Top, l.Bottom)
				}
				sum += s.H
				n += s.Count
			}
			if n != b.Total || sum > l.H+0.5 {
				t.Errorf("%s %s: segments count %d of %d, %.1f high in a lane of %.0f", l.Label, b.Minute, n, b.Total, sum, l.H)
			}
		}
	}
	for _, p := range c.Lat.Points {
		for _, y := range []float64{p.Y50, p.Y99} {
			if y < c.Lat.Top-0.1 || y > c.Lat.Bottom+0.1 || !inPlot(p.X) {
				t.Errorf("latency point %+v outside its lane", p)
			}
		}
		if p.Y99 > p.Y50 {
			t.Errorf("%s: p99 drawn below p50", p.Minute)
		}
	}
	if len(c.Breaker.Cells) != 60 {
		t.Fatalf("%d breaker cells", len(c.Breaker.Cells))
	}
	for _, cell := range c.Breaker.Cells {
		sum := 0.0
		for _, s := range cell.Segs {
			sum += s.H
		}
		if math.Abs(sum-c.Breaker.H) > 0.5 {
			t.Errorf("%s: breaker cell %.1f high in a lane of %.0f", cell.Minute, sum, c.Breaker.H)
		}
	}
	if c.H < c.Breaker.Bottom || c.AxisY > c.H {
		t.Errorf("chart %.0f high, breaker ends at %.0f, axis at %.0f", c.H, c.Breaker.Bottom, c.AxisY)
	}
	if v.Store.Samples != 26 { // 30 samples 50 s apart fall in 26 minutes
		t.Errorf("%d store samples, want 26", v.Store.Samples)
	}
}

// TestChartsRender runs the page's template over charts and checks that
// html/template kept every value (ZgotmplZ marks one it refused) and
// escaped what it should.
func TestChartsRender(t *testing.T) {
	tl := timeline.New(timeline.Options{Upstreams: []string{`odd<name>&"`}})
	tl.Request(`odd<name>&"`, "success", 3*time.Millisecond, 1)
	tl.Request(`odd<name>&"`, "not a class", time.Second, 0)
	ch := buildCharts(tl.Snapshot(), tl.MemoryBytes())
	var buf bytes.Buffer
	if err := adminPageTmpl.ExecuteTemplate(&buf, "page", pageView{Title: "llmgate", Charts: &ch}); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, bad := range []string{"ZgotmplZ", `odd<name>`} {
		if strings.Contains(page, bad) {
			t.Errorf("the page contains %q", bad)
		}
	}
	for _, want := range []string{`data-upstream="odd&lt;name&gt;&amp;&#34;"`, `data-class="success" data-count="1"`,
		`data-class="gateway_error" data-count="1"`, `data-group="success" data-count="1"`, `data-retries="1"`, `<svg class="chart" id="chart-store"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
}

// TestGroupColors: every chart group has a fill of its own.
func TestGroupColors(t *testing.T) {
	fills := map[string]outcome.Group{}
	for _, g := range outcome.Groups() {
		f := groupColors[g.Group]
		if f == "" {
			t.Errorf("group %s has no colour", g.Group)
		} else if o, dup := fills[f]; dup {
			t.Errorf("groups %s and %s share %s", o, g.Group, f)
		}
		fills[f] = g.Group
	}
	if len(groupColors) != len(outcome.Groups()) {
		t.Errorf("%d colours for %d groups", len(groupColors), len(outcome.Groups()))
	}
}

func TestNiceCeilAndDurations(t *testing.T) {
	for in, want := range map[int]int{0: 1, 1: 1, 2: 2, 3: 5, 5: 5, 6: 10, 11: 20, 51: 100, 999: 1000} {
		if got := niceCeil(in); got != want {
			t.Errorf("niceCeil(%d) = %d, want %d", in, got, want)
		}
	}
	for d, want := range map[time.Duration]string{
		0: "0s", 840 * time.Microsecond: "840 µs", 2500 * time.Microsecond: "2.5 ms", 123400 * time.Microsecond: "123.4 ms",
		1520 * time.Millisecond: "1.52 s", 130 * time.Second: "2m10s", time.Millisecond: "1 ms", time.Second: "1 s",
	} {
		if got := preciseDuration(d); got != want {
			t.Errorf("preciseDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
