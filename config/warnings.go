package config

import "strings"

// Warnings are what a valid configuration should still change, each in
// words an operator acts on: the field and the fix. None stops the
// gateway: it logs them at startup, and -check-config prints them.
func (c *Config) Warnings() []string {
	var w []string
	if secret := c.Idempotency.ForwardKeySecret; len(c.Clients) > 0 && (secret == "" || strings.HasPrefix(secret, "replace-with-")) {
		what := "empty"
		if secret != "" {
			what = "the placeholder of deploy/'s examples"
		}
		w = append(w, "idempotency.forward_key_secret is "+what+": the X-Llmgate-Tenant header and the Idempotency-Key "+
			"sent upstream are HMACs under it, so whoever sees them (the provider, an inner gateway's logs) can "+
			"test a guessed client name against them, and a guessable key (order-4711) too. Set it to a long "+
			"random value (env GATEWAY_FORWARD_KEY_SECRET), the same on every replica.")
	}
	return w
}
