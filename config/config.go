// Package config is the operator's interface to llmgate: the YAML file given
// with -config, the environment variables that override it, the defaults
// that make a zero-config run work, and Validate, which reports every
// problem at once with the field it concerns.
//
// Precedence, lowest first: the defaults (Default), the file, then the
// GATEWAY_* environment variables (see Load). The file may also refer to the
// environment as ${NAME}.
//
// It does no network I/O and keeps no globals: the environment is read
// through the getenv function the caller passes to Load.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Default returns the configuration a zero-config run uses: every default
// named in the field doc comments below, and no upstreams or clients.
// Per-upstream defaults are applied by Load, since the list starts empty.
func Default() Config {
	return Config{
		Listen:  "127.0.0.1:8080",
		DataDir: "./data",
		Retry: Retry{
			MaxAttempts:        3,
			BaseDelay:          Duration(time.Second),
			MaxDelay:           Duration(30 * time.Second),
			Deadline:           Duration(10 * time.Minute),
			BudgetRatio:        0.2,
			BudgetMinPerSecond: 10,
			BudgetWindow:       Duration(10 * time.Second),
		},
		Breaker: Breaker{
			ConsecutiveFailures: 5,
			MinRequests:         20,
			Interval:            Duration(60 * time.Second),
			OpenTimeout:         Duration(30 * time.Second),
			HalfOpenRequests:    1,
			Scope:               BreakerScopeModel,
		},
		Idempotency: Idempotency{
			TTL:             Duration(24 * time.Hour),
			WaitTimeout:     Duration(60 * time.Second),
			Lease:           Duration(30 * time.Second),
			CacheTTL:        Duration(time.Hour),
			MaxRecordBytes:  8 << 20,
			MaxRecordEvents: 100000,
			MaxDetached:     256,
		},
		Store: Store{
			Kind:              StoreBadger,
			GCInterval:        Duration(10 * time.Minute),
			WritebackInterval: Duration(100 * time.Millisecond),
			OpTimeout:         Duration(5 * time.Second),
			UsageRescan:       Duration(10 * time.Minute),
			MaxBytes:          768 << 20,
			Redis:             Redis{Prefix: "llmgate:", WaitTimeout: Duration(time.Second)},
		},
		Limits: Limits{
			MaxBodyBytes:      32 << 20,
			MaxHeaderBytes:    64 << 10,
			MaxJSONDepth:      64,
			StreamIdleTimeout: Duration(60 * time.Second),
			AdmissionWait:     Duration(2 * time.Second),
		},
		Memory:   Memory{LimitRatio: 0.8},
		Log:      Log{Format: "json", Level: "info"},
		Replicas: 1,
		Server: Server{
			ReadHeaderTimeout:              Duration(10 * time.Second),
			ReadBodyTimeout:                Duration(5 * time.Minute),
			UnauthenticatedReadBodyTimeout: Duration(10 * time.Second),
			IdleTimeout:                    Duration(120 * time.Second),
			WriteStallTimeout:              Duration(30 * time.Second),
			ShutdownGrace:                  Duration(30 * time.Second),
			CookieSecure:                   CookieSecureAuto,
		},
		DeadLetters: DeadLetters{
			TTL:             Duration(168 * time.Hour),
			MaxBodyBytes:    256 << 10,
			AlertThreshold:  10,
			WebhookTimeout:  Duration(5 * time.Second),
			ReplayPerSecond: 5,
			MaxPerClient:    1000,
		},
		Tracing:   Tracing{SampleRatio: 1, TrustClientContext: true},
		Ownership: DefaultOwnership(),
		Budgets:   Budgets{DefaultMaxTokens: 4096, BytesPerToken: 4, OnStoreError: OnStoreErrorRefuse},
	}
}

// Store kinds.
const (
	StoreBadger = "badger"
	StoreRedis  = "redis"
)

// Per-upstream defaults, applied by Load to every upstream.
const (
	DefaultUpstreamTimeout      = 120 * time.Second
	DefaultUpstreamMaxIdleConns = 256
)

// Config is the whole configuration. The zero value is not usable; call
// Default, or Load, which starts from Default.
type Config struct {
	// Listen is the address the gateway serves on. Env GATEWAY_ADDR.
	Listen string `yaml:"listen"`
	// AllowInsecureListen lets the gateway listen on a non-loopback address
	// with no clients configured, i.e. with no authentication at all.
	AllowInsecureListen bool `yaml:"allow_insecure_listen"`
	// DataDir holds the Badger store. Env GATEWAY_DATA_DIR.
	DataDir string `yaml:"data_dir"`
	// AdminToken guards /admin/*. Empty disables the admin API entirely.
	// Env GATEWAY_ADMIN_TOKEN.
	AdminToken string `yaml:"admin_token"`

	Upstreams []Upstream `yaml:"upstreams"`
	Clients   []Client   `yaml:"clients"`
	// ClientLimits are the limits of every client that does not set its
	// own (Client.Limits), and of the one shared scope when no clients are
	// configured. The zero value limits nothing.
	ClientLimits ClientLimits `yaml:"client_limits"`
	// Replicas is how many gateway processes share the traffic (behind one
	// load balancer, on one Redis store). Per-client request rates and
	// concurrency are kept in each process, so each allows its share: the
	// configured figure divided by Replicas. Default 1; with the Badger
	// store it must be 1 (one process owns the data dir). Env
	// GATEWAY_REPLICAS (set it with the deployment's replica count).
	Replicas int `yaml:"replicas"`

	Retry       Retry       `yaml:"retry"`
	Breaker     Breaker     `yaml:"breaker"`
	Idempotency Idempotency `yaml:"idempotency"`
	Store       Store       `yaml:"store"`
	Limits      Limits      `yaml:"limits"`
	Memory      Memory      `yaml:"memory"`
	Log         Log         `yaml:"log"`
	Server      Server      `yaml:"server"`
	DeadLetters DeadLetters `yaml:"dead_letters"`
	Tracing     Tracing     `yaml:"tracing"`
	Ownership   Ownership   `yaml:"ownership"`
	Passthrough Passthrough `yaml:"passthrough"`
	Budgets     Budgets     `yaml:"budgets"`
}

// Upstream is one OpenAI-compatible provider.
type Upstream struct {
	// Name identifies the upstream in logs, metrics, breakers and headers.
	Name string `yaml:"name"`
	// BaseURL is the provider's API root including /v1, e.g.
	// https://api.openai.com/v1. Requests go to BaseURL + the path after /v1.
	// Load removes a trailing slash.
	BaseURL string `yaml:"base_url"`
	// APIKey is the upstream's credential, sent as Auth says. May be
	// empty (Ollama).
	APIKey string `yaml:"api_key"`
	// API is the provider API the upstream speaks: APIOpenAI (the
	// /v1/chat/completions family) or APIAnthropic (/v1/messages). An
	// endpoint routes only to upstreams of its API, and a fallback chain
	// never mixes them: nothing is translated. If empty, Load sets
	// APIOpenAI.
	API string `yaml:"api"`
	// Auth is how APIKey goes out: AuthBearer ("Authorization: Bearer
	// <key>") or AuthXAPIKey ("x-api-key: <key>", Anthropic's). If empty,
	// Load sets AuthXAPIKey for an Anthropic upstream, AuthBearer for any
	// other.
	Auth string `yaml:"auth"`
	// AnthropicVersion is the anthropic-version header sent to an
	// Anthropic upstream when the client sent none; a client's own value
	// is forwarded as it is, whatever it is. If empty, Load sets
	// DefaultAnthropicVersion for an Anthropic upstream.
	AnthropicVersion string `yaml:"anthropic_version"`
	// Models this upstream serves: exact names, or patterns with '*'
	// wildcards ("gpt-4o*", "*"); see Serves. If empty, Load sets ["*"].
	Models []string `yaml:"models"`
	// Timeout bounds one attempt against this upstream (headers and body).
	// If 0, Load sets 120s.
	Timeout Duration `yaml:"timeout"`
	// Fallbacks names other upstreams tried, in order, when this one's
	// breaker is open or its retries end in a transient failure.
	Fallbacks []string `yaml:"fallbacks"`
	// MaxIdleConns sizes the idle connection pool to this upstream.
	// If 0, Load sets 256.
	MaxIdleConns int `yaml:"max_idle_conns"`
	// Cache enables content-keyed caching for requests to this upstream
	// that carry no Idempotency-Key: the key is derived from the client and
	// the body. Off by default.
	Cache bool `yaml:"cache"`
	// ForwardAccountHeaders forwards a client's OpenAI-Organization and
	// OpenAI-Project headers to this upstream (they choose the provider
	// account a request is billed to). Off by default: they are dropped.
	ForwardAccountHeaders bool `yaml:"forward_account_headers"`
	// Internal marks an upstream the operator runs (a vLLM in the same
	// network, another llmgate): trace context is propagated to it unless
	// PropagateTrace says otherwise. Default false.
	Internal bool `yaml:"internal"`
	// PropagateTrace sends each attempt's W3C traceparent to this upstream,
	// so that its own spans join the gateway's trace. If unset, it follows
	// Internal: a public provider gains nothing from our trace ids.
	PropagateTrace *bool `yaml:"propagate_trace"`
	// ForceStoreFalse rewrites "store" to false in every POST /responses
	// body forwarded to this upstream, so the provider keeps no response
	// state (previous_response_id then fails upstream). The one exception
	// to byte fidelity: only that member's value changes. Default false.
	ForceStoreFalse bool `yaml:"force_store_false"`
	// Prices price this upstream's models for cost budgets: a model name,
	// or a glob (gpt-4o*), to what a million tokens of each kind cost.
	Prices map[string]Price `yaml:"prices"`
	// DefaultPrice prices a model Prices does not name. If nil, such a
	// model's runs count no cost (llmgate_budget_unpriced_total counts
	// them); their tokens still count.
	DefaultPrice *Price `yaml:"default_price"`
}

// The provider APIs an upstream may speak (Upstream.API).
const (
	APIOpenAI    = "openai"
	APIAnthropic = "anthropic"
)

// How an upstream's key goes out (Upstream.Auth).
const (
	AuthBearer  = "bearer"
	AuthXAPIKey = "x-api-key"
)

// DefaultAnthropicVersion is the anthropic-version an Anthropic upstream
// gets when the client sent none: the one Anthropic's docs send.
const DefaultAnthropicVersion = "2023-06-01"

// PropagatesTrace reports whether trace context goes to u: PropagateTrace
// when set, else Internal.
func (u Upstream) PropagatesTrace() bool {
	if u.PropagateTrace != nil {
		return *u.PropagateTrace
	}
	return u.Internal
}

// Client is one gateway API key and the name it maps to. The name scopes
// idempotency keys and appears in logs; the key never does.
type Client struct {
	// Name is unique among clients.
	Name string `yaml:"name"`
	// Key is the plain bearer token. Exactly one of Key and KeySHA256 is set.
	Key string `yaml:"key"`
	// KeySHA256 is the hex SHA-256 of the bearer token, so the plain key
	// need not sit in the config file (e.g. from `printf %s "$KEY" | sha256sum`).
	// Load lower-cases it.
	KeySHA256 string `yaml:"key_sha256"`
	// Limits are this client's own limits. A field left at 0 takes
	// Config.ClientLimits' value; -1 lifts that limit for this client.
	Limits ClientLimits `yaml:"limits"`
	// UpstreamAPIKeys maps an upstream's name to this client's own API key
	// for it (one provider project per tenant), sent instead of the
	// upstream's api_key: the provider itself then keeps this client's
	// stored objects apart. A secret: redacted, never logged.
	UpstreamAPIKeys map[string]string `yaml:"upstream_api_keys"`
	// Budgets cap what this client spends per window, in tokens or money
	// (see Budget); none by default.
	Budgets []Budget `yaml:"budgets"`
	// AllowUnmetered, when set, decides for this client whether its
	// passthrough calls that spend unmetered (SpendsUnmetered) run while
	// it has a budget, over budgets.allow_unmetered. If nil, that.
	AllowUnmetered *bool `yaml:"allow_unmetered"`
	// DeriveIdempotencyKey, when its FromHeader is set, gives this client's
	// keyed endpoints an idempotency key when a request comes without an
	// Idempotency-Key: derived from the named header and the request's
	// fingerprint. Off (FromHeader "") by default.
	DeriveIdempotencyKey DeriveKey `yaml:"derive_idempotency_key"`
}

// AllBudgets are the budgets that apply to c when def is the default
// block (Config.ClientLimits): its own, and its tokens per minute as a
// budget of total tokens over a minute window. A budget of its own with
// that one's id (window minute, tokens, total, every model) is the same
// counter: it stays one budget, with the stricter of the two limits.
func (c Client) AllBudgets(def ClientLimits) []Budget {
	tpm := c.EffectiveLimits(def).TokensPerMinute
	if tpm <= 0 {
		return c.Budgets
	}
	perMinute := Budget{Window: WindowMinute, Tokens: tpm, Count: CountTotal, Model: ""}
	out := slices.Clone(c.Budgets)
	for i, b := range out {
		if b.ID() == perMinute.ID() {
			out[i].Tokens = min(b.Tokens, tpm)
			return out
		}
	}
	return append(out, perMinute)
}

// DeriveKey derives an idempotency key for requests that send none, for
// agents that name their session in a header but no operation (Claude Code
// sends x-claude-code-session-id). The key is a hash of the header's value
// and the request's fingerprint (body, anthropic-version, anthropic-beta,
// query): the same session sending the same request again — an agent's
// retried step — replays the committed answer or joins the call still
// running, and another request in the session is another key. It is wrong
// for a client that sends the same conversation again on purpose to get a
// new sample: that client gets the first answer back.
type DeriveKey struct {
	// FromHeader names the request header whose value identifies the
	// session (case-insensitive), e.g. x-claude-code-session-id. A request
	// without it (or with it empty) is not keyed by it. "" turns
	// derivation off.
	FromHeader string `yaml:"from_header"`
}

// Digest is the SHA-256 of the client's key, from Key or KeySHA256: what
// the gateway compares a presented key's KeyDigest with.
func (c Client) Digest() ([sha256.Size]byte, error) {
	var d [sha256.Size]byte
	switch {
	case c.Key != "":
		return KeyDigest(c.Key), nil
	case c.KeySHA256 != "":
		b, err := hex.DecodeString(c.KeySHA256)
		if err != nil || len(b) != sha256.Size {
			return d, &digestError{field: "key_sha256", msg: "not 64 hex characters (the hex SHA-256 of the key)", client: c.Name}
		}
		copy(d[:], b)
		return d, nil
	}
	return d, &digestError{field: "key", msg: "empty (set key, or key_sha256)", client: c.Name}
}

// KeyDigest is how a client key is compared: its SHA-256.
func KeyDigest(key string) [sha256.Size]byte { return sha256.Sum256([]byte(key)) }

type digestError struct{ field, msg, client string }

func (e *digestError) Error() string { return "clients: " + e.client + ": " + e.field + ": " + e.msg }

// ClientLimits bound what one client may take of what every client
// shares: its request rate, its requests in flight, and the bytes stored
// under its idempotency keys. A request over a limit gets 429 and never
// reaches an upstream. In Config.ClientLimits 0 means no limit; in a
// client's own Limits 0 means "as Config.ClientLimits" and -1 means no
// limit (see Client.EffectiveLimits).
type ClientLimits struct {
	// RequestsPerSecond is the client's sustained rate of POST requests,
	// across all replicas (each allows RequestsPerSecond/replicas), as a
	// token bucket. Every request counts, replays of committed keys too.
	RequestsPerSecond float64 `yaml:"requests_per_second"`
	// Burst is how many requests the bucket holds: how many may arrive at
	// once after a quiet spell. Only meaningful with RequestsPerSecond. If
	// 0, max(1, ceil(RequestsPerSecond)). Each replica holds
	// ceil(Burst/replicas). It cannot be -1 in a client's limits.
	Burst int `yaml:"burst"`
	// MaxConcurrent caps the client's POST requests in flight, keyed
	// calls that run on after their client stopped waiting included.
	// Each replica admits ceil(MaxConcurrent/replicas).
	MaxConcurrent int `yaml:"max_concurrent"`
	// MaxStoredBytes caps the bytes committed under the client's
	// idempotency keys and content-cache entries (cache.Record.StoredSize,
	// counted until the hour they expire in has passed). Over it a keyed
	// request gets 429 before it is claimed (a replay of a committed key is
	// still served), and a content-cached request is served without being
	// stored.
	MaxStoredBytes int64 `yaml:"max_stored_bytes"`
	// TokensPerMinute caps the tokens (input and output) the client's
	// runs use per UTC minute, across all replicas: a budget of window
	// minute (see Budget), reserved and settled as budgets are.
	TokensPerMinute int64 `yaml:"tokens_per_minute"`
}

// EffectiveLimits are the limits that apply to c when def is the default
// block (Config.ClientLimits): each field c sets (not 0) replaces def's,
// and -1 becomes 0, no limit. A burst left at 0 with a rate is
// max(1, ceil(rate)).
func (c Client) EffectiveLimits(def ClientLimits) ClientLimits {
	return c.Limits.Over(def)
}

// Over resolves l, a client's own limits, over def as EffectiveLimits
// describes. With l zero it resolves def alone.
func (l ClientLimits) Over(def ClientLimits) ClientLimits {
	out := ClientLimits{
		RequestsPerSecond: pickLimit(l.RequestsPerSecond, def.RequestsPerSecond),
		Burst:             pickLimit(l.Burst, def.Burst),
		MaxConcurrent:     pickLimit(l.MaxConcurrent, def.MaxConcurrent),
		MaxStoredBytes:    pickLimit(l.MaxStoredBytes, def.MaxStoredBytes),
		TokensPerMinute:   pickLimit(l.TokensPerMinute, def.TokensPerMinute),
	}
	if out.RequestsPerSecond == 0 {
		out.Burst = 0
	} else if out.Burst == 0 {
		out.Burst = max(1, int(math.Ceil(out.RequestsPerSecond)))
	}
	return out
}

// pickLimit is a client's own value over the default's: 0 takes the
// default, a negative value (-1) means no limit (0).
func pickLimit[T int | int64 | float64](own, def T) T {
	switch {
	case own < 0:
		return 0
	case own == 0:
		return max(def, 0)
	}
	return own
}

// Retry configures the one retry layer.
type Retry struct {
	// MaxAttempts counts every attempt, the first included. Default 3.
	MaxAttempts int `yaml:"max_attempts"`
	// BaseDelay is the backoff base: the delay before retry n is uniform in
	// [0, min(MaxDelay, BaseDelay·2ⁿ)]. Default 1s.
	BaseDelay Duration `yaml:"base_delay"`
	// MaxDelay caps one backoff delay. Default 30s.
	MaxDelay Duration `yaml:"max_delay"`
	// Deadline bounds all attempts of one request, fallbacks included.
	// Default 10m. A client may shorten it with X-Llmgate-Deadline.
	Deadline Duration `yaml:"deadline"`
	// BudgetRatio is the fraction of live traffic (requests over
	// BudgetWindow) that retries may add. Default 0.2.
	BudgetRatio float64 `yaml:"budget_ratio"`
	// BudgetMinPerSecond retries per second are always allowed. Default 10.
	BudgetMinPerSecond float64 `yaml:"budget_min_per_second"`
	// BudgetWindow is the window live traffic is counted over. Default 10s.
	BudgetWindow Duration `yaml:"budget_window"`
}

// The breaker scopes (Breaker.Scope).
const (
	BreakerScopeModel    = "model"
	BreakerScopeUpstream = "upstream"
)

// Breaker configures the circuit breakers: per upstream and model by
// default, with an upstream-wide one for connection-level failures.
type Breaker struct {
	// Scope is what one breaker covers: "model" (default) — one breaker
	// per upstream and model, so a failing model does not refuse its
	// neighbours, plus one per upstream that counts connection-level
	// failures (refused, DNS, TLS, no response) and, open, refuses every
	// model of it; "upstream" — one breaker per upstream for every model.
	Scope string `yaml:"scope"`
	// ConsecutiveFailures trips the breaker. Default 5; must be >= 1.
	ConsecutiveFailures uint32 `yaml:"consecutive_failures"`
	// FailureRatio, when > 0, also trips the breaker when the ratio of
	// failures over Interval reaches it with at least MinRequests requests.
	FailureRatio float64 `yaml:"failure_ratio"`
	// MinRequests is the minimum count for FailureRatio. Default 20.
	MinRequests uint32 `yaml:"min_requests"`
	// Interval is the closed-state window over which counts are kept.
	// Default 60s.
	Interval Duration `yaml:"interval"`
	// OpenTimeout is how long the breaker stays open before a half-open
	// probe. Default 30s.
	OpenTimeout Duration `yaml:"open_timeout"`
	// HalfOpenRequests is how many probes half-open lets through. Default 1;
	// must be >= 1.
	HalfOpenRequests uint32 `yaml:"half_open_requests"`
}

// Idempotency configures Idempotency-Key handling.
type Idempotency struct {
	// TTL is how long a committed response is replayed. Default 24h.
	TTL Duration `yaml:"ttl"`
	// RequireKey makes a POST without Idempotency-Key a 400.
	RequireKey bool `yaml:"require_key"`
	// WaitTimeout bounds how long a duplicate waits for the in-flight
	// request to commit before it gets 409. Default 60s.
	WaitTimeout Duration `yaml:"wait_timeout"`
	// Lease is how long a claim holds without renewal; renewed while the
	// call runs. Default 30s.
	Lease Duration `yaml:"lease"`
	// CacheTTL is the lifetime of content-keyed cache entries. Default 1h.
	CacheTTL Duration `yaml:"cache_ttl"`
	// MaxRecordBytes caps what one committed response may hold (a body, or
	// all events of a stream). Larger responses are served, not committed.
	// Default 8 MiB.
	MaxRecordBytes int64 `yaml:"max_record_bytes"`
	// MaxRecordEvents caps the SSE events recorded for one stream.
	// Default 100000.
	MaxRecordEvents int `yaml:"max_record_events"`
	// MaxDetached caps the keyed calls that run on after their client
	// stopped waiting (it left, or its X-Llmgate-Deadline passed), so
	// they can be committed. One client may hold half of them: its call
	// past that share is cancelled, its key released and its dead letter
	// recorded. At the cap, a client within its share takes the slot of
	// the newest detached call of the client holding the most (if that
	// one holds more than it), else its own call is cancelled: one
	// client's hanging calls never cancel another's. Default 256.
	MaxDetached int `yaml:"max_detached"`
	// ForwardKeySecret keys the Idempotency-Key llmgate forwards upstream:
	// HMAC-SHA256(secret, client, endpoint, key), so two tenants' equal keys
	// differ upstream (a chained llmgate keeps them apart) and a key cannot
	// be guessed back from what the provider sees. Set the same value on
	// every replica. If empty, the same HMAC with an empty secret is used:
	// tenants stay apart, but a low-entropy key (order-4711) could be
	// guessed by whoever sees the forwarded value and knows the client
	// name. Env GATEWAY_FORWARD_KEY_SECRET. A secret: never logged.
	ForwardKeySecret string `yaml:"forward_key_secret"`
}

// Store selects and sizes the idempotency and dead-letter store.
type Store struct {
	// Kind is "badger" (default, embedded) or "redis". Env GATEWAY_STORE.
	Kind string `yaml:"kind"`
	// SyncWrites makes every Badger commit fsync before the response is
	// sent. Off: a process crash loses nothing, a power loss may lose the
	// last writes. Default false.
	SyncWrites bool `yaml:"sync_writes"`
	// GCInterval is how often Badger's value log is garbage collected.
	// Default 10m.
	GCInterval Duration `yaml:"gc_interval"`
	// WritebackInterval is how often the Badger store asks the kernel to
	// start writing back the part of the value-log file it has finished
	// writing (sync_file_range, not waited for; all but its last folio,
	// 64 KiB to 2 MiB, once 1 MiB more is finished), so that the file's
	// rotation every 16 MiB — an msync in Badger's one writer goroutine,
	// during which no commit completes (~50–100 ms under load) — finds a
	// few MiB to write instead of up to 16. It cuts keyed streams' p99.9 under sustained
	// keyed load from ~60 ms to ~23 ms; its CPU cost did not show in the
	// load tool. It runs on ext2/3/4, XFS, Btrfs and overlayfs only (the
	// log says so at startup elsewhere). Durability is the same either
	// way. 0: off. Default 100ms.
	WritebackInterval Duration `yaml:"writeback_interval"`
	// OpTimeout bounds each claim, commit, release and lease renewal. They run
	// detached from the client (a client's short deadline must not leave
	// a key claimed), under this timeout alone. Badger's operations run in
	// process and cannot be interrupted: it bounds those of Redis. Default
	// 5s.
	OpTimeout Duration `yaml:"op_timeout"`
	// UsageRescan is how often the bytes stored under each client with a
	// max_stored_bytes limit are counted again from the store (they are
	// counted at start, and then as this process commits): it picks up
	// other replicas' commits and records deleted by an operator. 0 counts
	// only at start (and retries a failed count every 30s). Default 10m.
	UsageRescan Duration `yaml:"usage_rescan"`
	// MaxBytes caps what the Badger store's live entries take (records,
	// dead letters, ownership entries not expired or deleted: their keys
	// and values): at it, new keyed requests get 503
	// idempotency_store_full and dead letters are refused, until records
	// expire or an operator purges a client, which gives the cap back
	// within a second; replays and unkeyed requests are served. The files
	// hold deleted entries until the store reclaims its disk (after a
	// purge at once, else every gc_interval), so the disk's free-space
	// floor (min_free_bytes) is what bounds them. 0: no cap. Default 768
	// MiB, which with the default floor fits a 1 GiB volume (README,
	// capacity planning).
	MaxBytes int64 `yaml:"max_bytes"`
	// MinFreeBytes is the free-space floor of data_dir's filesystem: below
	// it the store is full in the same way, and a gateway started below it
	// opens the store read-only. 0 derives it from Badger's options (85
	// MiB at the default memory budget: its memtable WAL, value-log map,
	// flush and compaction room). A
	// lower value risks a crash (SIGBUS) on a disk that fills.
	MinFreeBytes int64 `yaml:"min_free_bytes"`
	Redis        Redis `yaml:"redis"`
}

// Redis configures the shared store for several replicas.
type Redis struct {
	// URL is a redis:// or rediss:// URL. Env GATEWAY_REDIS_URL.
	URL string `yaml:"url"`
	// PoolSize is go-redis's pool size. If 0, go-redis's default of 10 per
	// CPU is used. Env GATEWAY_REDIS_POOL_SIZE.
	PoolSize int `yaml:"pool_size"`
	// Prefix is prepended to every key. Default "llmgate:". Env
	// GATEWAY_REDIS_PREFIX.
	Prefix string `yaml:"prefix"`
	// Cluster treats URL's host list as a Redis Cluster.
	Cluster bool `yaml:"cluster"`
	// WaitReplicas, when > 0, makes every commit wait (Redis WAIT) until
	// that many replicas have the record. Fewer within WaitTimeout: the
	// commit counts as failed, so the client is told (503, or a stream's
	// error event) and never holds an answer a failover could lose; the
	// record stays on the primary, so a retry there replays it. Default 0:
	// a commit is durable once the primary has it.
	WaitReplicas int `yaml:"wait_replicas"`
	// WaitTimeout bounds that wait; it must be under store.op_timeout.
	// Default 1s.
	WaitTimeout Duration `yaml:"wait_timeout"`
	// Sentinel, with Master set, finds the primary through Redis Sentinel
	// and follows it to a promoted replica after a failover. URL then
	// gives only the data nodes' credentials, database, TLS and timeouts
	// (its host is ignored) and may be empty. Not with Cluster.
	Sentinel Sentinel `yaml:"sentinel"`
	// WriteV1Records writes committed records uncompressed, in the format
	// releases before compressed records read. Set it while replicas of
	// such a release share this Redis (a rolling upgrade): they refuse a
	// compressed record, so a retry that reaches one gets 503 instead of
	// the replay. Unset it once every replica runs this release or later.
	// Default false.
	WriteV1Records bool `yaml:"write_v1_records"`
}

// Sentinel is store.redis.sentinel.
type Sentinel struct {
	// Master is the name the Sentinels monitor the primary under
	// (`sentinel monitor <name> ...`). Env GATEWAY_REDIS_SENTINEL_MASTER.
	Master string `yaml:"master"`
	// Addrs are the Sentinels' host:port. Env GATEWAY_REDIS_SENTINEL_ADDRS
	// (comma-separated).
	Addrs []string `yaml:"addrs"`
	// Password is the Sentinels' own (their requirepass); the data nodes'
	// is in URL. Env GATEWAY_REDIS_SENTINEL_PASSWORD.
	Password string `yaml:"password"`
}

// Limits bound what a client may send.
type Limits struct {
	// MaxBodyBytes caps a request body. Default 32 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxHeaderBytes caps request headers. Default 64 KiB.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// MaxJSONDepth caps the nesting of a request body. Default 64.
	MaxJSONDepth int `yaml:"max_json_depth"`
	// StreamIdleTimeout ends an upstream stream that sends nothing for this
	// long. Default 60s.
	StreamIdleTimeout Duration `yaml:"stream_idle_timeout"`
	// MaxInflightBytes bounds the request body bytes held in memory across
	// all requests at once; a request whose body does not fit waits up to
	// AdmissionWait, then gets 503 gateway_overloaded with Retry-After.
	// Must be at least MaxBodyBytes. If 0, the larger of the memory budget
	// (memory.budget_bytes) and 2 × MaxBodyBytes: 64 MiB in a 256 MiB
	// container.
	MaxInflightBytes int64 `yaml:"max_inflight_bytes"`
	// AdmissionWait is how long a request waits for room under
	// MaxInflightBytes. Default 2s.
	AdmissionWait Duration `yaml:"admission_wait"`
}

// Memory sizes the gateway to the memory it has.
type Memory struct {
	// LimitRatio is the share of the cgroup's memory limit (a container's,
	// a pod's limits.memory) set as the Go runtime's soft limit, at start,
	// unless GOMEMLIMIT is set. The rest is for memory the runtime does
	// not count (dirty pages of Badger's mapped files, stacks, the binary).
	// Default 0.8. Env GATEWAY_MEMORY_LIMIT_RATIO.
	LimitRatio float64 `yaml:"limit_ratio"`
	// BudgetBytes is the Go heap the Badger store's memtables, table
	// builders and index cache are sized to, and the default of
	// limits.max_inflight_bytes. If 0: a quarter of the cgroup's limit (or
	// of GOMEMLIMIT), 64 MiB in a 256 MiB container; 64 MiB when there is
	// no limit.
	BudgetBytes int64 `yaml:"budget_bytes"`
}

// Log configures structured logging.
type Log struct {
	// Format is "json" (default) or "text". Env GATEWAY_LOG_FORMAT.
	Format string `yaml:"format"`
	// Level is debug, info (default), warn or error. Env GATEWAY_LOG_LEVEL.
	Level string `yaml:"level"`
}

// Server configures the HTTP server.
type Server struct {
	// ReadHeaderTimeout bounds reading a request's headers. Default 10s.
	ReadHeaderTimeout Duration `yaml:"read_header_timeout"`
	// ReadBodyTimeout bounds reading the body of a /v1 request once its
	// client key is accepted (every /v1 request when no clients are
	// configured), counted from the end of its headers. Default 5m: a body
	// of limits.max_body_bytes (32 MiB) arrives in that time at about
	// 1 Mbit/s, and only key holders get this long.
	ReadBodyTimeout Duration `yaml:"read_body_timeout"`
	// UnauthenticatedReadBodyTimeout bounds reading every other request
	// body: /admin/login, the admin page and API, and a /v1 request before
	// its key is accepted (its refused body is drained within it). Nobody
	// needs long to send a sign-in form, so a connection that trickles one
	// is closed soon. Default 10s.
	UnauthenticatedReadBodyTimeout Duration `yaml:"unauthenticated_read_body_timeout"`
	// IdleTimeout for keep-alive connections. Default 120s.
	IdleTimeout Duration `yaml:"idle_timeout"`
	// WriteStallTimeout bounds one write of a keyed stream to its client
	// while duplicates may be joining it: a client that stops reading for
	// this long (or up to a quarter longer) is dropped, and the call goes
	// on for the joiners and the commit instead of waiting on it. Default
	// 30s.
	WriteStallTimeout Duration `yaml:"write_stall_timeout"`
	// ShutdownGrace is how long in-flight requests and streams get to
	// finish after SIGTERM. Default 30s. Env GATEWAY_SHUTDOWN_GRACE.
	ShutdownGrace Duration `yaml:"shutdown_grace"`
	// TrustedProxies are the reverse proxies (IP addresses, or CIDR
	// ranges such as 10.0.0.0/24) whose X-Forwarded-For and
	// X-Forwarded-Proto headers are believed. Only when a connection comes
	// from one of them is the client's address read from X-Forwarded-For
	// (for the admin log and sign-in throttling) and its scheme from
	// X-Forwarded-Proto (for cookie_secure: auto). From any other peer the
	// headers are ignored: a client sets them to whatever it likes. Behind
	// a proxy that is not listed, every client has the proxy's address,
	// so sign-in throttling slows them all together. Default none. Env
	// GATEWAY_TRUSTED_PROXIES (comma-separated).
	TrustedProxies []string `yaml:"trusted_proxies"`
	// CookieSecure sets the Secure attribute of the admin page's cookies:
	// "true", "false", or "auto" (default): Secure when the request came
	// over TLS, ended in this process or, per X-Forwarded-Proto: https,
	// at a trusted proxy.
	CookieSecure string `yaml:"cookie_secure"`
}

// Values of server.cookie_secure.
const (
	CookieSecureAuto  = "auto"
	CookieSecureTrue  = "true"
	CookieSecureFalse = "false"
)

// TrustedProxyPrefixes parses TrustedProxies, a single address becoming a
// prefix of its full length. Entries that do not parse are left out;
// Validate reports them.
func (s Server) TrustedProxyPrefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, v := range s.TrustedProxies {
		if p, err := parseProxy(v); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// parseProxy parses one trusted_proxies entry: an address or a CIDR range.
// IPv4-mapped IPv6 forms are unmapped, and a range's host bits cleared.
func parseProxy(v string) (netip.Prefix, error) {
	if strings.Contains(v, "/") {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return netip.Prefix{}, err
		}
		a, bits := p.Addr(), p.Bits()
		if a.Is4In6() {
			a, bits = a.Unmap(), max(bits-96, 0)
		}
		return netip.PrefixFrom(a, bits).Masked(), nil
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap().WithZone("")
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// DeadLetters configures the record of keyed requests that finally failed.
type DeadLetters struct {
	// TTL of a dead letter. Default 168h (7 days).
	TTL Duration `yaml:"ttl"`
	// MaxBodyBytes caps the request body stored with a dead letter.
	// Default 256 KiB.
	MaxBodyBytes int `yaml:"max_body_bytes"`
	// AlertThreshold logs at ERROR and flips the alert gauge when the
	// number of dead letters reaches it. 0 disables. Default 10.
	AlertThreshold int `yaml:"alert_threshold"`
	// AlertGrowthPerHour alerts when more than this many arrive in an hour.
	// 0 disables.
	AlertGrowthPerHour int `yaml:"alert_growth_per_hour"`
	// WebhookURL, when set, receives a Slack-compatible JSON alert. It is
	// treated as a secret (Slack puts the token in the path).
	WebhookURL string `yaml:"webhook_url"`
	// WebhookTimeout bounds one webhook POST. Default 5s.
	WebhookTimeout Duration `yaml:"webhook_timeout"`
	// ReplayPerSecond bounds group replays. Default 5.
	ReplayPerSecond float64 `yaml:"replay_per_second"`
	// MaxPerClient caps how many dead letters one client keeps: a new
	// letter past it deletes that client's oldest (by last failure), never
	// another client's. 0: no count bound. Default 1000.
	MaxPerClient int `yaml:"max_per_client"`
	// MaxBytesPerClient caps what one client's dead letters take in the
	// store (stored bytes, a body counting about 4/3 of its size), the
	// same way: so that one client's failing keyed requests cannot fill
	// the store every client's keyed requests need. Dead letters are not
	// counted in the client's own limits.max_stored_bytes (they live 7
	// days: one outage would lock its keyed requests out for a week). 0
	// (default): a small share of store.max_bytes, 1/32 of it (24 MiB at
	// the default 768 MiB), or 32 MiB with no cap. -1: no bytes bound.
	MaxBytesPerClient int64 `yaml:"max_bytes_per_client"`
}

// PerClientBytes is the bytes bound on one client's dead letters that
// MaxBytesPerClient means with the store capped at storeMax (0: none).
func (d DeadLetters) PerClientBytes(storeMax int64) int64 {
	switch {
	case d.MaxBytesPerClient > 0:
		return d.MaxBytesPerClient
	case d.MaxBytesPerClient < 0:
		return 0
	case storeMax > 0:
		return max(storeMax/32, 1)
	}
	return 32 << 20
}

// Tracing configures OpenTelemetry traces: a span per request and one per
// upstream attempt, exported over OTLP/HTTP. Off unless an endpoint is set.
type Tracing struct {
	// Endpoint is the OTLP/HTTP (protobuf) traces URL, e.g.
	// http://otel-collector:4318/v1/traces; a URL with no path gets
	// /v1/traces. Empty: tracing is off (the default). Env
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as is) or
	// OTEL_EXPORTER_OTLP_ENDPOINT (+ /v1/traces); OTEL_SDK_DISABLED=true
	// turns tracing off whatever is set. The exporter reads the other
	// OTEL_EXPORTER_OTLP_* variables (headers, timeout, certificates)
	// itself.
	Endpoint string `yaml:"endpoint"`
	// SampleRatio is the fraction of traces started here that are
	// recorded, in [0, 1]. A continued client trace follows the client's
	// sampled flag instead. Default 1.
	SampleRatio float64 `yaml:"sample_ratio"`
	// TrustClientContext continues a client's W3C traceparent: the
	// request's span becomes a child of the client's. When false, the
	// request starts a new trace linked to the client's, so a client can
	// neither choose the trace id nor force sampling. Default true.
	TrustClientContext bool `yaml:"trust_client_context"`
}

// Duration is a time.Duration that decodes from YAML strings like "30s" or
// "1h30m" (time.ParseDuration). A plain number other than 0 is rejected:
// "30" could mean seconds or milliseconds, so the unit must be written.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats d like time.Duration.String without trailing zero units:
// "24h", "1m30s", "500ms".
func (d Duration) String() string {
	s := time.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// MarshalYAML writes d as its String, which UnmarshalYAML reads back.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// UnmarshalYAML parses a duration string. Its errors carry the line, and
// Load adds the field path.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return durationError(n.Line, n.Column, "expected a duration string such as \"30s\"")
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		if _, ferr := strconv.ParseFloat(n.Value, 64); ferr == nil {
			return durationError(n.Line, n.Column,
				fmt.Sprintf("duration %s has no unit (add one, e.g. \"%ss\" or \"%sms\")", n.Value, n.Value, n.Value))
		}
		return durationError(n.Line, n.Column,
			fmt.Sprintf("invalid duration %q (write a number with a unit, e.g. \"30s\", \"5m\", \"1h30m\")", n.Value))
	}
	*d = Duration(v)
	return nil
}

// durationError is a bad duration at a position in the YAML text. It is
// returned as a *yaml.TypeError, so decoding goes on and every problem in
// the file is reported together; Load replaces the column with the path.
func durationError(line, column int, msg string) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d column %d: %s", line, column, msg)}}
}

// Serves reports whether u serves model: some pattern in u.Models equals it
// or matches it, where '*' matches any run of characters, '/' included
// ("meta-llama/*"), and every other character matches itself.
func (u Upstream) Serves(model string) bool {
	for _, p := range u.Models {
		if p == model || (p != "" && globMatch(p, model)) {
			return true
		}
	}
	return false
}

// globMatch matches s against pattern where '*' is the only wildcard. It
// backtracks only to the last '*', so it runs in O(len(pattern)·len(s)).
func globMatch(pattern, s string) bool {
	p, i := 0, 0
	star, mark := -1, 0 // position after the last '*', and where in s it resumed
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p+1, i
			p++
		case p < len(pattern) && pattern[p] == s[i]:
			p++
			i++
		case star >= 0:
			mark++
			p, i = star, mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
