package budget

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
)

// countingStore answers every read with spent = the number of reads.
type countingStore struct {
	Store
	reads int64
}

func (s *countingStore) ReadBudgets(_ context.Context, _ string, counters []string) ([]cache.BudgetCount, error) {
	s.reads++
	out := make([]cache.BudgetCount, len(counters))
	for i := range out {
		out[i].Spent = s.reads
	}
	return out, nil
}

// Reads every half second for a minute and a half keep at most
// ChartSamples samples of a minute budget — the last read of each
// second-long slot — and the window that follows starts empty; reads
// within the TTL are one read of the store.
func TestViewSamplesBounded(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	st := &countingStore{}
	l := New(Options{Budgets: map[string][]config.Budget{"alice": {{Window: config.WindowMinute, Tokens: 100}}},
		Store: st, Now: func() time.Time { return now }})
	v := NewView(l, ViewOptions{TTL: 400 * time.Millisecond})
	for range 100 { // 10:00:00 to 10:00:49.5
		v.Snapshot(context.Background())
		v.Snapshot(context.Background())
		now = now.Add(500 * time.Millisecond)
	}
	if st.reads != 100 {
		t.Fatalf("%d reads of the store for 200 snapshots, want 100 (the TTL)", st.reads)
	}
	for range 40 { // to 10:01:09.5
		v.Snapshot(context.Background())
		now = now.Add(500 * time.Millisecond)
	}
	series, failed := v.Chart(context.Background())
	if len(series) != 1 || len(failed) != 0 {
		t.Fatalf("chart: %d series, failed %v", len(series), failed)
	}
	s := series[0]
	// The new window's slots 0..9, and the read of Chart itself at 10:01:10.
	if len(s.Samples) != 11 || s.Samples[0].Slot != 0 || s.Samples[10].Slot != 10 || !s.Start.Equal(now.Truncate(time.Minute)) {
		t.Fatalf("samples after the window turned: %+v", s.Samples)
	}
	if s.Samples[0].Spent != 122 || s.Samples[9].Spent != 140 {
		t.Fatalf("slot 0 spent %d, slot 9 %d; want the last read of each (122, 140)", s.Samples[0].Spent, s.Samples[9].Spent)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(v)
	if mf, err := reg.Gather(); err != nil || len(mf) != 5 {
		t.Fatalf("gathered %d families (%v), want the 5 gauges", len(mf), err)
	}
}

// Within one window the samples never pass ChartSamples.
func TestViewSamplesAtMostPerWindow(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	l := New(Options{Budgets: map[string][]config.Budget{"alice": {{Window: config.WindowMinute, Tokens: 100}}},
		Store: &countingStore{}, Now: func() time.Time { return now }})
	v := NewView(l, ViewOptions{TTL: time.Millisecond})
	for range 600 {
		v.Snapshot(context.Background())
		now = now.Add(99 * time.Millisecond)
	}
	now = time.Date(2026, 12, 2, 10, 0, 59, 0, time.UTC)
	series, _ := v.Chart(context.Background())
	if n := len(series[0].Samples); n != ChartSamples {
		t.Fatalf("%d samples in a minute read 600 times, want %d", n, ChartSamples)
	}
}
