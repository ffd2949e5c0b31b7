package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// LoadFile reads the YAML file at path and calls Load. An empty path means
// no file: the defaults plus the environment, which is what a zero-config
// run with only OPENAI_API_KEY set uses.
func LoadFile(path string, getenv func(string) string) (Config, error) {
	if path == "" {
		return Load(nil, getenv)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err // already names the path
	}
	cfg, err := Load(data, getenv)
	if err != nil {
		return Config{}, fmt.Errorf("load config %s: %w", path, err)
	}
	return cfg, nil
}

// Load builds a Config from YAML text and the environment, in this order:
//
//  1. Every ${NAME} in the text is replaced with getenv(NAME); an unset
//     variable becomes "". Only the braced form is expanded, so a lone "$"
//     is left alone, and "$${" is an escape for a literal "${". The text is
//     expanded before it is parsed, so quote a value that may hold YAML
//     syntax ("${KEY}"). A key left with no value (key: ${UNSET}) keeps its
//     default.
//  2. The text is decoded strictly over Default(): an unknown key, a value
//     of the wrong type or a bad duration is an error naming its line.
//  3. The GATEWAY_* variables override the file (see applyEnv), and when the
//     file lists no upstreams, OPENAI_API_KEY or OPENAI_BASE_URL adds one.
//  4. Per-upstream defaults are applied and the result is validated; the
//     error then lists every problem found (see Validate).
//
// data may be empty. A nil getenv is an empty environment; pass os.Getenv
// to use the process's.
func Load(data []byte, getenv func(string) string) (Config, error) {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	data, err := expandEnv(data, getenv)
	if err != nil {
		return Config{}, err
	}
	cfg := Default()
	var problems []error
	if err := decodeStrict(data, &cfg); err != nil {
		var te *typeErrors
		if !errors.As(err, &te) {
			return Config{}, err
		}
		// Unknown keys and bad values: the rest of the file decoded, so
		// validate it too and report every problem at once.
		problems = append(problems, te.errs...)
	}
	problems = append(problems, applyEnv(&cfg, getenv)...)
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return Config{}, errors.Join(problems...)
	}
	return cfg, nil
}

// expandEnv replaces ${NAME} with getenv(NAME) and "$${" with "${".
// Anything else, including "$NAME" and "${not a name}", is copied as is.
func expandEnv(data []byte, getenv func(string) string) ([]byte, error) {
	if !bytes.Contains(data, []byte("${")) {
		return data, nil
	}
	var out bytes.Buffer
	out.Grow(len(data))
	for i := 0; i < len(data); {
		if bytes.HasPrefix(data[i:], []byte("$${")) {
			out.WriteString("${")
			i += 3
			continue
		}
		if bytes.HasPrefix(data[i:], []byte("${")) {
			if end := bytes.IndexByte(data[i+2:], '}'); end >= 0 {
				name := string(data[i+2 : i+2+end])
				if isEnvName(name) {
					v := getenv(name)
					// A newline would let the variable add keys of its own.
					if strings.ContainsAny(v, "\r\n") {
						return nil, fmt.Errorf("line %d: ${%s}: the value contains a newline", 1+bytes.Count(data[:i], []byte("\n")), name)
					}
					out.WriteString(v)
					i += 2 + end + 1
					continue
				}
			}
		}
		out.WriteByte(data[i])
		i++
	}
	return out.Bytes(), nil
}

func isEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case c == '_', 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// decodeStrict decodes one YAML document into cfg, rejecting unknown keys.
func decodeStrict(data []byte, cfg *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(cfg)
	if errors.Is(err, io.EOF) {
		return nil // empty, or only comments
	}
	var yte *yaml.TypeError
	if errors.As(err, &yte) {
		te := &typeErrors{}
		for _, msg := range yte.Errors {
			te.errs = append(te.errs, errors.New(withPath(data, msg)))
		}
		return te
	}
	if err != nil {
		return err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return err
		}
		return fmt.Errorf("line %d: a second YAML document; the config is one document", extra.Line)
	}
	return nil
}

// typeErrors are the problems yaml.v3 collected while decoding the rest of
// the document: unknown keys, wrong types, bad durations.
type typeErrors struct{ errs []error }

func (e *typeErrors) Error() string { return errors.Join(e.errs...).Error() }

var lineColumn = regexp.MustCompile(`^line (\d+) column (\d+): `)

// withPath rewrites a duration error's "line L column C: " into
// "line L: <field path>: ".
func withPath(data []byte, msg string) string {
	m := lineColumn.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	line, _ := strconv.Atoi(m[1])
	col, _ := strconv.Atoi(m[2])
	rest := msg[len(m[0]):]
	if p := pathAt(data, line, col); p != "" {
		return fmt.Sprintf("line %d: %s: %s", line, p, rest)
	}
	return fmt.Sprintf("line %d: %s", line, rest)
}

// pathAt returns the field path ("upstreams[0].timeout") of the value at
// line and column of data, or "" if there is none. It runs only after a
// decode error, so data is known to parse.
func pathAt(data []byte, line, column int) string {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return ""
	}
	var walk func(n *yaml.Node, path string) string
	walk = func(n *yaml.Node, path string) string {
		if n.Line == line && n.Column == column && n.Kind != yaml.DocumentNode {
			return path
		}
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				if p := walk(c, path); p != "" {
					return p
				}
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := n.Content[i].Value
				if path != "" {
					p = path + "." + p
				}
				if p := walk(n.Content[i+1], p); p != "" {
					return p
				}
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				if p := walk(c, path+"["+strconv.Itoa(i)+"]"); p != "" {
					return p
				}
			}
		}
		return ""
	}
	return walk(&root, "")
}

// envOverrides are the GATEWAY_* variables and the config keys they set:
// every key the deploy files (deploy/gateway.yaml, deploy/k8s) set, plus
// replicas, which must follow a deployment's replica count. An empty
// variable counts as unset; a value that does not parse is a problem
// Load reports with the others.
var envOverrides = []struct {
	name, key string
	set       func(c *Config, v string) error
}{
	{"GATEWAY_ADDR", "listen", func(c *Config, v string) error { c.Listen = v; return nil }},
	{"GATEWAY_DATA_DIR", "data_dir", func(c *Config, v string) error { c.DataDir = v; return nil }},
	{"GATEWAY_ADMIN_TOKEN", "admin_token", func(c *Config, v string) error { c.AdminToken = v; return nil }},
	{"GATEWAY_FORWARD_KEY_SECRET", "idempotency.forward_key_secret", func(c *Config, v string) error { c.Idempotency.ForwardKeySecret = v; return nil }},
	{"GATEWAY_STORE", "store.kind", func(c *Config, v string) error { c.Store.Kind = v; return nil }},
	{"GATEWAY_REDIS_URL", "store.redis.url", func(c *Config, v string) error { c.Store.Redis.URL = v; return nil }},
	{"GATEWAY_REDIS_PREFIX", "store.redis.prefix", func(c *Config, v string) error { c.Store.Redis.Prefix = v; return nil }},
	{"GATEWAY_REDIS_POOL_SIZE", "store.redis.pool_size", func(c *Config, v string) error { return envInt(&c.Store.Redis.PoolSize, v) }},
	{"GATEWAY_REDIS_SENTINEL_MASTER", "store.redis.sentinel.master", func(c *Config, v string) error { c.Store.Redis.Sentinel.Master = v; return nil }},
	{"GATEWAY_REDIS_SENTINEL_ADDRS", "store.redis.sentinel.addrs", func(c *Config, v string) error {
		c.Store.Redis.Sentinel.Addrs = nil
		for a := range strings.SplitSeq(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				c.Store.Redis.Sentinel.Addrs = append(c.Store.Redis.Sentinel.Addrs, a)
			}
		}
		return nil
	}},
	{"GATEWAY_REDIS_SENTINEL_PASSWORD", "store.redis.sentinel.password", func(c *Config, v string) error { c.Store.Redis.Sentinel.Password = v; return nil }},
	{"GATEWAY_LOG_FORMAT", "log.format", func(c *Config, v string) error { c.Log.Format = v; return nil }},
	{"GATEWAY_LOG_LEVEL", "log.level", func(c *Config, v string) error { c.Log.Level = v; return nil }},
	{"GATEWAY_REPLICAS", "replicas", func(c *Config, v string) error { return envInt(&c.Replicas, v) }},
	{"GATEWAY_SHUTDOWN_GRACE", "server.shutdown_grace", func(c *Config, v string) error { return envDuration(&c.Server.ShutdownGrace, v) }},
	{"GATEWAY_TRUSTED_PROXIES", "server.trusted_proxies", func(c *Config, v string) error {
		c.Server.TrustedProxies = nil
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				c.Server.TrustedProxies = append(c.Server.TrustedProxies, p)
			}
		}
		return nil
	}},
	{"GATEWAY_MEMORY_LIMIT_RATIO", "memory.limit_ratio", func(c *Config, v string) error {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return errors.New("not a number (e.g. 0.8)")
		}
		c.Memory.LimitRatio = f
		return nil
	}},
}

func envInt(dst *int, v string) error {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return errors.New("not a whole number")
	}
	*dst = n
	return nil
}

func envDuration(dst *Duration, v string) error {
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return errors.New(`not a duration (e.g. "30s")`)
	}
	*dst = Duration(d)
	return nil
}

// applyEnv is the one place environment variables override the file
// (envOverrides, OpenTelemetry's, and the zero-config upstream). It
// returns the variables whose values do not parse, with the value: only
// numbers and durations can fail to, never a secret.
func applyEnv(c *Config, getenv func(string) string) []error {
	var problems []error
	for _, o := range envOverrides {
		if v := getenv(o.name); v != "" {
			if err := o.set(c, v); err != nil {
				problems = append(problems, fmt.Errorf("%s=%q: %w (it sets %s)", o.name, v, err, o.key))
			}
		}
	}
	applyOTelEnv(&c.Tracing, getenv)

	// Zero-config: OPENAI_API_KEY alone is enough to run. A file that lists
	// upstreams is taken as complete, so these never add a second one.
	key, base := getenv("OPENAI_API_KEY"), getenv("OPENAI_BASE_URL")
	if len(c.Upstreams) == 0 && (key != "" || base != "") {
		if base == "" {
			base = DefaultOpenAIBaseURL
		}
		c.Upstreams = []Upstream{{Name: "openai", BaseURL: base, APIKey: key, Models: []string{"*"}}}
	}
	return problems
}

// applyOTelEnv applies OpenTelemetry's standard variables: the traces
// endpoint (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as is, else
// OTEL_EXPORTER_OTLP_ENDPOINT as a base URL + /v1/traces, as the
// specification says) and OTEL_SDK_DISABLED.
func applyOTelEnv(t *Tracing, getenv func(string) string) {
	if v := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); v != "" {
		t.Endpoint = v
	} else if v := getenv("OTEL_EXPORTER_OTLP_ENDPOINT"); v != "" {
		t.Endpoint = strings.TrimRight(v, "/") + "/v1/traces"
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		t.Endpoint = ""
	}
}

// DefaultOpenAIBaseURL is the base URL of the upstream added from
// OPENAI_API_KEY when OPENAI_BASE_URL is unset.
const DefaultOpenAIBaseURL = "https://api.openai.com/v1"

// WithDefaults is u with every unset field at its default: the one place
// upstream defaults live (Load applies it; so does the gateway, for a
// Config built in code).
func (u Upstream) WithDefaults() Upstream {
	u.BaseURL = strings.TrimRight(u.BaseURL, "/")
	if u.Timeout <= 0 {
		u.Timeout = Duration(DefaultUpstreamTimeout)
	}
	if len(u.Models) == 0 {
		u.Models = []string{"*"}
	}
	if u.MaxIdleConns <= 0 {
		u.MaxIdleConns = DefaultUpstreamMaxIdleConns
	}
	if u.API == "" {
		u.API = APIOpenAI
	}
	if u.Auth == "" {
		u.Auth = AuthBearer
		if u.API == APIAnthropic {
			u.Auth = AuthXAPIKey
		}
	}
	if u.AnthropicVersion == "" && u.API == APIAnthropic {
		u.AnthropicVersion = DefaultAnthropicVersion
	}
	return u
}

// applyDefaults fills the per-upstream defaults and normalizes values that
// have one obvious spelling.
func (c *Config) applyDefaults() {
	for i := range c.Upstreams {
		c.Upstreams[i] = c.Upstreams[i].WithDefaults()
	}
	for i := range c.Clients {
		c.Clients[i].KeySHA256 = strings.ToLower(c.Clients[i].KeySHA256)
	}
	if len(c.Server.TrustedProxies) == 0 {
		c.Server.TrustedProxies = nil // "trusted_proxies: []" is the default, none
	}
}
