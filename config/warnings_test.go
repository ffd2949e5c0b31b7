package config

import (
	"strings"
	"testing"
)

// An empty forward_key_secret is a warning when clients are configured
// (their names and keys go upstream as HMACs under it), and not without
// clients or with a secret.
func TestWarnings(t *testing.T) {
	c := Config{Clients: []Client{{Name: "team-a"}}}
	if w := c.Warnings(); len(w) != 1 || !strings.Contains(w[0], "idempotency.forward_key_secret") || !strings.Contains(w[0], "GATEWAY_FORWARD_KEY_SECRET") {
		t.Fatalf("Warnings = %q, want one naming the field and its env", w)
	}
	c.Idempotency.ForwardKeySecret = "replace-with-a-third-long-random-string"
	if w := c.Warnings(); len(w) != 1 || !strings.Contains(w[0], "placeholder") {
		t.Fatalf("with deploy/'s placeholder: %q", w)
	}
	c.Idempotency.ForwardKeySecret = "s3cret-value"
	if w := c.Warnings(); len(w) != 0 {
		t.Fatalf("with a secret: %q", w)
	}
	if w := (&Config{}).Warnings(); len(w) != 0 {
		t.Fatalf("without clients: %q", w)
	}
}
