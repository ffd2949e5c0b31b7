package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// env returns a getenv over a fixed map, so no test touches the process
// environment.
func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

// expectedErrors maps each testdata/*.bad.yml file to substrings its error
// must contain. TestBadConfigs fails if a .bad.yml file is missing here.
var expectedErrors = map[string][]string{
	"memory_limit_ratio.bad.yml":      {"memory.limit_ratio: 1.2 is outside (0, 1]"},
	"memory_budget_small.bad.yml":     {"memory.budget_bytes: 1000 is under 8 MiB"},
	"max_inflight_below_body.bad.yml": {"limits.max_inflight_bytes: 1024 is less than limits.max_body_bytes (2048)"},
	"admission_wait_negative.bad.yml": {"limits.admission_wait: -1s is negative"},

	"unknown_key.bad.yml":          {"line 4: field retri not found in type config.Config"},
	"unknown_upstream_key.bad.yml": {"line 4: field api-key not found in type config.Upstream"},
	"wrong_type.bad.yml":           {"line 5: cannot unmarshal !!str `three` into int"},
	"duration_no_unit.bad.yml":     {`line 5: retry.base_delay: duration 30 has no unit (add one, e.g. "30s" or "30ms")`},
	"duration_invalid.bad.yml":     {`line 4: upstreams[0].timeout: invalid duration "soon" (write a number with a unit, e.g. "30s", "5m", "1h30m")`},
	"two_documents.bad.yml":        {"line 4: a second YAML document; the config is one document"},

	"upstream_duplicate_name.bad.yml":   {`upstreams[1].name: duplicate upstream name "openai" (names must be unique)`},
	"upstream_empty_name.bad.yml":       {"upstreams[0].name: empty"},
	"upstream_empty_base_url.bad.yml":   {"upstreams[0].base_url: empty (set the provider's API root, e.g. https://api.openai.com/v1)"},
	"upstream_bad_scheme.bad.yml":       {`upstreams[0].base_url: "ftp://x" is not an http(s) URL`},
	"upstream_unknown_fallback.bad.yml": {`upstreams[0].fallbacks[0]: unknown upstream "nope"`},
	"upstream_self_fallback.bad.yml":    {`upstreams[0].fallbacks[0]: "openai" is the upstream itself`},
	"upstream_empty_model.bad.yml":      {`upstreams[0].models[1]: empty pattern (use "*" to serve every model)`},
	"upstream_api_unknown.bad.yml":      {`upstreams[0].api: "gemini" is not openai or anthropic (leave it out for openai)`},
	"upstream_auth_unknown.bad.yml":     {`upstreams[0].auth: "basic" is not x-api-key or bearer (leave it out: x-api-key for an anthropic upstream, bearer otherwise)`},
	"upstream_fallback_mixed_api.bad.yml": {
		`upstreams[0].fallbacks[0]: "openai" speaks the openai API, "anthropic" the anthropic API; a fallback chain cannot mix APIs (list a fallback of the same api)`,
	},
	"upstreams_none.bad.yml": {"upstreams: none configured (set OPENAI_API_KEY for the default OpenAI upstream, or list upstreams in the config file; -demo runs a simulated one)"},

	"client_empty_key.bad.yml":          {"clients[0].key: empty (set key, or key_sha256)"},
	"client_duplicate_name.bad.yml":     {`clients[1].name: duplicate client name "alice" (names must be unique)`},
	"client_both_keys.bad.yml":          {"clients[0]: both key and key_sha256 are set (set exactly one)"},
	"client_bad_sha256.bad.yml":         {"clients[0].key_sha256: not 64 hex characters (the hex SHA-256 of the key)"},
	"client_duplicate_key.bad.yml":      {`clients[1].key: same key as clients[0] ("alice"); keys must be unique`},
	"admin_token_is_client_key.bad.yml": {`admin_token: same as the key of clients[0] ("alice"); the admin token must not be a client key`},

	"client_limits_negative.bad.yml":        {"client_limits.max_concurrent: -1 is not >= 0 (0 is no limit)"},
	"client_derive_key_retry_count.bad.yml": {"clients[0].derive_idempotency_key.from_header: x-stainless-retry-count changes on every retry, so a retry would never match; name the header that identifies the session, e.g. x-claude-code-session-id"},
	"client_derive_key_bad_name.bad.yml":    {`clients[0].derive_idempotency_key.from_header: "x session" is not a header name`},
	"client_derive_key_idem.bad.yml":        {"clients[0].derive_idempotency_key.from_header: Idempotency-Key is the key itself"},
	"client_derive_key_cred.bad.yml":        {"clients[0].derive_idempotency_key.from_header: Authorization is the client's credential, not a session"},

	"client_own_limits_range.bad.yml": {"clients[0].limits.requests_per_second: -2 is not -1 (no limit), 0 (as client_limits) or more"},
	"budget_window.bad.yml":           {"clients[0].budgets[0].window: \"week\" is not minute, day or month"},
	"budget_both_caps.bad.yml":        {"clients[0].budgets[0]: both tokens and cost are set (one budget caps one of them: write two budgets)"},
	"budget_no_cap.bad.yml":           {"clients[0].budgets[0]: neither tokens nor cost is set (set the cap, e.g. tokens: 1000000 or cost: \"25.00\")"},
	"budget_count.bad.yml":            {"clients[0].budgets[0].count: \"prompt\" is not input, output or total"},
	"budget_duplicate.bad.yml":        {"clients[0].budgets[1]: same window, unit, count and model as clients[0].budgets[0] (keep one)"},
	"budget_cost_unpriced.bad.yml":    {"clients[0].budgets[0].cost: no upstream has prices or default_price, so no cost is ever counted (set upstreams[].prices)"},
	"budget_money_decimals.bad.yml":   {"line 5: upstreams[0].prices.gpt-4o.input: \"2.5000001\" has more than six decimals (amounts are kept in micro-units)"},
	"budget_money_text.bad.yml":       {"line 5: upstreams[0].prices.gpt-4o.output: \"ten\" is not an amount (write units with up to six decimals, e.g. \"2.50\")"},
	"budget_price_negative.bad.yml":   {"upstreams[0].default_price.input: -1.000000 is negative"},
	"budget_tpm_negative.bad.yml":     {"client_limits.tokens_per_minute: -1 is not >= 0 (0 is no limit)"},
	"budget_reservation_ttl.bad.yml":  {"budgets.reservation_ttl: 5m0s must be longer than retry.deadline (10m0s): a reservation must outlast the call it holds budget for"},
	"budget_on_store_error.bad.yml":   {"budgets.on_store_error: \"maybe\" is not refuse or allow"},
	"client_own_burst.bad.yml":        {"clients[0].limits.burst: must be >= 0 (0: as many as one second's rate)"},
	"replicas_badger.bad.yml":         {"replicas: 2 replicas need store.kind: redis (a Badger data dir belongs to one process)"},
	"replicas_zero.bad.yml":           {"replicas: must be >= 1 (the number of gateway processes sharing the traffic)"},
	"usage_rescan.bad.yml":            {"store.usage_rescan: -1m is negative"},

	"retry_max_attempts.bad.yml":       {"retry.max_attempts: must be >= 1 (1 means no retries)"},
	"negative_duration.bad.yml":        {"retry.deadline: -1m is negative"},
	"budget_ratio.bad.yml":             {"retry.budget_ratio: 1.5 is outside [0, 1]"},
	"failure_ratio.bad.yml":            {"breaker.failure_ratio: -0.1 is outside [0, 1]"},
	"breaker_scope.bad.yml":            {`breaker.scope: "per_model" is not model (a breaker per upstream and model, the default) or upstream (one per upstream)`},
	"store_kind.bad.yml":               {`store.kind: "mongo" is not badger or redis`},
	"redis_url_missing.bad.yml":        {"store.redis.url: required when store.kind is redis"},
	"redis_url_scheme.bad.yml":         {"store.redis.url: not a redis:// or rediss:// URL with a host"},
	"log_format.bad.yml":               {`log.format: "xml" is not json or text`},
	"log_level.bad.yml":                {`log.level: "verbose" is not debug, info, warn or error`},
	"limits.bad.yml":                   {"limits.max_body_bytes: must be > 0"},
	"passthrough_prefix.bad.yml":       {`passthrough.routes[0].prefix: "/v1/chat/completions" is not a passthrough path (use one of /v1/moderations,`},
	"passthrough_prefix_slash.bad.yml": {`passthrough.routes[0].prefix: "/v1/files/" is not a passthrough path`},
	"passthrough_upstream.bad.yml":     {`passthrough.routes[0].upstream: unknown upstream "nope" (name one under upstreams, or leave it empty for the first)`},
	"passthrough_duplicate.bad.yml":    {`passthrough.routes[1].prefix: "/v1/audio" is listed twice`},
	"passthrough_spool_max.bad.yml":    {"passthrough.spool_max_bytes: must be >= 0"},
	"passthrough_spool_total.bad.yml":  {"passthrough.spool_max_total_bytes: must be >= 0"},
	"store_space_negative.bad.yml": {
		"store.min_free_bytes: -5 must be >= 0 (0: derived from the store's options)",
	},
	"trusted_proxy_invalid.bad.yml": {
		`server.trusted_proxies[1]: "10.0.0.0/33" is not an IP address or a CIDR range (e.g. 10.0.0.5 or 172.18.0.0/16)`,
	},
	"trusted_proxy_everyone.bad.yml": {
		`server.trusted_proxies[0]: "0.0.0.0/0" trusts every address, so any client could claim any address and scheme; list your proxies' addresses`,
	},
	"cookie_secure.bad.yml":     {`server.cookie_secure: "yes" is not auto, true or false`},
	"read_body_timeout.bad.yml": {"server.unauthenticated_read_body_timeout: must be > 0"},
	"tracing_endpoint.bad.yml": {
		"tracing.endpoint: not an http(s) URL with a host (e.g. http://otel-collector:4318/v1/traces)",
	},
	"tracing_sample_ratio.bad.yml": {"tracing.sample_ratio: 2 is outside [0, 1]"},
	"listen_not_hostport.bad.yml": {
		`listen: "x" is not host:port (e.g. 127.0.0.1:8080, or :8080 for every interface)`,
	},
	"insecure_listen.bad.yml": {
		"listen: 0.0.0.0:8080 is not a loopback address and no clients are configured, " +
			"so anyone who can reach it could spend your provider keys; " +
			"configure clients: or set allow_insecure_listen: true",
	},

	"redis_wait.bad.yml":          {"store.redis.wait_timeout: 2s must be under store.op_timeout (2s)"},
	"redis_wait_negative.bad.yml": {"store.redis.wait_replicas: must be >= 0"},
}

func TestBadConfigs(t *testing.T) {
	files, err := filepath.Glob("testdata/*.bad.yml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(expectedErrors) {
		t.Errorf("%d testdata/*.bad.yml files, %d entries in expectedErrors", len(files), len(expectedErrors))
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			want, ok := expectedErrors[name]
			if !ok {
				t.Fatalf("no entry in expectedErrors")
			}
			_, err := LoadFile(f, env(nil))
			if err == nil {
				t.Fatalf("LoadFile succeeded, want error containing %q", want)
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error:\n%v\nwant it to contain:\n%s", err, w)
				}
			}
			// One problem per file: a second message would mean the file
			// (or a check) is not as narrow as it claims.
			if n := len(strings.Split(err.Error(), "\n")); n != 1 && !strings.Contains(err.Error(), "yaml: unmarshal errors") {
				t.Errorf("error has %d lines, want 1:\n%v", n, err)
			}
		})
	}
}

// TestValidateJoinsEveryProblem checks that Validate reports all problems at
// once, each as a *FieldError.
func TestValidateJoinsEveryProblem(t *testing.T) {
	c := Default()
	c.Upstreams = []Upstream{{Name: "a"}, {Name: "a", BaseURL: "https://x/v1", Timeout: Duration(time.Second)}}
	c.Retry.MaxAttempts = 0
	c.Log.Level = "loud"
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate succeeded")
	}
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("%v is not a *FieldError", e)
		}
		fields = append(fields, fe.Field)
	}
	want := []string{"upstreams[0].base_url", "upstreams[1].name", "upstreams[0].timeout", "retry.max_attempts", "log.level"}
	if !reflect.DeepEqual(fields, want) {
		t.Errorf("fields = %q, want %q", fields, want)
	}
}

func TestGoodConfig(t *testing.T) {
	c, err := LoadFile("testdata/good.yml", env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Listen:     "0.0.0.0:9090",
		DataDir:    "/var/lib/llmgate",
		AdminToken: "admin-secret-token",
		Upstreams: []Upstream{
			{
				Name:           "openai",
				BaseURL:        "https://api.openai.com/v1", // trailing slash removed
				APIKey:         "sk-openai-secret",
				Models:         []string{"gpt-4o*", "o1-*"},
				Timeout:        Duration(90 * time.Second),
				Fallbacks:      []string{"groq", "ollama"},
				MaxIdleConns:   64,
				Cache:          true,
				PropagateTrace: new(false),
				API:            APIOpenAI,
				Auth:           AuthBearer,
			},
			{
				Name:         "groq",
				BaseURL:      "https://api.groq.com/openai/v1",
				APIKey:       "gsk-groq-secret",
				Models:       []string{"llama-*", "meta-llama/*"},
				Timeout:      Duration(DefaultUpstreamTimeout),
				MaxIdleConns: DefaultUpstreamMaxIdleConns,
				API:          APIOpenAI,
				Auth:         AuthBearer,
			},
			{
				Name:         "ollama",
				BaseURL:      "http://localhost:11434/v1",
				Models:       []string{"*"},
				Timeout:      Duration(DefaultUpstreamTimeout),
				MaxIdleConns: DefaultUpstreamMaxIdleConns,
				Internal:     true,
				API:          APIOpenAI,
				Auth:         AuthBearer,
			},
			{
				Name:             "anthropic",
				BaseURL:          "https://api.anthropic.com",
				APIKey:           "sk-ant-secret",
				Models:           []string{"claude-*"},
				Timeout:          Duration(DefaultUpstreamTimeout),
				MaxIdleConns:     DefaultUpstreamMaxIdleConns,
				API:              APIAnthropic,
				Auth:             AuthXAPIKey,
				AnthropicVersion: DefaultAnthropicVersion,
			},
		},
		Clients: []Client{
			{Name: "alice", Key: "sk-gw-alice-secret",
				Limits: ClientLimits{RequestsPerSecond: 2.5, Burst: 10, MaxConcurrent: -1}},
			{Name: "bob", KeySHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}, // lower-cased
		},
		ClientLimits: ClientLimits{RequestsPerSecond: 1, Burst: 3, MaxConcurrent: 4, MaxStoredBytes: 1 << 20},
		Replicas:     3,
		Retry: Retry{
			MaxAttempts:        4,
			BaseDelay:          Duration(500 * time.Millisecond),
			MaxDelay:           Duration(20 * time.Second),
			Deadline:           Duration(5 * time.Minute),
			BudgetRatio:        0.1,
			BudgetMinPerSecond: 5,
			BudgetWindow:       Duration(30 * time.Second),
		},
		Breaker: Breaker{
			Scope:               BreakerScopeModel,
			ConsecutiveFailures: 3,
			FailureRatio:        0.5,
			MinRequests:         10,
			Interval:            Duration(2 * time.Minute),
			OpenTimeout:         Duration(15 * time.Second),
			HalfOpenRequests:    2,
		},
		Idempotency: Idempotency{
			TTL:             Duration(12 * time.Hour),
			RequireKey:      true,
			WaitTimeout:     Duration(30 * time.Second),
			Lease:           Duration(10 * time.Second),
			CacheTTL:        Duration(30 * time.Minute),
			MaxRecordBytes:  1 << 20,
			MaxRecordEvents: 5000, MaxDetached: 256,
		},
		Store: Store{
			Kind:       StoreRedis,
			SyncWrites: true,
			GCInterval: Duration(5 * time.Minute), WritebackInterval: Duration(100 * time.Millisecond), OpTimeout: Duration(5 * time.Second),
			UsageRescan: Duration(2 * time.Minute),
			MaxBytes:    768 << 20,
			Redis: Redis{
				URL:      "rediss://default:redis-secret-pw@cache.internal:6380/2",
				PoolSize: 20,
				Prefix:   "gw:",
				Cluster:  true,
				// Not in good.yml: the default.
				WaitTimeout: Duration(time.Second),
			},
		},
		Limits: Limits{
			MaxBodyBytes:      16 << 20,
			MaxHeaderBytes:    32 << 10,
			MaxJSONDepth:      32,
			StreamIdleTimeout: Duration(45 * time.Second),
			AdmissionWait:     Duration(2 * time.Second),
		},
		Memory: Memory{LimitRatio: 0.8},
		Log:    Log{Format: "text", Level: "debug"},
		Server: Server{
			ReadHeaderTimeout:              Duration(5 * time.Second),
			ReadBodyTimeout:                Duration(2 * time.Minute),
			UnauthenticatedReadBodyTimeout: Duration(5 * time.Second),
			IdleTimeout:                    Duration(90 * time.Second),
			WriteStallTimeout:              Duration(30 * time.Second),
			ShutdownGrace:                  Duration(time.Minute),
			TrustedProxies:                 []string{"10.0.0.5", "172.18.0.0/16", "::ffff:192.0.2.1", "2001:db8::/48"},
			CookieSecure:                   CookieSecureTrue,
		},
		DeadLetters: DeadLetters{
			TTL:                Duration(72 * time.Hour),
			MaxBodyBytes:       64 << 10,
			AlertThreshold:     3,
			AlertGrowthPerHour: 20,
			WebhookURL:         "https://hooks.slack.com/services/T000/B000/webhook-secret-token?sig=query-secret",
			WebhookTimeout:     Duration(2 * time.Second),
			ReplayPerSecond:    2.5,
			MaxPerClient:       1000,
		},
		Tracing: Tracing{
			Endpoint:    "https://trace-user:tracing-secret@otel.internal:4318/v1/traces?token=trace-query-secret",
			SampleRatio: 0.25,
		},
		Ownership: DefaultOwnership(),
		Budgets:   Budgets{DefaultMaxTokens: 4096, BytesPerToken: 4, OnStoreError: OnStoreErrorRefuse},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("LoadFile(good.yml) =\n%+v\nwant\n%+v", c, want)
	}

	// Round trip: what Marshal writes, Load reads back unchanged.
	out, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Load(out, env(nil))
	if err != nil {
		t.Fatalf("Load(Marshal(c)): %v\n%s", err, out)
	}
	// Compared as YAML, since an empty list may come back nil.
	if out2, _ := yaml.Marshal(again); string(out2) != string(out) {
		t.Errorf("round trip changed the config:\n%s\nbecame\n%s", out, out2)
	}
}

func TestExampleConfig(t *testing.T) {
	c, err := LoadFile("example.yaml", env(map[string]string{
		"OPENAI_API_KEY":        "sk-openai",
		"ALICE_KEY":             "sk-gw-alice",
		"ALICE_OPENAI_KEY":      "sk-alice-openai",
		"LLMGATE_ADMIN_TOKEN":   "admin",
		"LLMGATE_ALERT_WEBHOOK": "https://hooks.slack.com/services/T/B/x",
	}))
	if err != nil {
		t.Fatal(err)
	}
	// The example documents the defaults, so apart from what it fills in
	// for illustration it must equal Default.
	d := Default()
	c.Upstreams, c.Clients, c.AdminToken, c.DeadLetters.WebhookURL = nil, nil, "", ""
	c.Passthrough.Routes = nil
	if !reflect.DeepEqual(c, d) {
		t.Errorf("example.yaml drifted from Default():\n got %+v\nwant %+v", c, d)
	}

	// Every key the example sets is a key Config has, and every key Config
	// has appears in the example.
	data, err := os.ReadFile("example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	full := Default()
	full.Upstreams = []Upstream{{}}
	full.Clients = []Client{{}}
	var want, got map[string]any
	b, _ := yaml.Marshal(full)
	if err := yaml.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range missingKeys(want, got, "") {
		t.Errorf("example.yaml does not mention %s", k)
	}
}

// missingKeys lists the key paths of want that got lacks. For lists it
// takes the union of the keys in got's elements.
func missingKeys(want, got any, path string) []string {
	var missing []string
	switch w := want.(type) {
	case map[string]any:
		g, _ := got.(map[string]any)
		for k, wv := range w {
			p := strings.TrimPrefix(path+"."+k, ".")
			gv, ok := g[k]
			if !ok {
				missing = append(missing, p)
				continue
			}
			missing = append(missing, missingKeys(wv, gv, p)...)
		}
	case []any:
		g, _ := got.([]any)
		union := map[string]any{}
		for _, e := range g {
			if m, ok := e.(map[string]any); ok {
				for k, v := range m {
					union[k] = v
				}
			}
		}
		if len(w) > 0 {
			if _, ok := w[0].(map[string]any); ok {
				missing = append(missing, missingKeys(w[0], union, path+"[]")...)
			}
		}
	}
	return missing
}

func TestZeroConfig(t *testing.T) {
	c, err := Load(nil, env(map[string]string{"OPENAI_API_KEY": "sk-zero"}))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Upstreams = []Upstream{{
		Name:         "openai",
		BaseURL:      "https://api.openai.com/v1",
		APIKey:       "sk-zero",
		Models:       []string{"*"},
		Timeout:      Duration(120 * time.Second),
		MaxIdleConns: 256,
		API:          APIOpenAI,
		Auth:         AuthBearer,
	}}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Load(nil) =\n%+v\nwant\n%+v", c, want)
	}
	if c.Listen != "127.0.0.1:8080" || !c.ListenIsLoopback() {
		t.Errorf("Listen = %q, want loopback 127.0.0.1:8080", c.Listen)
	}

	// OPENAI_BASE_URL alone (a local server with no key) is enough.
	c, err = LoadFile("", env(map[string]string{"OPENAI_BASE_URL": "http://localhost:11434/v1/"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Upstreams) != 1 || c.Upstreams[0].BaseURL != "http://localhost:11434/v1" || c.Upstreams[0].APIKey != "" {
		t.Errorf("Upstreams = %+v", c.Upstreams)
	}

	// Nothing at all: a clear error, not a gateway that serves nothing.
	_, err = Load(nil, nil)
	if err == nil || !strings.Contains(err.Error(), "upstreams: none configured") {
		t.Errorf("Load(nil, nil) error = %v", err)
	}
}

func TestDefaults(t *testing.T) {
	d := Default()
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen", d.Listen, "127.0.0.1:8080"},
		{"data_dir", d.DataDir, "./data"},
		{"retry.max_attempts", d.Retry.MaxAttempts, 3},
		{"retry.base_delay", d.Retry.BaseDelay.D(), time.Second},
		{"retry.max_delay", d.Retry.MaxDelay.D(), 30 * time.Second},
		{"retry.deadline", d.Retry.Deadline.D(), 10 * time.Minute},
		{"retry.budget_ratio", d.Retry.BudgetRatio, 0.2},
		{"retry.budget_min_per_second", d.Retry.BudgetMinPerSecond, 10.0},
		{"retry.budget_window", d.Retry.BudgetWindow.D(), 10 * time.Second},
		{"breaker.consecutive_failures", d.Breaker.ConsecutiveFailures, uint32(5)},
		{"breaker.open_timeout", d.Breaker.OpenTimeout.D(), 30 * time.Second},
		{"breaker.interval", d.Breaker.Interval.D(), 60 * time.Second},
		{"breaker.min_requests", d.Breaker.MinRequests, uint32(20)},
		{"breaker.half_open_requests", d.Breaker.HalfOpenRequests, uint32(1)},
		{"breaker.scope", d.Breaker.Scope, "model"},
		{"idempotency.ttl", d.Idempotency.TTL.D(), 24 * time.Hour},
		{"idempotency.wait_timeout", d.Idempotency.WaitTimeout.D(), 60 * time.Second},
		{"idempotency.lease", d.Idempotency.Lease.D(), 30 * time.Second},
		{"idempotency.cache_ttl", d.Idempotency.CacheTTL.D(), time.Hour},
		{"idempotency.max_record_bytes", d.Idempotency.MaxRecordBytes, int64(8 << 20)},
		{"idempotency.max_record_events", d.Idempotency.MaxRecordEvents, 100000},
		{"store.kind", d.Store.Kind, "badger"},
		{"memory.limit_ratio", d.Memory.LimitRatio, 0.8},
		{"memory.budget_bytes", d.Memory.BudgetBytes, int64(0)},
		{"limits.max_inflight_bytes", d.Limits.MaxInflightBytes, int64(0)},
		{"limits.admission_wait", d.Limits.AdmissionWait.D(), 2 * time.Second},
		{"store.gc_interval", d.Store.GCInterval.D(), 10 * time.Minute},
		{"store.writeback_interval", d.Store.WritebackInterval.D(), 100 * time.Millisecond},
		{"store.redis.write_v1_records", d.Store.Redis.WriteV1Records, false},
		{"store.redis.prefix", d.Store.Redis.Prefix, "llmgate:"},
		{"limits.max_body_bytes", d.Limits.MaxBodyBytes, int64(32 << 20)},
		{"limits.max_header_bytes", d.Limits.MaxHeaderBytes, 64 << 10},
		{"limits.max_json_depth", d.Limits.MaxJSONDepth, 64},
		{"limits.stream_idle_timeout", d.Limits.StreamIdleTimeout.D(), 60 * time.Second},
		{"log.format", d.Log.Format, "json"},
		{"log.level", d.Log.Level, "info"},
		{"server.read_header_timeout", d.Server.ReadHeaderTimeout.D(), 10 * time.Second},
		{"server.idle_timeout", d.Server.IdleTimeout.D(), 120 * time.Second},
		{"server.shutdown_grace", d.Server.ShutdownGrace.D(), 30 * time.Second},
		{"server.read_body_timeout", d.Server.ReadBodyTimeout.D(), 5 * time.Minute},
		{"server.unauthenticated_read_body_timeout", d.Server.UnauthenticatedReadBodyTimeout.D(), 10 * time.Second},
		{"server.trusted_proxies", len(d.Server.TrustedProxies), 0},
		{"server.cookie_secure", d.Server.CookieSecure, "auto"},
		{"dead_letters.ttl", d.DeadLetters.TTL.D(), 168 * time.Hour},
		{"dead_letters.max_body_bytes", d.DeadLetters.MaxBodyBytes, 256 << 10},
		{"dead_letters.alert_threshold", d.DeadLetters.AlertThreshold, 10},
		{"dead_letters.webhook_timeout", d.DeadLetters.WebhookTimeout.D(), 5 * time.Second},
		{"dead_letters.replay_per_second", d.DeadLetters.ReplayPerSecond, 5.0},
		{"dead_letters.max_per_client", d.DeadLetters.MaxPerClient, 1000},
		{"tracing.endpoint", d.Tracing.Endpoint, ""},
		{"tracing.sample_ratio", d.Tracing.SampleRatio, 1.0},
		{"tracing.trust_client_context", d.Tracing.TrustClientContext, true},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestEnvOverrides(t *testing.T) {
	file := []byte(`
listen: 127.0.0.1:1111
data_dir: /file
admin_token: file-token
upstreams:
  - name: vllm
    base_url: http://vllm:8000/v1
store:
  kind: badger
log:
  format: json
  level: info
`)
	c, err := Load(file, env(map[string]string{
		"GATEWAY_ADDR":        "[::1]:2222",
		"GATEWAY_DATA_DIR":    "/env",
		"GATEWAY_ADMIN_TOKEN": "env-token",
		"GATEWAY_STORE":       "redis",
		"GATEWAY_REDIS_URL":   "redis://localhost:6379/0",
		"GATEWAY_LOG_FORMAT":  "text",
		"GATEWAY_LOG_LEVEL":   "warn",
		// The file lists upstreams, so these add nothing.
		"OPENAI_API_KEY":  "sk-ignored",
		"OPENAI_BASE_URL": "https://ignored/v1",
	}))
	if err != nil {
		t.Fatal(err)
	}
	got := []string{c.Listen, c.DataDir, c.AdminToken, c.Store.Kind, c.Store.Redis.URL, c.Log.Format, c.Log.Level}
	want := []string{"[::1]:2222", "/env", "env-token", "redis", "redis://localhost:6379/0", "text", "warn"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if len(c.Upstreams) != 1 || c.Upstreams[0].Name != "vllm" {
		t.Errorf("Upstreams = %+v, want only vllm", c.Upstreams)
	}
	if !c.ListenIsLoopback() {
		t.Errorf("[::1]:2222 is loopback")
	}

	c, err = Load(file, env(map[string]string{"GATEWAY_MEMORY_LIMIT_RATIO": "0.65"}))
	if err != nil || c.Memory.LimitRatio != 0.65 {
		t.Errorf("GATEWAY_MEMORY_LIMIT_RATIO=0.65: LimitRatio %v, %v", c.Memory.LimitRatio, err)
	}
	if _, err = Load(file, env(map[string]string{"GATEWAY_MEMORY_LIMIT_RATIO": "most"})); err == nil ||
		!strings.Contains(err.Error(), `GATEWAY_MEMORY_LIMIT_RATIO="most": not a number`) {
		t.Errorf("GATEWAY_MEMORY_LIMIT_RATIO=most: %v", err)
	}

	// An empty variable is unset: the file's value stays.
	c, err = Load(file, env(map[string]string{"GATEWAY_ADDR": ""}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:1111" {
		t.Errorf("Listen = %q, want the file's", c.Listen)
	}
}

// OpenTelemetry's own variables set the traces endpoint as its
// specification says: the signal's endpoint as is, the base endpoint plus
// /v1/traces; OTEL_SDK_DISABLED turns tracing off.
func TestOTelEnv(t *testing.T) {
	file := []byte("upstreams: [{name: a, base_url: 'http://a/v1'}]\ntracing: {endpoint: 'http://file:4318/v1/traces'}\n")
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"file", nil, "http://file:4318/v1/traces"},
		{"base", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, "http://collector:4318/v1/traces"},
		{"base with path", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector/otlp"}, "https://collector/otlp/v1/traces"},
		{"signal wins", map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://collector:4318",
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/custom",
		}, "http://traces:4318/custom"},
		{"disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "TRUE"}, ""},
		{"not disabled", map[string]string{"OTEL_SDK_DISABLED": "false"}, "http://file:4318/v1/traces"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(file, env(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if c.Tracing.Endpoint != tc.want {
				t.Errorf("tracing.endpoint = %q, want %q", c.Tracing.Endpoint, tc.want)
			}
		})
	}
}

// TestUpstreamAPIDefaults: an upstream speaks OpenAI's API unless it says
// anthropic; an Anthropic upstream's key goes out as x-api-key with
// anthropic-version 2023-06-01 unless it says otherwise.
func TestUpstreamAPIDefaults(t *testing.T) {
	for _, tc := range []struct {
		name                string
		in                  Upstream
		api, auth, aversion string
	}{
		{"openai by default", Upstream{}, APIOpenAI, AuthBearer, ""},
		{"anthropic", Upstream{API: APIAnthropic}, APIAnthropic, AuthXAPIKey, DefaultAnthropicVersion},
		{"anthropic under a bearer token", Upstream{API: APIAnthropic, Auth: AuthBearer}, APIAnthropic, AuthBearer, DefaultAnthropicVersion},
		{"anthropic with its own version", Upstream{API: APIAnthropic, AnthropicVersion: "2026-10-21"}, APIAnthropic, AuthXAPIKey, "2026-10-21"},
		{"openai under x-api-key", Upstream{Auth: AuthXAPIKey}, APIOpenAI, AuthXAPIKey, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := tc.in.WithDefaults()
			if u.API != tc.api || u.Auth != tc.auth || u.AnthropicVersion != tc.aversion {
				t.Errorf("api, auth, anthropic_version = %q, %q, %q; want %q, %q, %q",
					u.API, u.Auth, u.AnthropicVersion, tc.api, tc.auth, tc.aversion)
			}
		})
	}
}

func TestPropagatesTrace(t *testing.T) {
	for _, tc := range []struct {
		u    Upstream
		want bool
	}{
		{Upstream{}, false},
		{Upstream{Internal: true}, true},
		{Upstream{Internal: true, PropagateTrace: new(false)}, false},
		{Upstream{PropagateTrace: new(true)}, true},
	} {
		if got := tc.u.PropagatesTrace(); got != tc.want {
			t.Errorf("%+v: PropagatesTrace() = %v, want %v", tc.u, got, tc.want)
		}
	}
}

func TestExpandEnv(t *testing.T) {
	getenv := env(map[string]string{
		"KEY":    "sk-from-env",
		"HOST":   "vllm.internal",
		"LEVEL":  "debug",
		"DOLLAR": "a$b",
	})
	file := []byte(`
upstreams:
  - name: vllm
    base_url: http://${HOST}:8000/v1
    api_key: "${KEY}"
    models: ["$literal", "${DOLLAR}", "$${KEY}", "${not a name}", "${UNSET}x"]
  # a comment mentioning ${HOST} is harmless
log:
  level: ${LEVEL}
  format: ${UNSET}
`)
	c, err := Load(file, getenv)
	if err != nil {
		t.Fatal(err)
	}
	u := c.Upstreams[0]
	if u.BaseURL != "http://vllm.internal:8000/v1" || u.APIKey != "sk-from-env" {
		t.Errorf("upstream = %+v", u)
	}
	wantModels := []string{"$literal", "a$b", "${KEY}", "${not a name}", "x"}
	if !reflect.DeepEqual(u.Models, wantModels) {
		t.Errorf("models = %q, want %q", u.Models, wantModels)
	}
	if c.Log.Level != "debug" {
		t.Errorf("log.level = %q", c.Log.Level)
	}
	if c.Log.Format != "json" {
		t.Errorf("log.format = %q; a key whose variable is unset keeps its default", c.Log.Format)
	}

	// An unset variable where a value is required surfaces in Validate.
	_, err = Load([]byte("upstreams:\n  - name: x\n    base_url: \"${MISSING_URL}\"\n"), getenv)
	if err == nil || !strings.Contains(err.Error(), "upstreams[0].base_url: empty") {
		t.Errorf("error = %v, want upstreams[0].base_url: empty", err)
	}

	// A newline in a value would add YAML of its own.
	_, err = Load([]byte("admin_token: ${EVIL}\n"), env(map[string]string{"EVIL": "x\nallow_insecure_listen: true"}))
	if err == nil || !strings.Contains(err.Error(), "line 1: ${EVIL}: the value contains a newline") {
		t.Errorf("error = %v", err)
	}
}

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{in: `"30s"`, want: 30 * time.Second},
		{in: `1h30m`, want: 90 * time.Minute},
		{in: `500ms`, want: 500 * time.Millisecond},
		{in: `0`, want: 0},
		{in: `30`, err: `line 1 column 1: duration 30 has no unit (add one, e.g. "30s" or "30ms")`},
		{in: `"30"`, err: `duration 30 has no unit`},
		{in: `1.5`, err: `duration 1.5 has no unit`},
		{in: `soon`, err: `line 1 column 1: invalid duration "soon"`},
		{in: `""`, err: `invalid duration ""`},
		{in: `[1s]`, err: `expected a duration string`},
	} {
		var d Duration
		err := yaml.Unmarshal([]byte(tc.in), &d)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error = %v, want %q", tc.in, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.in, err)
		case tc.err == "" && d.D() != tc.want:
			t.Errorf("%s = %v, want %v", tc.in, d.D(), tc.want)
		}
	}
	for d, want := range map[time.Duration]string{
		0: "0s", 24 * time.Hour: "24h", 90 * time.Second: "1m30s", time.Minute: "1m",
		time.Hour + time.Second: "1h0m1s", 500 * time.Millisecond: "500ms", -time.Minute: "-1m",
	} {
		if got := Duration(d).String(); got != want {
			t.Errorf("Duration(%v).String() = %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(want); err != nil || back != d {
			t.Errorf("%q does not parse back to %v", want, d)
		}
	}
}

func TestRedacted(t *testing.T) {
	c, err := LoadFile("testdata/good.yml", env(nil))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := yaml.Marshal(c)
	r := c.Redacted()
	out, err := yaml.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{
		"admin-secret-token", "sk-openai-secret", "gsk-groq-secret", "sk-gw-alice-secret",
		"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		"redis-secret-pw", "webhook-secret-token", "query-secret", "T000",
		"tracing-secret", "trace-query-secret",
	}
	for _, s := range secrets {
		if strings.Contains(string(out), s) {
			t.Errorf("Redacted output contains %q:\n%s", s, out)
		}
	}
	if got := r.Store.Redis.URL; got != "rediss://default:redacted@cache.internal:6380/2" {
		t.Errorf("redis url = %q", got)
	}
	if got := r.DeadLetters.WebhookURL; got != "https://hooks.slack.com/redacted?sig=redacted" {
		t.Errorf("webhook url = %q", got)
	}
	if r.Upstreams[2].APIKey != "" {
		t.Errorf("an empty key should stay empty, got %q", r.Upstreams[2].APIKey)
	}
	if r.Upstreams[0].Name != "openai" || r.Clients[0].Name != "alice" {
		t.Errorf("Redacted dropped non-secrets: %+v", r)
	}
	// The original is untouched.
	r.Upstreams[0].Models[0] = "changed"
	if after, _ := yaml.Marshal(c); string(after) != string(before) {
		t.Errorf("Redacted modified its receiver")
	}

	for in, want := range map[string]string{
		"redis://token@host:6379":        "redis://redacted@host:6379",
		"redis://:pw@host:6379":          "redis://:redacted@host:6379",
		"http://x/v1?api-key=k#frag":     "http://x/v1?api-key=redacted",
		"://not a url":                   RedactedValue,
		"https://api.openai.com/v1":      "https://api.openai.com/v1",
		"mailto:someone@example.com?x=y": RedactedValue,
	} {
		if got := redactURL(in, false); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestServes(t *testing.T) {
	for _, tc := range []struct {
		models []string
		model  string
		want   bool
	}{
		{[]string{"*"}, "gpt-4o", true},
		{[]string{"*"}, "", true},
		{[]string{"gpt-4o"}, "gpt-4o", true},
		{[]string{"gpt-4o"}, "gpt-4o-mini", false},
		{[]string{"gpt-4o*"}, "gpt-4o-mini", true},
		{[]string{"gpt-4o*"}, "gpt-4o", true},
		{[]string{"gpt-4o*"}, "gpt-4", false},
		{[]string{"meta-llama/*"}, "meta-llama/Llama-3-70b", true},
		{[]string{"*/Llama-*"}, "meta-llama/Llama-3-70b", true},
		{[]string{"*-70b"}, "meta-llama/Llama-3-70b", true},
		{[]string{"*-8b"}, "meta-llama/Llama-3-70b", false},
		{[]string{"a*b*c"}, "aXbYbZc", true},
		{[]string{"a*b*c"}, "aXbYbZ", false},
		{[]string{"**"}, "x", true},
		{[]string{"o1-?"}, "o1-x", false}, // only '*' is special
		{[]string{"o1-?"}, "o1-?", true},
		{[]string{"[abc]"}, "a", false},
		{[]string{"claude-*", "gpt-*"}, "gpt-4", true},
		{[]string{"claude-*", "gpt-*"}, "llama", false},
		{nil, "gpt-4o", false},
		{[]string{""}, "", true}, // Validate rejects empty patterns; exact match still holds
	} {
		u := Upstream{Models: tc.models}
		if got := u.Serves(tc.model); got != tc.want {
			t.Errorf("Models %q Serves(%q) = %v, want %v", tc.models, tc.model, got, tc.want)
		}
	}
}

func TestListenIsLoopback(t *testing.T) {
	for listen, want := range map[string]bool{
		"127.0.0.1:8080":       true,
		"127.10.0.1:8080":      true,
		"[::1]:8080":           true,
		"localhost:8080":       true,
		"LOCALHOST:8080":       true,
		"[::ffff:127.0.0.1]:1": true,
		"0.0.0.0:8080":         false,
		":8080":                false,
		"[::]:8080":            false,
		"10.0.0.1:8080":        false,
		"localhost.evil:8080":  false,
		"127.0.0.1":            false, // not host:port
	} {
		c := Config{Listen: listen}
		if got := c.ListenIsLoopback(); got != want {
			t.Errorf("ListenIsLoopback(%q) = %v, want %v", listen, got, want)
		}
	}
}

// TestInsecureListen checks the ways out of the non-loopback refusal.
func TestInsecureListen(t *testing.T) {
	base := "upstreams:\n  - name: a\n    base_url: http://a/v1\nlisten: 0.0.0.0:8080\n"
	for name, extra := range map[string]string{
		"clients":               "clients:\n  - name: alice\n    key: k\n",
		"allow_insecure_listen": "allow_insecure_listen: true\n",
	} {
		if _, err := Load([]byte(base+extra), nil); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzLoad(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.yml")
	files = append(files, "example.yaml")
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("${A}${B}$${C}${"))
	f.Add([]byte("upstreams: &a [*a]"))
	getenv := env(map[string]string{"A": "1", "OPENAI_API_KEY": "sk", "ALICE_KEY": "k"})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Load(data, getenv)
		if err != nil {
			return
		}
		// What Load accepts stays valid, and redacting it is safe.
		if err := c.Validate(); err != nil {
			t.Fatalf("Load accepted a config Validate rejects: %v", err)
		}
		r := c.Redacted()
		if _, err := yaml.Marshal(&r); err != nil {
			t.Fatalf("marshal redacted: %v", err)
		}
	})
}

func TestTrustedProxyPrefixes(t *testing.T) {
	s := Server{TrustedProxies: []string{
		"10.0.0.5", "172.18.3.4/16", "::ffff:192.0.2.1", "::ffff:198.51.100.0/120", "2001:db8::1/48", "fe80::1%eth0", "not an address",
	}}
	var got []string
	for _, p := range s.TrustedProxyPrefixes() {
		got = append(got, p.String())
	}
	want := []string{"10.0.0.5/32", "172.18.0.0/16", "192.0.2.1/32", "198.51.100.0/24", "2001:db8::/48", "fe80::1/128"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("TrustedProxyPrefixes = %q, want %q", got, want)
	}
}

// TestEffectiveLimits holds the inheritance rule: a client's 0 takes the
// default, its -1 lifts the limit, and a rate without a burst holds one
// second's worth.
func TestEffectiveLimits(t *testing.T) {
	def := ClientLimits{RequestsPerSecond: 2.5, MaxConcurrent: 4, MaxStoredBytes: 1000}
	for _, tc := range []struct {
		name string
		own  ClientLimits
		want ClientLimits
	}{
		{"inherits everything", ClientLimits{}, ClientLimits{RequestsPerSecond: 2.5, Burst: 3, MaxConcurrent: 4, MaxStoredBytes: 1000}},
		{"own values", ClientLimits{RequestsPerSecond: 10, Burst: 1, MaxConcurrent: 1, MaxStoredBytes: 5},
			ClientLimits{RequestsPerSecond: 10, Burst: 1, MaxConcurrent: 1, MaxStoredBytes: 5}},
		{"-1 lifts", ClientLimits{RequestsPerSecond: -1, Burst: 7, MaxConcurrent: -1, MaxStoredBytes: -1}, ClientLimits{}},
		{"small rate", ClientLimits{RequestsPerSecond: 0.1}, ClientLimits{RequestsPerSecond: 0.1, Burst: 1, MaxConcurrent: 4, MaxStoredBytes: 1000}},
	} {
		if got := (Client{Limits: tc.own}).EffectiveLimits(def); got != tc.want {
			t.Errorf("%s: EffectiveLimits = %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if got := (ClientLimits{}).Over(ClientLimits{}); got != (ClientLimits{}) {
		t.Errorf("zero over zero = %+v, want no limits", got)
	}
}
