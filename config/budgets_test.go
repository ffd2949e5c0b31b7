package config

import (
	"testing"
)

func TestParseMoney(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Money
		ok   bool
	}{
		{"2.50", 2_500_000, true},
		{"0.000075", 75, true},
		{"12", 12_000_000, true},
		{".5", 500_000, true},
		{"-1", -1_000_000, true},
		{"0.1234567", 0, false},
		{"1e3", 0, false},
		{"ten", 0, false},
		{"", 0, false},
		{"9223372036854", 0, false}, // over what micro-units hold
	} {
		got, err := ParseMoney(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseMoney(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
	if s := Money(2_500_075).String(); s != "2.500075" {
		t.Errorf("String = %q", s)
	}
}

func TestPriceOf(t *testing.T) {
	mini := Price{Input: 150_000}
	glob := Price{Input: 2_500_000}
	def := Price{Input: 5_000_000}
	u := Upstream{Prices: map[string]Price{"gpt-4o-mini": mini, "gpt-4o*": glob}}
	for model, want := range map[string]Price{"gpt-4o-mini": mini, "gpt-4o-2024": glob} {
		if got, ok := u.PriceOf(model); !ok || got != want {
			t.Errorf("PriceOf(%q) = %v, %v", model, got, ok)
		}
	}
	if _, ok := u.PriceOf("o1"); ok {
		t.Error("an unnamed model without default_price is priced")
	}
	u.DefaultPrice = &def
	if got, ok := u.PriceOf("o1"); !ok || got != def {
		t.Errorf("PriceOf(o1) = %v, %v; want the default", got, ok)
	}
}

func TestAllBudgets(t *testing.T) {
	c := Client{Budgets: []Budget{{Window: WindowDay, Tokens: 10}}}
	got := c.AllBudgets(ClientLimits{TokensPerMinute: 500})
	if len(got) != 2 || got[1] != (Budget{Window: WindowMinute, Tokens: 500, Count: CountTotal}) {
		t.Fatalf("AllBudgets = %+v", got)
	}
	if len(c.Budgets) != 1 {
		t.Error("AllBudgets changed the client's own list")
	}
	c.Limits.TokensPerMinute = -1
	if got := c.AllBudgets(ClientLimits{TokensPerMinute: 500}); len(got) != 1 {
		t.Errorf("tokens_per_minute -1 did not lift the default: %+v", got)
	}
	// A budget of its own with tokens_per_minute's id: one budget, the
	// stricter limit, whichever it is.
	for _, tc := range []struct{ own, tpm, want int64 }{{5000, 500, 500}, {300, 500, 300}} {
		c := Client{Budgets: []Budget{{Window: WindowDay, Tokens: 10}, {Window: WindowMinute, Tokens: tc.own}}}
		got := c.AllBudgets(ClientLimits{TokensPerMinute: tc.tpm})
		if len(got) != 2 || got[1] != (Budget{Window: WindowMinute, Tokens: tc.want}) {
			t.Errorf("own %d, tokens_per_minute %d: AllBudgets = %+v, want one minute budget of %d", tc.own, tc.tpm, got, tc.want)
		}
		if c.Budgets[1].Tokens != tc.own {
			t.Error("AllBudgets changed the client's own list")
		}
	}
	if id := (Budget{Window: WindowMonth, Cost: 1, Count: CountInput, Model: "gpt-4o*"}).ID(); id != "month.cost.input.gpt-4o*" {
		t.Errorf("ID = %q", id)
	}
}
