package budget

import (
	"math"
	"testing"
	"time"

	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/config"
)

func TestWindow(t *testing.T) {
	now := time.Date(2026, 12, 31, 23, 59, 30, 5, time.FixedZone("CET", 3600))
	for _, tc := range []struct {
		kind         string
		start, reset time.Time
	}{
		{config.WindowMinute, time.Date(2026, 12, 31, 22, 59, 0, 0, time.UTC), time.Date(2026, 12, 31, 23, 0, 0, 0, time.UTC)},
		{config.WindowDay, time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
		{config.WindowMonth, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		start, reset := Window(tc.kind, now)
		if !start.Equal(tc.start) || !reset.Equal(tc.reset) {
			t.Errorf("%s: %v, %v; want %v, %v (UTC-aligned)", tc.kind, start, reset, tc.start, tc.reset)
		}
	}
}

// Cost prices each kind of token as the provider bills it, in
// micro-units, rounded up, in integers only.
func TestCost(t *testing.T) {
	// gpt-4o: $2.50 in, $1.25 cached in, $10 out per million.
	gpt4o := config.Price{Input: 2_500_000, CachedInput: 1_250_000, Output: 10_000_000}
	// claude: $3 in, $0.30 cache read, $3.75 cache write, $15 out.
	claude := config.Price{Input: 3_000_000, CachedInput: 300_000, CacheWrite: 3_750_000, Output: 15_000_000}
	for _, tc := range []struct {
		name  string
		count string
		t     classify.Tokens
		p     config.Price
		want  int64
	}{
		{"openai, cached_tokens inside prompt_tokens", config.CountTotal, classify.Tokens{In: 2006, Cached: 1920, Out: 300}, gpt4o,
			(86*2_500_000 + 1920*1_250_000 + 300*10_000_000) / 1_000_000},
		{"anthropic, cache tokens beside input", config.CountTotal, classify.Tokens{In: 12, CacheCreation: 1024, CacheRead: 2048, Out: 6}, claude,
			(12*3_000_000+2048*300_000+1024*3_750_000+6*15_000_000)/1_000_000 + 1}, // 4580.4 rounded up
		{"input only", config.CountInput, classify.Tokens{In: 1000, Out: 1000}, gpt4o, 2500},
		{"output only", config.CountOutput, classify.Tokens{In: 1000, Out: 1000}, gpt4o, 10000},
		{"rounded up", config.CountTotal, classify.Tokens{In: 1}, gpt4o, 3},
		{"no cached price: input's", config.CountInput, classify.Tokens{In: 10, Cached: 10}, config.Price{Input: 1_000_000}, 10},
		{"capped, never wraps", config.CountTotal, classify.Tokens{In: math.MaxInt64}, config.Price{Input: 1_000_000_000_000}, math.MaxInt64},
	} {
		if got := Cost(tc.count, tc.t, tc.p); got != tc.want {
			t.Errorf("%s: Cost = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestEstimate(t *testing.T) {
	s := config.Budgets{BytesPerToken: 4, DefaultMaxTokens: 4096}
	if got := Estimate(s, 401, Output{MaxTokens: 100}); got.In != 101 || got.Out != 100 {
		t.Errorf("Estimate(401 bytes, max 100) = %+v, want in 101 (rounded up), out 100", got)
	}
	if got := Estimate(s, 8, Output{}); got.Out != 4096 {
		t.Errorf("no max_tokens: out %d, want default_max_tokens 4096", got.Out)
	}
	if got := Estimate(s, 8, Output{MaxTokens: 100, Choices: 3}); got.Out != 300 {
		t.Errorf("n=3, max 100: out %d, want 300", got.Out)
	}
	if got := Estimate(s, 8, Output{Choices: 2}); got.Out != 8192 {
		t.Errorf("n=2, no max_tokens: out %d, want 2 × 4096", got.Out)
	}
	if got := Estimate(s, 8, Output{MaxTokens: 1 << 62, Choices: 8}); got.Out != math.MaxInt64 {
		t.Errorf("overflowing n × max: out %d, want MaxInt64 (never fits)", got.Out)
	}
	if got := Estimate(s, 8, Output{MaxTokens: 100, None: true}); got.Out != 0 || got.In != 2 {
		t.Errorf("embedding: %+v, want in 2, out 0", got)
	}
}

// An estimate's prompt may all be written to the prompt cache: it is
// priced at the dearest input price, never below what it can cost.
func TestEstimatePriceCoversCacheWrites(t *testing.T) {
	p := config.Price{Input: 3_000_000, CacheWrite: 3_750_000, CachedInput: 300_000, Output: 15_000_000}
	est := classify.Tokens{In: 1000, Out: 100, Reported: true}
	written := classify.Tokens{In: 0, CacheCreation: 1000, Out: 100, Reported: true}
	if got, most := Cost(config.CountTotal, est, EstimatePrice(p)), Cost(config.CountTotal, written, p); got < most {
		t.Fatalf("estimate priced %d, below the %d its prompt costs when written to the cache", got, most)
	}
	if got := Cost(config.CountTotal, est, EstimatePrice(config.Price{Input: 2, Output: 4})); got != Cost(config.CountTotal, est, config.Price{Input: 2, Output: 4}) {
		t.Errorf("without cache prices, the estimate's price changed: %d", got)
	}
}
