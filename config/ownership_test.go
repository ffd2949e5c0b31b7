package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

const ownershipYAML = `
upstreams:
  - name: openai
    base_url: https://api.openai.com/v1
    api_key: sk-shared-secret
    force_store_false: true
  - name: groq
    base_url: https://api.groq.com/openai/v1
clients:
  - name: alice
    key: sk-gw-alice
    upstream_api_keys:
      openai: sk-alice-project-secret
  - name: bob
    key: sk-gw-bob
ownership:
  ttl:
    responses: 240h
`

func TestOwnershipConfig(t *testing.T) {
	c, err := Load([]byte(ownershipYAML), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Clients[0].UpstreamAPIKeys["openai"]; got != "sk-alice-project-secret" {
		t.Errorf("alice's openai key = %q", got)
	}
	if !c.Upstreams[0].ForceStoreFalse || c.Upstreams[1].ForceStoreFalse {
		t.Errorf("force_store_false = %v, %v; want true, false", c.Upstreams[0].ForceStoreFalse, c.Upstreams[1].ForceStoreFalse)
	}
	want := DefaultOwnership().TTL
	want.Responses = Duration(240 * time.Hour)
	if c.Ownership.TTL != want {
		t.Errorf("ownership.ttl = %+v, want %+v (the one set, defaults for the rest)", c.Ownership.TTL, want)
	}
	if d := DefaultOwnership().TTL.Responses.D(); d != 30*24*time.Hour {
		t.Errorf("default responses ttl = %v, want 30 days", d)
	}
}

// TestOwnershipConfigErrors: each problem names its field and the fix, and
// never echoes a key.
func TestOwnershipConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, field, hint string }{
		{"unknown upstream", strings.Replace(ownershipYAML, "      openai: sk-alice", "      opnai: sk-alice", 1),
			"clients[0].upstream_api_keys.opnai", "not a configured upstream"},
		{"empty key", strings.Replace(ownershipYAML, "openai: sk-alice-project-secret", `openai: ""`, 1),
			"clients[0].upstream_api_keys.openai", "remove the entry"},
		{"zero ttl", strings.Replace(ownershipYAML, "responses: 240h", "responses: 0s", 1),
			"ownership.ttl.responses", "must be > 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]byte(tc.yaml), env(nil))
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Load error = %v, want a FieldError", err)
			}
			if fe.Field != tc.field || !strings.Contains(fe.Problem, tc.hint) {
				t.Errorf("error = %v, want field %s and %q", fe, tc.field, tc.hint)
			}
			if strings.Contains(err.Error(), "sk-") {
				t.Errorf("error echoes a key: %v", err)
			}
		})
	}
}

func TestRedactedUpstreamAPIKeys(t *testing.T) {
	c, err := Load([]byte(ownershipYAML), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Redacted()
	out, err := yaml.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"sk-alice-project-secret", "sk-shared-secret"} {
		if strings.Contains(string(out), k) {
			t.Errorf("redacted config shows %s:\n%s", k, out)
		}
	}
	if got := r.Clients[0].UpstreamAPIKeys["openai"]; got != RedactedValue {
		t.Errorf("redacted alice openai key = %q, want %q (the upstream name kept)", got, RedactedValue)
	}
	if c.Clients[0].UpstreamAPIKeys["openai"] != "sk-alice-project-secret" {
		t.Error("Redacted modified its receiver's map")
	}
}
