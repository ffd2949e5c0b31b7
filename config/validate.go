package config

import (
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// FieldError is one problem Validate found: the field's path in the YAML
// ("upstreams[1].name") and what is wrong with it, with the fix where one
// is not obvious.
type FieldError struct {
	Field   string
	Problem string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Problem }

// problems collects FieldErrors.
type problems []error

func (p *problems) add(field, format string, args ...any) {
	*p = append(*p, &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)})
}

// Validate reports every problem in c at once, as an errors.Join of
// *FieldError. Load calls it; call it again after changing a Config.
func (c *Config) Validate() error {
	var p problems
	c.validateListen(&p)
	if c.DataDir == "" && c.Store.Kind == StoreBadger {
		p.add("data_dir", "empty (required when store.kind is badger)")
	}
	c.validateUpstreams(&p)
	c.validateClients(&p)
	c.validateOwnership(&p)
	c.validateClientLimits(&p)
	c.validateDurations(&p)
	c.validateRetryAndBreaker(&p)
	positive(&p, "idempotency.max_record_bytes", c.Idempotency.MaxRecordBytes)
	positive(&p, "idempotency.max_record_events", c.Idempotency.MaxRecordEvents)
	positive(&p, "idempotency.max_detached", c.Idempotency.MaxDetached)
	c.validateStore(&p)
	positive(&p, "limits.max_body_bytes", c.Limits.MaxBodyBytes)
	positive(&p, "limits.max_header_bytes", c.Limits.MaxHeaderBytes)
	positive(&p, "limits.max_json_depth", c.Limits.MaxJSONDepth)
	c.validateMemory(&p)
	c.validateServer(&p)
	switch c.Log.Format {
	case "json", "text":
	default:
		p.add("log.format", "%q is not json or text", c.Log.Format)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		p.add("log.level", "%q is not debug, info, warn or error", c.Log.Level)
	}
	c.validateDeadLetters(&p)
	c.validatePassthrough(&p)
	c.validateBudgets(&p)
	if c.Tracing.Endpoint != "" && !isHTTPURL(c.Tracing.Endpoint) {
		// It may carry credentials: never echo it.
		p.add("tracing.endpoint", "not an http(s) URL with a host (e.g. http://otel-collector:4318/v1/traces)")
	}
	ratio(&p, "tracing.sample_ratio", c.Tracing.SampleRatio)
	return errors.Join(p...)
}

func (c *Config) validateRetryAndBreaker(p *problems) {
	r := c.Retry
	if r.MaxAttempts < 1 {
		p.add("retry.max_attempts", "must be >= 1 (1 means no retries)")
	}
	if r.MaxDelay < r.BaseDelay && r.MaxDelay >= 0 {
		p.add("retry.max_delay", "%s is less than retry.base_delay %s", r.MaxDelay, r.BaseDelay)
	}
	ratio(p, "retry.budget_ratio", r.BudgetRatio)
	if !(r.BudgetMinPerSecond >= 0) {
		p.add("retry.budget_min_per_second", "must be >= 0")
	}
	b := c.Breaker
	if b.ConsecutiveFailures < 1 {
		p.add("breaker.consecutive_failures", "must be >= 1")
	}
	ratio(p, "breaker.failure_ratio", b.FailureRatio)
	if b.HalfOpenRequests < 1 {
		p.add("breaker.half_open_requests", "must be >= 1")
	}
	if b.Scope != BreakerScopeModel && b.Scope != BreakerScopeUpstream {
		p.add("breaker.scope", "%q is not %s (a breaker per upstream and model, the default) or %s (one per upstream)",
			b.Scope, BreakerScopeModel, BreakerScopeUpstream)
	}
}

func (c *Config) validateStore(p *problems) {
	s := c.Store
	switch s.Kind {
	case StoreBadger, StoreRedis:
	default:
		p.add("store.kind", "%q is not %s or %s", s.Kind, StoreBadger, StoreRedis)
	}
	if s.MaxBytes < 0 {
		p.add("store.max_bytes", "%d must be >= 0 (0: no cap)", s.MaxBytes)
	}
	if s.MinFreeBytes < 0 {
		p.add("store.min_free_bytes", "%d must be >= 0 (0: derived from the store's options)", s.MinFreeBytes)
	}
	sentinel := s.Redis.Sentinel.Master != ""
	if s.Redis.URL == "" && s.Kind == StoreRedis && !sentinel {
		p.add("store.redis.url", "required when store.kind is redis (e.g. redis://localhost:6379/0; env GATEWAY_REDIS_URL), unless store.redis.sentinel.master is set")
	}
	if s.Redis.URL != "" {
		// The URL may hold a password: never echo it. With Sentinel its
		// host is ignored, so it may have none.
		if u, err := url.Parse(s.Redis.URL); err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || (u.Host == "" && !sentinel) {
			p.add("store.redis.url", "not a redis:// or rediss:// URL with a host")
		}
	}
	validateSentinel(p, s.Redis)
	if s.Redis.PoolSize < 0 {
		p.add("store.redis.pool_size", "must be >= 0 (0 uses go-redis's default)")
	}
	if s.Redis.WaitReplicas < 0 {
		p.add("store.redis.wait_replicas", "must be >= 0 (0 does not wait for replicas)")
	}
	if s.Redis.WaitReplicas > 0 && s.Redis.WaitTimeout >= s.OpTimeout {
		p.add("store.redis.wait_timeout", "%s must be under store.op_timeout (%s), which bounds the whole commit", s.Redis.WaitTimeout, s.OpTimeout)
	}
}

// validateSentinel checks store.redis.sentinel: a master name and the
// Sentinels' addresses go together, and not with a Cluster.
func validateSentinel(p *problems, r Redis) {
	st := r.Sentinel
	if st.Master == "" && len(st.Addrs) == 0 {
		return
	}
	if st.Master == "" {
		p.add("store.redis.sentinel.master", "required with store.redis.sentinel.addrs: the name the Sentinels monitor the primary under (env GATEWAY_REDIS_SENTINEL_MASTER)")
	}
	if len(st.Addrs) == 0 {
		p.add("store.redis.sentinel.addrs", "required with store.redis.sentinel.master: each Sentinel's host:port, e.g. [sentinel-1:26379, sentinel-2:26379] (env GATEWAY_REDIS_SENTINEL_ADDRS, comma-separated)")
	}
	for i, a := range st.Addrs {
		host, port, err := net.SplitHostPort(a)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			p.add(fmt.Sprintf("store.redis.sentinel.addrs[%d]", i), "%q is not host:port", a)
		}
	}
	if r.Cluster {
		p.add("store.redis.cluster", "cannot be combined with store.redis.sentinel: a Redis Cluster fails over by itself")
	}
}

func (c *Config) validateDeadLetters(p *problems) {
	d := c.DeadLetters
	if d.MaxBodyBytes < 0 {
		p.add("dead_letters.max_body_bytes", "must be >= 0")
	}
	if d.AlertThreshold < 0 {
		p.add("dead_letters.alert_threshold", "must be >= 0 (0 disables)")
	}
	if d.AlertGrowthPerHour < 0 {
		p.add("dead_letters.alert_growth_per_hour", "must be >= 0 (0 disables)")
	}
	if d.WebhookURL != "" && !isHTTPURL(d.WebhookURL) {
		// The URL is a secret: never echo it.
		p.add("dead_letters.webhook_url", "not an http(s) URL")
	}
	if !(d.ReplayPerSecond > 0) {
		p.add("dead_letters.replay_per_second", "must be > 0")
	}
	if d.MaxPerClient < 0 {
		p.add("dead_letters.max_per_client", "must be >= 0 (0: no count bound)")
	}
	if d.MaxBytesPerClient < -1 {
		p.add("dead_letters.max_bytes_per_client", "must be >= -1 (0: 1/32 of store.max_bytes, -1: no bytes bound)")
	}
}

func (c *Config) validateListen(p *problems) {
	host, port, err := net.SplitHostPort(c.Listen)
	if err == nil {
		n, perr := strconv.Atoi(port)
		if perr != nil || n < 0 || n > 65535 {
			err = errors.New("bad port")
		}
	}
	if err != nil || strings.ContainsAny(host, " \t") {
		p.add("listen", "%q is not host:port (e.g. 127.0.0.1:8080, or :8080 for every interface)", c.Listen)
		return
	}
	if len(c.Clients) == 0 && !c.AllowInsecureListen && !c.ListenIsLoopback() {
		p.add("listen", "%s is not a loopback address and no clients are configured, "+
			"so anyone who can reach it could spend your provider keys; "+
			"configure clients: or set allow_insecure_listen: true", c.Listen)
	}
}

// ListenIsLoopback reports whether Listen's host is 127.0.0.0/8, ::1 or
// "localhost". An empty host (":8080") listens everywhere, so it is not.
func (c *Config) ListenIsLoopback() bool {
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

func (c *Config) validateServer(p *problems) {
	s := c.Server
	for i, v := range s.TrustedProxies {
		f := fmt.Sprintf("server.trusted_proxies[%d]", i)
		pr, err := parseProxy(v)
		switch {
		case err != nil:
			p.add(f, "%q is not an IP address or a CIDR range (e.g. 10.0.0.5 or 172.18.0.0/16)", v)
		case pr.Bits() == 0:
			p.add(f, "%q trusts every address, so any client could claim any address and scheme; list your proxies' addresses", v)
		}
	}
	switch s.CookieSecure {
	case CookieSecureAuto, CookieSecureTrue, CookieSecureFalse:
	default:
		p.add("server.cookie_secure", "%q is not auto, true or false", s.CookieSecure)
	}
}

func (c *Config) validateUpstreams(p *problems) {
	if len(c.Upstreams) == 0 {
		p.add("upstreams", "none configured (set OPENAI_API_KEY for the default OpenAI upstream, or list upstreams in the config file; -demo runs a simulated one)")
		return
	}
	names := make(map[string]bool, len(c.Upstreams))
	for i, u := range c.Upstreams {
		f := fmt.Sprintf("upstreams[%d]", i)
		switch {
		case u.Name == "":
			p.add(f+".name", "empty")
		case names[u.Name]:
			p.add(f+".name", "duplicate upstream name %q (names must be unique)", u.Name)
		}
		names[u.Name] = true

		switch {
		case u.BaseURL == "":
			p.add(f+".base_url", "empty (set the provider's API root, e.g. https://api.openai.com/v1)")
		case !isHTTPURL(u.BaseURL):
			p.add(f+".base_url", "%q is not an http(s) URL", u.BaseURL)
		}
		for j, m := range u.Models {
			if m == "" {
				p.add(fmt.Sprintf("%s.models[%d]", f, j), `empty pattern (use "*" to serve every model)`)
			}
		}
		if u.MaxIdleConns < 0 {
			p.add(f+".max_idle_conns", "must be >= 0 (0 means the default, 256)")
		}
		validateUpstreamAPI(p, f, u)
	}
	apis := make(map[string]string, len(c.Upstreams))
	for _, u := range c.Upstreams {
		apis[u.Name] = cmp.Or(u.API, APIOpenAI)
	}
	// Fallbacks are checked once every name is known.
	for i, u := range c.Upstreams {
		seen := make(map[string]bool, len(u.Fallbacks))
		for j, fb := range u.Fallbacks {
			f := fmt.Sprintf("upstreams[%d].fallbacks[%d]", i, j)
			switch {
			case fb == u.Name:
				p.add(f, "%q is the upstream itself", fb)
			case !names[fb]:
				p.add(f, "unknown upstream %q", fb)
			case seen[fb]:
				p.add(f, "%q is listed twice", fb)
			case apis[fb] != apis[u.Name]:
				// Nothing is translated: a fallback must take the same body.
				p.add(f, "%q speaks the %s API, %q the %s API; a fallback chain cannot mix APIs (list a fallback of the same api)",
					fb, apis[fb], u.Name, apis[u.Name])
			}
			seen[fb] = true
		}
	}
}

// validateUpstreamAPI checks upstream f's api and auth.
func validateUpstreamAPI(p *problems, f string, u Upstream) {
	switch u.API {
	case "", APIOpenAI, APIAnthropic: // "": not defaulted yet, openai
	default:
		p.add(f+".api", "%q is not openai or anthropic (leave it out for openai)", u.API)
	}
	switch u.Auth {
	case "", AuthBearer, AuthXAPIKey:
	default:
		p.add(f+".auth", "%q is not x-api-key or bearer (leave it out: x-api-key for an anthropic upstream, bearer otherwise)", u.Auth)
	}
}

func (c *Config) validateClients(p *problems) {
	names := make(map[string]bool, len(c.Clients))
	keys := make(map[[sha256.Size]byte]int, len(c.Clients)) // digest → index
	for i, cl := range c.Clients {
		f := fmt.Sprintf("clients[%d]", i)
		switch {
		case cl.Name == "":
			p.add(f+".name", "empty")
		case names[cl.Name]:
			p.add(f+".name", "duplicate client name %q (names must be unique)", cl.Name)
		}
		names[cl.Name] = true

		validateDeriveKey(p, f+".derive_idempotency_key.from_header", cl.DeriveIdempotencyKey.FromHeader)

		if cl.Key != "" && cl.KeySHA256 != "" {
			p.add(f, "both key and key_sha256 are set (set exactly one)")
			continue
		}
		digest, err := cl.Digest()
		var de *digestError
		if errors.As(err, &de) {
			p.add(f+"."+de.field, "%s", de.msg)
			continue
		}
		// Keys are compared by digest so a plain key and the hash of the
		// same key collide too. Never echo the key itself.
		if j, dup := keys[digest]; dup {
			p.add(f+".key", "same key as clients[%d] (%q); keys must be unique", j, c.Clients[j].Name)
		} else {
			keys[digest] = i
		}
	}
	if c.AdminToken != "" {
		if j, dup := keys[KeyDigest(c.AdminToken)]; dup {
			p.add("admin_token", "same as the key of clients[%d] (%q); the admin token must not be a client key", j, c.Clients[j].Name)
		}
	}
}

// validateClientLimits checks client_limits (0 or more: 0 is no limit),
// every client's own limits (also -1: no limit for it; burst 0 or more),
// and replicas.
func (c *Config) validateClientLimits(p *problems) {
	check := func(field string, l ClientLimits, least float64) {
		rps := l.RequestsPerSecond
		if math.IsNaN(rps) || math.IsInf(rps, 0) || (rps < 0 && rps != least) {
			p.add(field+".requests_per_second", "%v is not %s", rps, limitRange(least))
		}
		if l.Burst < 0 {
			p.add(field+".burst", "must be >= 0 (0: as many as one second's rate)")
		}
		if n := l.MaxConcurrent; n < 0 && float64(n) != least {
			p.add(field+".max_concurrent", "%d is not %s", n, limitRange(least))
		}
		if n := l.MaxStoredBytes; n < 0 && float64(n) != least {
			p.add(field+".max_stored_bytes", "%d is not %s", n, limitRange(least))
		}
	}
	check("client_limits", c.ClientLimits, 0)
	for i, cl := range c.Clients {
		check(fmt.Sprintf("clients[%d].limits", i), cl.Limits, -1)
	}
	switch {
	case c.Replicas < 1:
		p.add("replicas", "must be >= 1 (the number of gateway processes sharing the traffic)")
	case c.Replicas > 1 && c.Store.Kind == StoreBadger:
		p.add("replicas", "%d replicas need store.kind: redis (a Badger data dir belongs to one process)", c.Replicas)
	}
}

func limitRange(least float64) string {
	if least < 0 {
		return "-1 (no limit), 0 (as client_limits) or more"
	}
	return ">= 0 (0 is no limit)"
}

// validateDurations rejects negative durations everywhere, and zero where
// zero would mean "never" or "no time at all" rather than a sensible off.
func (c *Config) validateDurations(p *problems) {
	type dur struct {
		field    string
		d        Duration
		positive bool
	}
	ds := []dur{
		{"retry.base_delay", c.Retry.BaseDelay, false},
		{"retry.max_delay", c.Retry.MaxDelay, false},
		{"retry.deadline", c.Retry.Deadline, true},
		{"retry.budget_window", c.Retry.BudgetWindow, true},
		{"breaker.interval", c.Breaker.Interval, false},
		{"breaker.open_timeout", c.Breaker.OpenTimeout, true},
		{"idempotency.ttl", c.Idempotency.TTL, true},
		{"idempotency.wait_timeout", c.Idempotency.WaitTimeout, false},
		{"idempotency.lease", c.Idempotency.Lease, true},
		{"idempotency.cache_ttl", c.Idempotency.CacheTTL, true},
		{"store.gc_interval", c.Store.GCInterval, true},
		{"store.writeback_interval", c.Store.WritebackInterval, false},
		{"store.op_timeout", c.Store.OpTimeout, true},
		{"store.usage_rescan", c.Store.UsageRescan, false},
		{"store.redis.wait_timeout", c.Store.Redis.WaitTimeout, true},
		{"limits.stream_idle_timeout", c.Limits.StreamIdleTimeout, true},
		{"limits.admission_wait", c.Limits.AdmissionWait, true},
		{"server.read_header_timeout", c.Server.ReadHeaderTimeout, true},
		{"server.read_body_timeout", c.Server.ReadBodyTimeout, true},
		{"server.unauthenticated_read_body_timeout", c.Server.UnauthenticatedReadBodyTimeout, true},
		{"server.idle_timeout", c.Server.IdleTimeout, false},
		{"server.write_stall_timeout", c.Server.WriteStallTimeout, true},
		{"server.shutdown_grace", c.Server.ShutdownGrace, false},
		{"dead_letters.ttl", c.DeadLetters.TTL, true},
		{"dead_letters.webhook_timeout", c.DeadLetters.WebhookTimeout, true},
	}
	for i, u := range c.Upstreams {
		ds = append(ds, dur{fmt.Sprintf("upstreams[%d].timeout", i), u.Timeout, true})
	}
	for _, d := range ds {
		switch {
		case d.d < 0:
			p.add(d.field, "%s is negative", d.d)
		case d.d == 0 && d.positive:
			p.add(d.field, "must be > 0")
		}
	}
}

// validateMemory checks the memory section and the in-flight bound.
func (c *Config) validateMemory(p *problems) {
	if r := c.Memory.LimitRatio; !(r > 0 && r <= 1) { // also catches NaN
		p.add("memory.limit_ratio", "%v is outside (0, 1]: the share of the cgroup's memory limit given to the Go runtime, e.g. 0.8", r)
	}
	if c.Memory.BudgetBytes < 0 {
		p.add("memory.budget_bytes", "is negative (0 derives it from the memory limit)")
	} else if b := c.Memory.BudgetBytes; b > 0 && b < 8<<20 {
		p.add("memory.budget_bytes", "%d is under 8 MiB (8388608): Badger cannot work in less", b)
	}
	switch m := c.Limits.MaxInflightBytes; {
	case m < 0:
		p.add("limits.max_inflight_bytes", "is negative (0 derives it from memory.budget_bytes)")
	case m > 0 && m < c.Limits.MaxBodyBytes:
		p.add("limits.max_inflight_bytes", "%d is less than limits.max_body_bytes (%d): a body of the largest allowed size could never be read; raise it or lower max_body_bytes", m, c.Limits.MaxBodyBytes)
	}
}

func ratio(p *problems, field string, v float64) {
	if !(v >= 0 && v <= 1) { // also catches NaN
		p.add(field, "%v is outside [0, 1]", v)
	}
}

func positive[T int | int64](p *problems, field string, v T) {
	if v <= 0 {
		p.add(field, "must be > 0")
	}
}

func isHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// validateDeriveKey checks a client's derive_idempotency_key.from_header:
// a header name, and none that would defeat the derivation — one that
// changes on every retry, or one that names no session (the client's own
// credential, the key the client would send itself).
func validateDeriveKey(p *problems, field, name string) {
	if name == "" {
		return
	}
	for i := 0; i < len(name); i++ {
		if !isTokenChar(name[i]) {
			p.add(field, "%q is not a header name (letters, digits and !#$%%&'*+-.^_`|~, e.g. x-claude-code-session-id)", name)
			return
		}
	}
	switch strings.ToLower(name) {
	case "idempotency-key":
		p.add(field, "Idempotency-Key is the key itself, used whenever a request sends one; name the header that identifies the session, e.g. x-claude-code-session-id")
	case "x-stainless-retry-count":
		p.add(field, "%s changes on every retry, so a retry would never match; name the header that identifies the session, e.g. x-claude-code-session-id", name)
	case "authorization", "x-api-key":
		p.add(field, "%s is the client's credential, not a session: every identical request of the client would share one answer; name the header that identifies the session, e.g. x-claude-code-session-id", name)
	}
}

// isTokenChar reports whether c may appear in an HTTP header name (RFC
// 9110 tchar).
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
