package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// fieldProblems maps each field Validate complained about to its problems.
func fieldProblems(err error) map[string]string {
	out := map[string]string{}
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		return out
	}
	for _, e := range joined.Unwrap() {
		var fe *FieldError
		if errors.As(e, &fe) {
			out[fe.Field] += fe.Problem
		}
	}
	return out
}

// store.redis.sentinel is read from the file and from the environment,
// where the Sentinels are a comma-separated list that replaces the file's.
func TestSentinelConfigAndEnv(t *testing.T) {
	file := []byte(`
store:
  kind: redis
  redis:
    url: "redis://:data-secret@ignored/2"
    sentinel:
      master: from-file
      addrs: [s1:26379]
`)
	c, err := Load(file, env(map[string]string{"OPENAI_API_KEY": "sk-test"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Store.Redis.Sentinel; got.Master != "from-file" || !reflect.DeepEqual(got.Addrs, []string{"s1:26379"}) {
		t.Fatalf("sentinel from the file: %+v", got)
	}
	c, err = Load(file, env(map[string]string{
		"OPENAI_API_KEY":                  "sk-test",
		"GATEWAY_REDIS_SENTINEL_MASTER":   "mymaster",
		"GATEWAY_REDIS_SENTINEL_ADDRS":    " sentinel-1:26379, sentinel-2:26379 ,",
		"GATEWAY_REDIS_SENTINEL_PASSWORD": "sentinel-secret",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := Sentinel{Master: "mymaster", Addrs: []string{"sentinel-1:26379", "sentinel-2:26379"}, Password: "sentinel-secret"}
	if got := c.Store.Redis.Sentinel; !reflect.DeepEqual(got, want) {
		t.Fatalf("sentinel from the environment: %+v, want %+v", got, want)
	}
	// With Sentinel the URL (credentials, database) may have no host, or
	// be absent.
	for _, u := range []string{"redis://:pw@/0", ""} {
		c.Store.Redis.URL = u
		if err := c.Validate(); err != nil {
			t.Errorf("url %q with sentinel: %v", u, err)
		}
	}
	// Neither password is printed.
	out, _ := yaml.Marshal(c.Redacted())
	if strings.Contains(string(out), "sentinel-secret") || !strings.Contains(string(out), "sentinel-2:26379") {
		t.Fatalf("redacted config:\n%s", out)
	}
	if c.Store.Redis.Sentinel.Password != "sentinel-secret" {
		t.Fatal("Redacted changed the config it copied")
	}
}

// Each mistake in store.redis.sentinel is reported against its field.
func TestSentinelValidation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		set    func(r *Redis)
		field  string
		saying string
	}{
		{"addrs without master", func(r *Redis) { r.Sentinel.Addrs = []string{"s:26379"} },
			"store.redis.sentinel.master", "required with store.redis.sentinel.addrs"},
		{"master without addrs", func(r *Redis) { r.Sentinel.Master = "m" },
			"store.redis.sentinel.addrs", "required with store.redis.sentinel.master"},
		{"an address with no port", func(r *Redis) { r.Sentinel = Sentinel{Master: "m", Addrs: []string{"s:26379", "sentinel-2"}} },
			"store.redis.sentinel.addrs[1]", `"sentinel-2" is not host:port`},
		{"a port out of range", func(r *Redis) { r.Sentinel = Sentinel{Master: "m", Addrs: []string{"s:70000"}} },
			"store.redis.sentinel.addrs[0]", "is not host:port"},
		{"with cluster", func(r *Redis) { r.Sentinel = Sentinel{Master: "m", Addrs: []string{"s:26379"}}; r.Cluster = true },
			"store.redis.cluster", "cannot be combined with store.redis.sentinel"},
		{"no url and no sentinel", func(r *Redis) { r.URL = "" },
			"store.redis.url", "unless store.redis.sentinel.master is set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.Store.Kind = StoreRedis
			c.Store.Redis.URL = "redis://localhost:6379/0"
			tc.set(&c.Store.Redis)
			got := fieldProblems(c.Validate())
			if !strings.Contains(got[tc.field], tc.saying) {
				t.Fatalf("problems %v; want %s: ...%s...", got, tc.field, tc.saying)
			}
		})
	}
}
