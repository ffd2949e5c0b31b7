package config

import (
	"strings"
	"testing"
	"time"
)

// Every key the deploy files set, and replicas, can be set from the
// environment, over the file; a value that does not parse is reported
// with the variable's name and the key it sets.
func TestEnvOverridesDeployKeys(t *testing.T) {
	file := []byte("upstreams:\n  - name: openai\n    base_url: https://api.openai.com/v1\n" +
		"store:\n  kind: redis\n  redis:\n    url: redis://r:6379/0\n    prefix: \"file:\"\n    pool_size: 4\n" +
		"replicas: 1\nserver:\n  shutdown_grace: 10s\n  trusted_proxies: [10.0.0.1]\n")
	c, err := Load(file, env(map[string]string{
		"GATEWAY_REPLICAS":        "3",
		"GATEWAY_REDIS_PREFIX":    "env:",
		"GATEWAY_REDIS_POOL_SIZE": "20",
		"GATEWAY_SHUTDOWN_GRACE":  "45s",
		"GATEWAY_TRUSTED_PROXIES": "10.0.0.5, 172.18.0.0/16",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Replicas != 3 || c.Store.Redis.Prefix != "env:" || c.Store.Redis.PoolSize != 20 || c.Server.ShutdownGrace.D() != 45*time.Second ||
		strings.Join(c.Server.TrustedProxies, " ") != "10.0.0.5 172.18.0.0/16" {
		t.Fatalf("overrides not applied: replicas %d prefix %q pool %d grace %v proxies %v",
			c.Replicas, c.Store.Redis.Prefix, c.Store.Redis.PoolSize, c.Server.ShutdownGrace, c.Server.TrustedProxies)
	}
	_, err = Load(file, env(map[string]string{"GATEWAY_REPLICAS": "three", "GATEWAY_SHUTDOWN_GRACE": "30"}))
	if err == nil || !strings.Contains(err.Error(), `GATEWAY_REPLICAS="three": not a whole number (it sets replicas)`) ||
		!strings.Contains(err.Error(), `GATEWAY_SHUTDOWN_GRACE="30": not a duration`) {
		t.Fatalf("bad values: %v", err)
	}
	for _, o := range envOverrides {
		if !strings.HasPrefix(o.name, "GATEWAY_") || o.key == "" {
			t.Errorf("override %+v", o)
		}
	}
}
