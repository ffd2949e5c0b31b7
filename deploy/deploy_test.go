package deploy_test

// These tests parse every deployment file and check that they agree with
// each other and with what the gateway binary serves and reads: the port it
// listens on, its probe routes, the environment variables it reads, its
// shutdown grace, the metric names it registers. Nothing here needs Docker
// or a cluster; TestKustomizeBuild runs `kubectl kustomize` when kubectl is
// on the PATH and skips otherwise.

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/llmgate/llmgate/config"
)

// binaryEnv is every environment variable the gateway binary reads by name.
// Keep it in step with config/load.go's applyEnv (the GATEWAY_* overrides
// and the zero-config OPENAI_* upstream). The ${NAME}s a config file
// references are read too; refsOf adds those per file.
var binaryEnv = map[string]bool{
	"GATEWAY_ADDR":        true,
	"GATEWAY_DATA_DIR":    true,
	"GATEWAY_ADMIN_TOKEN": true,
	"GATEWAY_STORE":       true,
	"GATEWAY_REDIS_URL":   true,
	"GATEWAY_LOG_FORMAT":  true,
	"GATEWAY_LOG_LEVEL":   true,
	// The rest of config/load.go's envOverrides.
	"GATEWAY_FORWARD_KEY_SECRET": true,
	"GATEWAY_REDIS_PREFIX":       true,
	"GATEWAY_REDIS_POOL_SIZE":    true,
	"GATEWAY_REPLICAS":           true,
	"GATEWAY_SHUTDOWN_GRACE":     true,
	"GATEWAY_TRUSTED_PROXIES":    true,
	"OPENAI_API_KEY":             true,
	"OPENAI_BASE_URL":            true,
	// GOMEMLIMIT is left out on purpose: the gateway sets the Go memory
	// limit from the container's cgroup limit (memory.limit_ratio), so a
	// manifest that hard-codes it fails TestEnvNames.
	"GATEWAY_MEMORY_LIMIT_RATIO": true,
}

// pendingMetrics are announced (used by alerts.yaml or the dashboard) but
// not registered yet. Remove each name once it is registered;
// TestMetricNames fails as soon as one appears in the source, so this list
// cannot go stale. (Empty: the dead-letter and store-record metrics are
// registered now.)
var pendingMetrics = map[string]bool{}

// ---------------------------------------------------------------------------
// gateway.yaml

// envRef matches ${NAME} as config.Load expands it ("$${" is an escape,
// handled in refsOf).
var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// refsOf returns the ${NAME}s in a config file, sorted.
func refsOf(data []byte) []string {
	var names []string
	for _, m := range envRef.FindAllSubmatchIndex(data, -1) {
		if m[0] > 0 && data[m[0]-1] == '$' {
			continue // "$${" is a literal "${"
		}
		names = append(names, string(data[m[2]:m[3]]))
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// gatewayConfig loads deploy/gateway.yaml as the binary would, with a
// placeholder value for every ${NAME} it references and nothing else set.
func gatewayConfig(t *testing.T) (config.Config, []string) {
	t.Helper()
	data := readFile(t, "gateway.yaml")
	refs := refsOf(data)
	getenv := func(name string) string {
		if slices.Contains(refs, name) {
			return "placeholder-" + strings.ToLower(name)
		}
		return ""
	}
	cfg, err := config.Load(data, getenv)
	if err != nil {
		t.Fatalf("gateway.yaml does not load: %v", err)
	}
	return cfg, refs
}

func TestGatewayConfig(t *testing.T) {
	cfg, refs := gatewayConfig(t)
	if len(refs) == 0 {
		t.Error("gateway.yaml references no ${NAME}: where do its secrets come from?")
	}
	if cfg.ListenIsLoopback() {
		t.Errorf("listen %s is loopback: unreachable from outside the container", cfg.Listen)
	}
	if len(cfg.Clients) == 0 || cfg.AllowInsecureListen {
		t.Error("gateway.yaml must authenticate clients (clients: set, allow_insecure_listen off)")
	}
	if cfg.Store.Kind != config.StoreRedis {
		t.Errorf("store.kind = %q; replicas share idempotency keys only through %q", cfg.Store.Kind, config.StoreRedis)
	}
	if cfg.AdminToken == "" {
		t.Error("admin_token is empty: /metrics would be refused to Prometheus")
	}
	if cfg.Log.Format != "json" {
		t.Errorf("log.format = %q, want json", cfg.Log.Format)
	}
	if cfg.Server.ShutdownGrace.D() <= 0 {
		t.Errorf("server.shutdown_grace = %s", cfg.Server.ShutdownGrace)
	}
}

// listenPort is the port gateway.yaml listens on.
func listenPort(t *testing.T) int {
	t.Helper()
	cfg, _ := gatewayConfig(t)
	_, p, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ---------------------------------------------------------------------------
// Ports and probes

func TestListenPortAgrees(t *testing.T) {
	want := listenPort(t)
	d := deployment(t)
	c := gatewayContainer(t, d)
	if p := c.port("http"); p != want {
		t.Errorf("deployment.yaml: containerPort http = %d, want %d (gateway.yaml listen)", p, want)
	}

	df := dockerfile(t)
	if got := df.all("EXPOSE"); !slices.Equal(got, []string{strconv.Itoa(want)}) {
		t.Errorf("Dockerfile: EXPOSE %q, want %d", got, want)
	}
	checkURL(t, "Dockerfile HEALTHCHECK", df.healthcheckURL(t), want, "/healthz")
	checkURL(t, "healthcheck/main.go defaultURL", healthcheckDefaultURL(t), want, "/healthz")

	servers := nginxUpstreamServers(t)
	if len(servers) == 0 {
		t.Fatal("nginx.conf: no upstream servers")
	}
	for _, s := range servers {
		_, p, err := net.SplitHostPort(s)
		if err != nil || p != strconv.Itoa(want) {
			t.Errorf("nginx.conf: upstream server %s, want port %d", s, want)
		}
	}

	for name, s := range gatewayServices(t) {
		u := s.healthcheckURL(t)
		checkURL(t, "compose.yaml "+name+" healthcheck", u, want, "")
		if path := mustParseURL(t, u).Path; path != "/healthz" && path != "/readyz" {
			t.Errorf("compose.yaml %s healthcheck: path %s, want /healthz or /readyz", name, path)
		}
	}

	svc := k8sService(t)
	for _, p := range svc.Spec.Ports {
		if p.TargetPort != "http" && p.TargetPort != strconv.Itoa(want) {
			t.Errorf("service.yaml: targetPort %q, want http or %d", p.TargetPort, want)
		}
	}
}

func TestProbePaths(t *testing.T) {
	served := servedRoutes(t)
	for _, p := range []string{"/healthz", "/readyz"} {
		if !served[p] {
			t.Fatalf("the gateway (../gateway/*.go) no longer registers GET %s", p)
		}
	}
	c := gatewayContainer(t, deployment(t))
	for _, tc := range []struct {
		name  string
		probe *probe
		want  string
	}{
		{"readinessProbe", c.ReadinessProbe, "/readyz"},
		{"livenessProbe", c.LivenessProbe, "/healthz"},
		{"startupProbe", c.StartupProbe, "/healthz"},
	} {
		if tc.probe == nil || tc.probe.HTTPGet == nil {
			t.Errorf("deployment.yaml: %s is not an httpGet probe", tc.name)
			continue
		}
		if tc.probe.HTTPGet.Path != tc.want {
			t.Errorf("deployment.yaml: %s path %q, want %q", tc.name, tc.probe.HTTPGet.Path, tc.want)
		}
		if pt := tc.probe.HTTPGet.Port; pt != "http" && pt != strconv.Itoa(listenPort(t)) {
			t.Errorf("deployment.yaml: %s port %q, want http", tc.name, pt)
		}
	}
	// The Dockerfile and helper paths are checked in TestListenPortAgrees.
}

// servedRoutes returns the paths the gateway registers with e.GET("...").
func servedRoutes(t *testing.T) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`\.GET\("(/[a-z]+)"`)
	out := map[string]bool{}
	for _, src := range goSources(t, filepath.Join("..", "gateway")) {
		for _, m := range re.FindAllSubmatch(src, -1) {
			out[string(m[1])] = true
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// Environment and secrets

func TestEnvNames(t *testing.T) {
	_, refs := gatewayConfig(t)
	reads := func(name string) bool { return binaryEnv[name] || slices.Contains(refs, name) }

	sec := secretExample(t)
	d := deployment(t)
	c := gatewayContainer(t, d)
	provided := map[string]bool{}
	for _, e := range c.Env {
		if !reads(e.Name) {
			t.Errorf("deployment.yaml sets %s, which the gateway does not read", e.Name)
		}
		if r := e.secretRef(); r != nil {
			if r.Name != sec.Metadata.Name {
				t.Errorf("deployment.yaml: %s from Secret %q, want %q", e.Name, r.Name, sec.Metadata.Name)
			}
			if _, ok := sec.StringData[r.Key]; !ok && !r.Optional {
				t.Errorf("deployment.yaml: %s needs key %s, which secret.example.yaml lacks", e.Name, r.Key)
			}
		}
		provided[e.Name] = true
	}
	if len(c.EnvFrom) > 0 {
		t.Error("deployment.yaml: envFrom hides which variables are set; list them in env")
	}
	for k := range sec.StringData {
		if !reads(k) {
			t.Errorf("secret.example.yaml has %s, which the gateway does not read", k)
		}
	}
	for _, r := range refs {
		if _, ok := sec.StringData[r]; !ok {
			t.Errorf("gateway.yaml needs ${%s}; secret.example.yaml does not provide it", r)
		}
		if !provided[r] {
			t.Errorf("gateway.yaml needs ${%s}; deployment.yaml does not set it", r)
		}
	}

	envExample := dotenvKeys(t, "env.example")
	for name, s := range gatewayServices(t) {
		for k, v := range s.Environment {
			if !reads(k) {
				t.Errorf("compose.yaml %s sets %s, which the gateway does not read", name, k)
			}
			// ${NAME...} substituted from deploy/.env: env.example documents it.
			for _, m := range regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)`).FindAllStringSubmatch(v, -1) {
				if !envExample[m[1]] {
					t.Errorf("compose.yaml %s: %s comes from ${%s}, which env.example does not document", name, k, m[1])
				}
			}
		}
		for _, r := range refs {
			v, ok := s.Environment[r]
			if !ok {
				t.Errorf("gateway.yaml needs ${%s}; compose.yaml %s does not set it", r, name)
			} else if !strings.Contains(v, "${"+r+":?") {
				t.Errorf("compose.yaml %s: %s = %q; want ${%s:?...} so a missing value stops `up`", name, r, v, r)
			}
		}
	}
}

// dotenvKeys returns the NAME=... keys of a .env-style file, commented
// ones (#NAME=...) included, since they document optional variables.
func dotenvKeys(t *testing.T, path string) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`(?m)^#?([A-Za-z_][A-Za-z0-9_]*)=`)
	out := map[string]bool{}
	for _, m := range re.FindAllSubmatch(readFile(t, path), -1) {
		out[string(m[1])] = true
	}
	return out
}

// ---------------------------------------------------------------------------
// Shutdown

func TestShutdownTiming(t *testing.T) {
	cfg, _ := gatewayConfig(t)
	grace := cfg.Server.ShutdownGrace.D()

	d := deployment(t)
	c := gatewayContainer(t, d)
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Fatal("deployment.yaml: want lifecycle.preStop.sleep (distroless has no sleep binary for an exec hook)")
	}
	if c.Lifecycle.PreStop.Exec != nil {
		t.Error("deployment.yaml: preStop exec cannot run in distroless (no shell, no sleep)")
	}
	preStop := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	if preStop <= 0 {
		t.Error("deployment.yaml: preStop sleep must be > 0")
	}
	term := time.Duration(d.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	if term < preStop+grace {
		t.Errorf("terminationGracePeriodSeconds %s < preStop %s + shutdown_grace %s: streams would be killed mid-drain",
			term, preStop, grace)
	}

	for name, s := range gatewayServices(t) {
		sg, err := time.ParseDuration(s.StopGracePeriod)
		if err != nil {
			t.Errorf("compose.yaml %s: stop_grace_period %q: %v", name, s.StopGracePeriod, err)
			continue
		}
		if sg < grace {
			t.Errorf("compose.yaml %s: stop_grace_period %s < shutdown_grace %s", name, sg, grace)
		}
	}
}

// ---------------------------------------------------------------------------
// Config delivery and the container

func TestConfigDelivery(t *testing.T) {
	// Kustomize reads no file outside its directory, so k8s/ keeps a copy.
	if !bytes.Equal(readFile(t, "gateway.yaml"), readFile(t, "k8s/gateway.yaml")) {
		t.Error("k8s/gateway.yaml differs from gateway.yaml: cp deploy/gateway.yaml deploy/k8s/gateway.yaml")
	}

	var k struct {
		Resources          []string `yaml:"resources"`
		ConfigMapGenerator []struct {
			Name  string   `yaml:"name"`
			Files []string `yaml:"files"`
		} `yaml:"configMapGenerator"`
	}
	decodeYAML(t, "k8s/kustomization.yaml", &k)
	if len(k.ConfigMapGenerator) != 1 {
		t.Fatalf("kustomization.yaml: %d configMapGenerators, want 1", len(k.ConfigMapGenerator))
	}
	gen := k.ConfigMapGenerator[0]
	if !slices.Equal(gen.Files, []string{"gateway.yaml"}) && !slices.Equal(gen.Files, []string{"gateway.yaml=gateway.yaml"}) {
		t.Errorf("kustomization.yaml: configMapGenerator files %q, want [gateway.yaml]", gen.Files)
	}
	for _, r := range k.Resources {
		if _, err := os.Stat(filepath.Join("k8s", r)); err != nil {
			t.Errorf("kustomization.yaml: resource %s: %v", r, err)
		}
	}
	for _, notHere := range []string{"secret.example.yaml", "prometheus-rules.yaml", "servicemonitor.yaml"} {
		if slices.Contains(k.Resources, notHere) {
			t.Errorf("kustomization.yaml must not list %s (see its comment)", notHere)
		}
	}

	cfg, _ := gatewayConfig(t)
	d := deployment(t)
	c := gatewayContainer(t, d)
	vols := map[string]volume{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	var configDir string
	var dataMounted bool
	for _, m := range c.VolumeMounts {
		v := vols[m.Name]
		if v.ConfigMap != nil && v.ConfigMap.Name == gen.Name {
			configDir = m.MountPath
		}
		if v.EmptyDir != nil && m.MountPath == cfg.DataDir {
			dataMounted = true
		}
	}
	if configDir == "" {
		t.Fatalf("deployment.yaml: ConfigMap %s is not mounted", gen.Name)
	}
	configPath := configDir + "/gateway.yaml"
	if !slices.Equal(c.Args, []string{"-config", configPath}) {
		t.Errorf("deployment.yaml: args %q, want [-config %s]", c.Args, configPath)
	}
	if !dataMounted {
		t.Errorf("deployment.yaml: no emptyDir at data_dir %s (the root filesystem is read-only)", cfg.DataDir)
	}

	sc := c.SecurityContext
	if sc == nil || !sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) {
		t.Errorf("deployment.yaml: container securityContext %+v, want readOnlyRootFilesystem, no privilege escalation, drop ALL", sc)
	}
	if psc := d.Spec.Template.Spec.SecurityContext; psc == nil || !psc.RunAsNonRoot {
		t.Error("deployment.yaml: pod securityContext.runAsNonRoot must be true")
	}
	if lim := c.Resources.Limits["memory"]; lim != "256Mi" {
		t.Errorf("deployment.yaml: memory limit %q, want 256Mi", lim)
	}
	if req := c.Resources.Requests["memory"]; req != "64Mi" {
		t.Errorf("deployment.yaml: memory request %q, want 64Mi", req)
	}

	df := dockerfile(t)
	if got := df.cmd(t); !slices.Equal(got, []string{"-config", configPath}) {
		t.Errorf("Dockerfile: CMD %q, want [-config %s]", got, configPath)
	}
	if u := df.last("USER"); u == "" || u == "root" || strings.HasPrefix(u, "0") {
		t.Errorf("Dockerfile: final USER %q, want a non-root user", u)
	}
	for name, s := range gatewayServices(t) {
		if !slices.Equal(s.Command, []string{"-config", configPath}) {
			t.Errorf("compose.yaml %s: command %q, want [-config %s]", name, s.Command, configPath)
		}
		if !slices.Contains(s.Volumes, "./gateway.yaml:"+configPath+":ro") {
			t.Errorf("compose.yaml %s: volumes %q, want ./gateway.yaml:%s:ro", name, s.Volumes, configPath)
		}
	}
}

func TestRedisName(t *testing.T) {
	cfg, _ := gatewayConfig(t)
	u := mustParseURL(t, cfg.Store.Redis.URL)
	host, port := u.Hostname(), u.Port()
	compose := composeFile(t)
	if _, ok := compose.Services[host]; !ok {
		t.Errorf("store.redis.url names host %s; compose.yaml has no such service", host)
	}
	for name, s := range gatewayServices(t) {
		if s.DependsOn[host].Condition != "service_healthy" {
			t.Errorf("compose.yaml %s: want depends_on %s: condition: service_healthy", name, host)
		}
	}
	found := false
	for _, doc := range yamlDocs(t, "k8s/redis.yaml") {
		var svc service
		if err := doc.Decode(&svc); err != nil {
			t.Fatal(err)
		}
		if svc.Kind == "Service" && svc.Metadata.Name == host {
			found = true
			if len(svc.Spec.Ports) == 0 || strconv.Itoa(svc.Spec.Ports[0].Port) != port {
				t.Errorf("k8s/redis.yaml: Service %s ports %+v, want %s", host, svc.Spec.Ports, port)
			}
		}
	}
	if !found {
		t.Errorf("store.redis.url names host %s; k8s/redis.yaml has no such Service", host)
	}
}

// TestRedisPersistence holds the shipped Redis to what the README promises
// of it: committed idempotency records survive a restart of Redis (the
// e2e test TestFaultRedisRestart shows what a Redis without persistence
// does to a client's retry). Both manifests run it with an append-only
// file, fsynced at least once a second, on a volume that outlives the
// container.
func TestRedisPersistence(t *testing.T) {
	cfg, _ := gatewayConfig(t)
	host := mustParseURL(t, cfg.Store.Redis.URL).Hostname()
	aof := func(where string, args []string) {
		t.Helper()
		flag := func(name string) string {
			if i := slices.Index(args, name); i >= 0 && i+1 < len(args) {
				return args[i+1]
			}
			return ""
		}
		if flag("--appendonly") != "yes" {
			t.Errorf("%s: args %q lack --appendonly yes", where, args)
		}
		// everysec postpones the file's write while an fsync runs and
		// answers meanwhile: a kill -9 on a busy disk loses acknowledged
		// commits (README, "What durable means per store").
		if f := flag("--appendfsync"); f != "always" {
			t.Errorf("%s: --appendfsync %q, want always", where, f)
		}
	}

	var compose struct {
		Services map[string]composeService `yaml:"services"`
		Volumes  map[string]any            `yaml:"volumes"`
	}
	decodeYAML(t, "compose.yaml", &compose)
	r := compose.Services[host]
	aof("compose.yaml "+host, r.Command)
	named := false
	for _, v := range r.Volumes {
		if src, dst, ok := strings.Cut(v, ":"); ok && strings.HasPrefix(dst, "/data") {
			if _, declared := compose.Volumes[src]; declared {
				named = true
			}
		}
	}
	if !named {
		t.Errorf("compose.yaml %s: volumes %q, want a named volume at /data", host, r.Volumes)
	}

	claims := map[string]bool{}
	var dep struct {
		Kind string `yaml:"kind"`
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Args         []string `yaml:"args"`
						VolumeMounts []struct {
							Name      string `yaml:"name"`
							MountPath string `yaml:"mountPath"`
						} `yaml:"volumeMounts"`
					} `yaml:"containers"`
					Volumes []struct {
						Name                  string `yaml:"name"`
						PersistentVolumeClaim *struct {
							ClaimName string `yaml:"claimName"`
						} `yaml:"persistentVolumeClaim"`
					} `yaml:"volumes"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	found := false
	for _, doc := range yamlDocs(t, "k8s/redis.yaml") {
		var head struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		}
		if err := doc.Decode(&head); err != nil {
			t.Fatal(err)
		}
		switch head.Kind {
		case "PersistentVolumeClaim":
			claims[head.Metadata.Name] = true
		case "Deployment", "StatefulSet":
			if err := doc.Decode(&dep); err != nil {
				t.Fatal(err)
			}
			found = true
		}
	}
	if !found || len(dep.Spec.Template.Spec.Containers) == 0 {
		t.Fatal("k8s/redis.yaml: no Redis Deployment")
	}
	c := dep.Spec.Template.Spec.Containers[0]
	aof("k8s/redis.yaml", c.Args)
	persistent := false
	for _, m := range c.VolumeMounts {
		for _, v := range dep.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && m.MountPath == "/data" && v.PersistentVolumeClaim != nil && claims[v.PersistentVolumeClaim.ClaimName] {
				persistent = true
			}
		}
	}
	if !persistent {
		t.Error("k8s/redis.yaml: /data is not a PersistentVolumeClaim the file declares")
	}
}

// ---------------------------------------------------------------------------
// nginx and compose

func TestNginx(t *testing.T) {
	cfg, _ := gatewayConfig(t)
	var want []string
	for name := range gatewayServices(t) {
		want = append(want, name)
	}
	slices.Sort(want)
	if len(want) != 3 {
		t.Errorf("compose.yaml: %d gateway services %q, want 3", len(want), want)
	}
	var hosts []string
	for _, s := range nginxUpstreamServers(t) {
		h, _, _ := net.SplitHostPort(s)
		hosts = append(hosts, h)
	}
	slices.Sort(hosts)
	if !slices.Equal(hosts, want) {
		t.Errorf("nginx.conf upstream servers %q, want the compose gateway services %q", hosts, want)
	}

	server := nginxConf(t).find("http", "server")
	if server == nil {
		t.Fatal("nginx.conf: no http server block")
	}
	var loc *nginxDirective
	for _, l := range server.all("location") {
		if slices.Equal(l.Args, []string{"/"}) {
			loc = l
		}
	}
	if loc == nil {
		t.Fatal("nginx.conf: no location /")
	}
	for _, d := range []struct{ name, want string }{
		{"proxy_pass", "http://llmgate"},
		{"proxy_buffering", "off"},
		{"proxy_request_buffering", "off"},
		{"proxy_http_version", "1.1"},
	} {
		if got := loc.arg(d.name); got != d.want {
			t.Errorf("nginx.conf location /: %s %q, want %q", d.name, got, d.want)
		}
	}
	conn := false
	for _, h := range loc.all("proxy_set_header") {
		if len(h.Args) == 2 && strings.EqualFold(h.Args[0], "Connection") && h.Args[1] == "" {
			conn = true
		}
	}
	if !conn {
		t.Error(`nginx.conf location /: want proxy_set_header Connection "" (upstream keepalive)`)
	}
	if read := nginxDuration(t, loc.arg("proxy_read_timeout")); read < cfg.Retry.Deadline.D() {
		t.Errorf("nginx.conf: proxy_read_timeout %s < retry.deadline %s: nginx would cut requests the gateway still retries",
			read, cfg.Retry.Deadline)
	}
	if nu := loc.arg("proxy_next_upstream"); strings.Contains(nu, "non_idempotent") {
		t.Error("nginx.conf: proxy_next_upstream non_idempotent would retry POSTs a second time")
	}
	if size := nginxSize(t, server.arg("client_max_body_size")); size < cfg.Limits.MaxBodyBytes {
		t.Errorf("nginx.conf: client_max_body_size %d < limits.max_body_bytes %d", size, cfg.Limits.MaxBodyBytes)
	}

	compose := composeFile(t)
	ng, ok := compose.Services["nginx"]
	if !ok {
		t.Fatal("compose.yaml: no nginx service")
	}
	if !slices.Contains(ng.Volumes, "./nginx.conf:/etc/nginx/nginx.conf:ro") {
		t.Errorf("compose.yaml nginx: volumes %q, want ./nginx.conf mounted", ng.Volumes)
	}
	listen := server.arg("listen")
	if !slices.Contains(ng.Ports, "8080:"+listen) {
		t.Errorf("compose.yaml nginx: ports %q, want host 8080 to nginx's listen %s", ng.Ports, listen)
	}
	for _, g := range want {
		if ng.DependsOn[g].Condition != "service_healthy" {
			t.Errorf("compose.yaml nginx: want depends_on %s: condition: service_healthy", g)
		}
	}
}

// TestTrustedProxies: the gateways believe X-Forwarded-For from nginx and
// from nothing else on the compose network, and nginx sends it.
func TestTrustedProxies(t *testing.T) {
	var doc struct {
		Services map[string]struct {
			Networks map[string]struct {
				IPv4 string `yaml:"ipv4_address"`
			} `yaml:"networks"`
		} `yaml:"services"`
		Networks map[string]struct {
			IPAM struct {
				Config []struct {
					Subnet string `yaml:"subnet"`
				} `yaml:"config"`
			} `yaml:"ipam"`
		} `yaml:"networks"`
	}
	decodeYAML(t, "compose.yaml", &doc)
	nginx, err := netip.ParseAddr(doc.Services["nginx"].Networks["default"].IPv4)
	if err != nil {
		t.Fatalf("compose.yaml: nginx has no fixed ipv4_address on the default network: %v", err)
	}
	cfgs := doc.Networks["default"].IPAM.Config
	if len(cfgs) != 1 {
		t.Fatalf("compose.yaml: the default network has %d ipam subnets, want one", len(cfgs))
	}
	subnet, err := netip.ParsePrefix(cfgs[0].Subnet)
	if err != nil || !subnet.Contains(nginx) {
		t.Fatalf("compose.yaml: subnet %q does not hold nginx's %s (%v)", cfgs[0].Subnet, nginx, err)
	}

	cfg, _ := gatewayConfig(t)
	trusted := false
	for _, p := range cfg.Server.TrustedProxyPrefixes() {
		if p.Contains(nginx) {
			trusted = true
		}
		if p.Overlaps(subnet) && p != netip.PrefixFrom(nginx, 32) {
			t.Errorf("gateway.yaml: server.trusted_proxies %s trusts more of the compose network than nginx %s", p, nginx)
		}
	}
	if !trusted {
		t.Errorf("gateway.yaml: server.trusted_proxies %q does not hold nginx's address %s", cfg.Server.TrustedProxies, nginx)
	}

	var loc *nginxDirective
	for _, l := range nginxConf(t).find("http", "server").all("location") {
		if slices.Equal(l.Args, []string{"/"}) {
			loc = l
		}
	}
	if loc == nil {
		t.Fatal("nginx.conf: no location /")
	}
	want := map[string]string{"x-forwarded-for": "$proxy_add_x_forwarded_for", "x-forwarded-proto": "$scheme"}
	for _, h := range loc.all("proxy_set_header") {
		if len(h.Args) == 2 && want[strings.ToLower(h.Args[0])] == h.Args[1] {
			delete(want, strings.ToLower(h.Args[0]))
		}
	}
	for h, v := range want {
		t.Errorf("nginx.conf location /: want proxy_set_header %s %s", h, v)
	}
}

// ---------------------------------------------------------------------------
// Metrics, alerts and the dashboard

func TestMetricNames(t *testing.T) {
	registered, histograms := registeredMetrics(t)
	if len(registered) == 0 {
		t.Fatal("found no `Name: \"llmgate_...\"` in the sources")
	}
	// A pending name quoted anywhere in the sources (a Name: field, or a
	// constant it is built from) means it is being registered.
	sources := bytes.Join(goSources(t, ".."), nil)
	for name := range pendingMetrics {
		if registered[name] || bytes.Contains(sources, []byte(`"`+name+`"`)) {
			t.Errorf("%s is registered now: remove it from pendingMetrics in deploy_test.go", name)
		}
	}
	known := func(name string) bool {
		if registered[name] || pendingMetrics[name] {
			return true
		}
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suf); ok && histograms[base] {
				return true
			}
		}
		return false
	}
	used := map[string][]string{} // file → metric names
	for _, r := range alertRules(t, "alerts.yaml") {
		used["alerts.yaml"] = append(used["alerts.yaml"], metricNames(r.Expr)...)
	}
	for _, expr := range dashboardExprs(t) {
		used["grafana-dashboard.json"] = append(used["grafana-dashboard.json"], metricNames(expr)...)
	}
	for file, names := range used {
		if len(names) == 0 {
			t.Errorf("%s uses no llmgate metric", file)
		}
		for _, n := range names {
			if !known(n) {
				t.Errorf("%s uses %s, which the gateway does not register (and is not pending)", file, n)
			}
		}
	}
}

var metricName = regexp.MustCompile(`\bllmgate_[a-zA-Z0-9_]+`)

func metricNames(expr string) []string { return metricName.FindAllString(expr, -1) }

// registeredMetrics collects the `Name: "llmgate_..."` literals in the
// module's non-test Go sources (gateway/ and every other package, so a
// metric the store registers is found too), and which of them are
// histograms: those whose nearest preceding `...Opts{` is HistogramOpts.
func registeredMetrics(t *testing.T) (all, histograms map[string]bool) {
	t.Helper()
	all, histograms = map[string]bool{}, map[string]bool{}
	nameRe := regexp.MustCompile(`Name:\s*"(llmgate_[a-zA-Z0-9_]+)"`)
	optsRe := regexp.MustCompile(`(\w+)Opts\{`)
	for _, src := range goSources(t, "..") {
		for _, m := range nameRe.FindAllSubmatchIndex(src, -1) {
			name := string(src[m[2]:m[3]])
			all[name] = true
			opts := optsRe.FindAllSubmatch(src[:m[0]], -1)
			if len(opts) > 0 && string(opts[len(opts)-1][1]) == "Histogram" {
				histograms[name] = true
			}
		}
	}
	return all, histograms
}

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type ruleGroups struct {
	Groups []struct {
		Name  string      `yaml:"name"`
		Rules []alertRule `yaml:"rules"`
	} `yaml:"groups"`
}

func alertRules(t *testing.T, path string) []alertRule {
	t.Helper()
	var g ruleGroups
	decodeYAML(t, path, &g)
	var out []alertRule
	for _, grp := range g.Groups {
		out = append(out, grp.Rules...)
	}
	return out
}

func TestAlertRules(t *testing.T) {
	rules := alertRules(t, "alerts.yaml")
	wantUses := map[string]bool{ // one alert at least per announced signal
		"llmgate_breaker_state":                 false,
		"llmgate_retry_budget_rejections_total": false,
		"llmgate_requests_total":                false,
		"llmgate_deadletters":                   false,
		"llmgate_deadletter_alert":              false,
		"llmgate_idempotency_events_total":      false,
		"llmgate_store_full":                    false,
		"llmgate_store_live_bytes":              false,
		"llmgate_budget_spent":                  false,
	}
	seen := map[string]bool{}
	for _, r := range rules {
		if r.Alert == "" || seen[r.Alert] {
			t.Errorf("alert name %q empty or duplicated", r.Alert)
		}
		seen[r.Alert] = true
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("%s: severity %q, want warning or critical", r.Alert, s)
		}
		for _, a := range []string{"summary", "description", "runbook"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		if _, err := time.ParseDuration(r.For); r.For != "" && err != nil {
			t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
		}
		if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") {
			t.Errorf("%s: unbalanced parentheses in %q", r.Alert, r.Expr)
		}
		for _, n := range metricNames(r.Expr) {
			if _, ok := wantUses[n]; ok {
				wantUses[n] = true
			}
		}
		if strings.Contains(r.Expr, "store_error") && !strings.Contains(r.Expr, `event="store_error"`) {
			t.Errorf("%s: store errors are the event=\"store_error\" label", r.Alert)
		}
	}
	for n, used := range wantUses {
		if !used {
			t.Errorf("no alert uses %s", n)
		}
	}

	// The PrometheusRule carries the same groups.
	var a, pr struct {
		Groups any `yaml:"groups"`
		Kind   string
		Spec   struct {
			Groups any `yaml:"groups"`
		}
	}
	decodeYAML(t, "alerts.yaml", &a)
	decodeYAML(t, "k8s/prometheus-rules.yaml", &pr)
	if pr.Kind != "PrometheusRule" {
		t.Errorf("k8s/prometheus-rules.yaml: kind %q, want PrometheusRule", pr.Kind)
	}
	if !reflect.DeepEqual(a.Groups, pr.Spec.Groups) {
		t.Error("k8s/prometheus-rules.yaml spec.groups differ from alerts.yaml groups: copy them over")
	}
}

type dashboard struct {
	SchemaVersion int `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query string `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int        `json:"id"`
		Title      string     `json:"title"`
		Datasource datasource `json:"datasource"`
		GridPos    *struct{}  `json:"gridPos"`
		Targets    []struct {
			Expr       string     `json:"expr"`
			Datasource datasource `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(readFile(t, "grafana-dashboard.json")))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	return d
}

func dashboardExprs(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, p := range loadDashboard(t).Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	return out
}

func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.SchemaVersion != 39 {
		t.Errorf("schemaVersion %d, want 39", d.SchemaVersion)
	}
	hasVar := false
	for _, v := range d.Templating.List {
		if v.Name == "DS_PROMETHEUS" && v.Type == "datasource" && v.Query == "prometheus" {
			hasVar = true
		}
	}
	if !hasVar {
		t.Error("no datasource template variable DS_PROMETHEUS")
	}
	want := datasource{Type: "prometheus", UID: "${DS_PROMETHEUS}"}
	ids := map[int]bool{}
	titles := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		titles[p.Title] = true
		if p.GridPos == nil {
			t.Errorf("panel %q has no gridPos", p.Title)
		}
		if p.Datasource != want {
			t.Errorf("panel %q: datasource %+v, want %+v", p.Title, p.Datasource, want)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no targets", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Datasource != want {
				t.Errorf("panel %q: target datasource %+v, want %+v", p.Title, tg.Datasource, want)
			}
			if strings.Count(tg.Expr, "(") != strings.Count(tg.Expr, ")") {
				t.Errorf("panel %q: unbalanced parentheses in %q", p.Title, tg.Expr)
			}
		}
	}
	// The signals the dashboard must show, by metric.
	used := map[string]bool{}
	for _, e := range dashboardExprs(t) {
		for _, n := range metricNames(e) {
			used[n] = true
		}
	}
	for _, n := range []string{
		"llmgate_requests_total", "llmgate_request_duration_seconds_bucket",
		"llmgate_upstream_attempts_total", "llmgate_upstream_retries_total",
		"llmgate_breaker_state", "llmgate_idempotency_events_total",
		"llmgate_stream_ttfb_seconds_bucket", "llmgate_deadletters", "llmgate_requests_in_flight",
		"llmgate_budget_spent", "llmgate_budget_limit",
	} {
		if !used[n] {
			t.Errorf("no panel shows %s", n)
		}
	}
}

// ---------------------------------------------------------------------------
// kustomize, when kubectl is here

func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not on PATH; kustomize build not checked")
	}
	out, err := exec.Command(kubectl, "kustomize", "k8s").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("kubectl kustomize k8s: %v\n%s", err, stderr)
	}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	var cmName, volName string
	var cmData string
	kinds := map[string]int{}
	for {
		var obj struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
			Data map[string]string `yaml:"data"`
			Spec struct {
				Template struct {
					Spec struct {
						Volumes []volume `yaml:"volumes"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&obj); err != nil {
			break
		}
		kinds[obj.Kind]++
		switch {
		case obj.Kind == "ConfigMap" && strings.HasPrefix(obj.Metadata.Name, "llmgate-config-"):
			cmName, cmData = obj.Metadata.Name, obj.Data["gateway.yaml"]
		case obj.Kind == "Deployment" && obj.Metadata.Name == "llmgate":
			for _, v := range obj.Spec.Template.Spec.Volumes {
				if v.ConfigMap != nil {
					volName = v.ConfigMap.Name
				}
			}
		}
	}
	if cmName == "" || volName != cmName {
		t.Errorf("kustomize: ConfigMap %q, Deployment mounts %q; want the generated (hashed) name in both", cmName, volName)
	}
	if cmData != string(readFile(t, "gateway.yaml")) {
		t.Error("kustomize: the ConfigMap's gateway.yaml is not deploy/gateway.yaml")
	}
	for kind, n := range map[string]int{"Deployment": 2, "Service": 2, "ConfigMap": 1, "PodDisruptionBudget": 1, "HorizontalPodAutoscaler": 1} {
		if kinds[kind] != n {
			t.Errorf("kustomize: %d %s, want %d", kinds[kind], kind, n)
		}
	}
	if kinds["Secret"] != 0 {
		t.Error("kustomize: renders a Secret; the Secret is created by hand")
	}
}

// ---------------------------------------------------------------------------
// Kubernetes manifests, decoded as far as the tests need.

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *secretKeyRef `yaml:"secretKeyRef"`
	} `yaml:"valueFrom"`
}

type secretKeyRef struct {
	Name     string `yaml:"name"`
	Key      string `yaml:"key"`
	Optional bool   `yaml:"optional"`
}

func (e envVar) secretRef() *secretKeyRef {
	if e.ValueFrom == nil {
		return nil
	}
	return e.ValueFrom.SecretKeyRef
}

type container struct {
	Name  string   `yaml:"name"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env          []envVar `yaml:"env"`
	EnvFrom      []any    `yaml:"envFrom"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
	StartupProbe   *probe `yaml:"startupProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	Lifecycle      *struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
			Exec any `yaml:"exec"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *struct {
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		Capabilities             *struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
}

func (c container) port(name string) int {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

type volume struct {
	Name      string `yaml:"name"`
	ConfigMap *struct {
		Name string `yaml:"name"`
	} `yaml:"configMap"`
	EmptyDir any `yaml:"emptyDir"`
}

type deploymentObj struct {
	Kind string `yaml:"kind"`
	Spec struct {
		Replicas int `yaml:"replicas"`
		Template struct {
			Spec struct {
				TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               *struct {
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
				} `yaml:"securityContext"`
				Containers []container `yaml:"containers"`
				Volumes    []volume    `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

func deployment(t *testing.T) deploymentObj {
	t.Helper()
	var d deploymentObj
	decodeYAML(t, "k8s/deployment.yaml", &d)
	if d.Kind != "Deployment" {
		t.Fatalf("k8s/deployment.yaml: kind %q", d.Kind)
	}
	if d.Spec.Replicas != 3 {
		t.Errorf("k8s/deployment.yaml: replicas %d, want 3", d.Spec.Replicas)
	}
	return d
}

func gatewayContainer(t *testing.T, d deploymentObj) container {
	t.Helper()
	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("k8s/deployment.yaml: %d containers, want 1", len(d.Spec.Template.Spec.Containers))
	}
	return d.Spec.Template.Spec.Containers[0]
}

type service struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Ports []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

func k8sService(t *testing.T) service {
	t.Helper()
	var s service
	decodeYAML(t, "k8s/service.yaml", &s)
	if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != 80 || s.Spec.Ports[0].Name != "http" {
		t.Errorf("k8s/service.yaml: ports %+v, want one named http on 80", s.Spec.Ports)
	}
	return s
}

type secret struct {
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	StringData map[string]string `yaml:"stringData"`
}

func secretExample(t *testing.T) secret {
	t.Helper()
	var s secret
	decodeYAML(t, "k8s/secret.example.yaml", &s)
	return s
}

// ---------------------------------------------------------------------------
// compose.yaml

type composeService struct {
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	Healthcheck struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	StopGracePeriod string `yaml:"stop_grace_period"`
	DependsOn       map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
}

func (s composeService) healthcheckURL(t *testing.T) string {
	t.Helper()
	for _, a := range s.Healthcheck.Test {
		if strings.HasPrefix(a, "http://") {
			return a
		}
	}
	t.Fatalf("compose.yaml: healthcheck %q has no URL", s.Healthcheck.Test)
	return ""
}

type composeDoc struct {
	Services map[string]composeService `yaml:"services"`
}

func composeFile(t *testing.T) composeDoc {
	t.Helper()
	var c composeDoc
	decodeYAML(t, "compose.yaml", &c)
	return c
}

// gatewayServices returns the compose services that run the llmgate image.
func gatewayServices(t *testing.T) map[string]composeService {
	t.Helper()
	out := map[string]composeService{}
	for name, s := range composeFile(t).Services {
		if strings.HasPrefix(s.Image, "llmgate:") {
			out[name] = s
		}
	}
	if len(out) == 0 {
		t.Fatal("compose.yaml: no service runs the llmgate image")
	}
	return out
}

// ---------------------------------------------------------------------------
// Dockerfile

// dockerfileInsts is the Dockerfile's instructions after the last FROM
// (the final stage), continuation lines joined.
type dockerfileInsts []struct{ op, rest string }

func dockerfile(t *testing.T) dockerfileInsts {
	t.Helper()
	var out dockerfileInsts
	text := strings.ReplaceAll(string(readFile(t, "Dockerfile")), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		op, rest, _ := strings.Cut(line, " ")
		op = strings.ToUpper(op)
		if op == "FROM" {
			out = out[:0]
			if !strings.Contains(rest, "distroless/static") && !strings.HasPrefix(rest, "scratch") && !strings.Contains(rest, " AS ") {
				t.Errorf("Dockerfile: FROM %s; the final stage should be distroless static or scratch", rest)
			}
		}
		out = append(out, struct{ op, rest string }{op, strings.TrimSpace(rest)})
	}
	return out
}

func (d dockerfileInsts) all(op string) []string {
	var out []string
	for _, i := range d {
		if i.op == op {
			out = append(out, strings.Fields(i.rest)...)
		}
	}
	return out
}

func (d dockerfileInsts) last(op string) string {
	s := ""
	for _, i := range d {
		if i.op == op {
			s = i.rest
		}
	}
	return s
}

// execForm decodes the JSON array at the start of s.
func execForm(t *testing.T, s string) []string {
	t.Helper()
	var out []string
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		t.Fatalf("Dockerfile: %q is not an exec-form JSON array: %v", s, err)
	}
	return out
}

func (d dockerfileInsts) cmd(t *testing.T) []string { return execForm(t, d.last("CMD")) }

func (d dockerfileInsts) healthcheckURL(t *testing.T) string {
	t.Helper()
	hc := d.last("HEALTHCHECK")
	_, cmd, ok := strings.Cut(hc, "CMD ")
	if !ok {
		t.Fatalf("Dockerfile: HEALTHCHECK %q has no CMD", hc)
	}
	args := execForm(t, strings.TrimSpace(cmd))
	if len(args) != 2 || !strings.HasSuffix(args[0], "/healthcheck") {
		t.Fatalf("Dockerfile: HEALTHCHECK CMD %q, want [.../healthcheck URL]", args)
	}
	return args[1]
}

// healthcheckDefaultURL reads the defaultURL constant of deploy/healthcheck.
func healthcheckDefaultURL(t *testing.T) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("healthcheck", "main.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "defaultURL" || len(vs.Values) != 1 {
			return true
		}
		if lit, ok := vs.Values[0].(*ast.BasicLit); ok {
			out, _ = strconv.Unquote(lit.Value)
		}
		return false
	})
	if out == "" {
		t.Fatal("healthcheck/main.go: no string constant defaultURL")
	}
	return out
}

func checkURL(t *testing.T, what, raw string, port int, path string) {
	t.Helper()
	u := mustParseURL(t, raw)
	if u.Port() != strconv.Itoa(port) {
		t.Errorf("%s: %s, want port %d", what, raw, port)
	}
	if path != "" && u.Path != path {
		t.Errorf("%s: %s, want path %s", what, raw, path)
	}
}

func mustParseURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	return u
}

// ---------------------------------------------------------------------------
// nginx.conf: a small parser for its block structure.

type nginxDirective struct {
	Name     string
	Args     []string
	Children []*nginxDirective
}

func (d *nginxDirective) all(name string) []*nginxDirective {
	var out []*nginxDirective
	for _, c := range d.Children {
		if c.Name == name {
			out = append(out, c)
		}
	}
	return out
}

// find follows a path of block names, taking the first match at each step.
func (d *nginxDirective) find(path ...string) *nginxDirective {
	cur := d
	for _, name := range path {
		next := cur.all(name)
		if len(next) == 0 {
			return nil
		}
		cur = next[0]
	}
	return cur
}

// arg returns the arguments of the last directive name, joined by spaces.
func (d *nginxDirective) arg(name string) string {
	if d == nil {
		return ""
	}
	all := d.all(name)
	if len(all) == 0 {
		return ""
	}
	return strings.Join(all[len(all)-1].Args, " ")
}

func nginxConf(t *testing.T) *nginxDirective {
	t.Helper()
	src := readFile(t, "nginx.conf")
	var toks []string
	var quoted []bool // whether toks[i] was a quoted string ("" is a value)
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '#':
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '{' || c == '}' || c == ';':
			toks, quoted = append(toks, string(c)), append(quoted, false)
			i++
		case c == '"' || c == '\'':
			j := i + 1
			for j < len(src) && src[j] != c {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(src) {
				t.Fatal("nginx.conf: unterminated quote")
			}
			toks, quoted = append(toks, string(src[i+1:j])), append(quoted, true)
			i = j + 1
		default:
			j := i
			for j < len(src) && !strings.ContainsRune(" \t\r\n{};#", rune(src[j])) {
				j++
			}
			toks, quoted = append(toks, string(src[i:j])), append(quoted, false)
			i = j
		}
	}
	root := &nginxDirective{}
	stack := []*nginxDirective{root}
	var cur []string
	for i, tok := range toks {
		top := stack[len(stack)-1]
		switch {
		case tok == ";" && !quoted[i]:
			if len(cur) == 0 {
				t.Fatal("nginx.conf: empty directive")
			}
			top.Children = append(top.Children, &nginxDirective{Name: cur[0], Args: cur[1:]})
			cur = nil
		case tok == "{" && !quoted[i]:
			if len(cur) == 0 {
				t.Fatal("nginx.conf: block without a name")
			}
			d := &nginxDirective{Name: cur[0], Args: cur[1:]}
			top.Children = append(top.Children, d)
			stack = append(stack, d)
			cur = nil
		case tok == "}" && !quoted[i]:
			if len(stack) == 1 || len(cur) != 0 {
				t.Fatal("nginx.conf: unbalanced }")
			}
			stack = stack[:len(stack)-1]
		default:
			cur = append(cur, tok)
		}
	}
	if len(stack) != 1 || len(cur) != 0 {
		t.Fatal("nginx.conf: unterminated block or directive")
	}
	return root
}

// nginxUpstreamServers returns the host:port of every server in the
// upstream block that location / proxies to.
func nginxUpstreamServers(t *testing.T) []string {
	t.Helper()
	http := nginxConf(t).find("http")
	if http == nil {
		t.Fatal("nginx.conf: no http block")
	}
	var out []string
	for _, u := range http.all("upstream") {
		if slices.Equal(u.Args, []string{"llmgate"}) {
			for _, s := range u.all("server") {
				out = append(out, s.Args[0])
			}
		}
	}
	return out
}

// nginxDuration parses an nginx time ("600s", "10m", "600" = seconds).
func nginxDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	if n, err := strconv.Atoi(s); err == nil {
		return time.Duration(n) * time.Second
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("nginx.conf: time %q: %v", s, err)
	}
	return d
}

// nginxSize parses an nginx size ("33m", "512k", "1g", "1024").
func nginxSize(t *testing.T, s string) int64 {
	t.Helper()
	mult := int64(1)
	switch strings.ToLower(s[len(s)-1:]) {
	case "k":
		mult, s = 1<<10, s[:len(s)-1]
	case "m":
		mult, s = 1<<20, s[:len(s)-1]
	case "g":
		mult, s = 1<<30, s[:len(s)-1]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("nginx.conf: size %q: %v", s, err)
	}
	return n * mult
}

// ---------------------------------------------------------------------------
// Files

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeYAML decodes the first document of a YAML file.
func decodeYAML(t *testing.T, path string, v any) {
	t.Helper()
	if err := yaml.Unmarshal(readFile(t, path), v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// yamlDocs returns every document of a YAML file.
func yamlDocs(t *testing.T, path string) []*yaml.Node {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(readFile(t, path)))
	var out []*yaml.Node
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			break
		}
		out = append(out, &n)
	}
	return out
}

// goSources returns the non-test .go files under dir, skipping this
// directory, testdata and hidden directories.
func goSources(t *testing.T, dir string) [][]byte {
	t.Helper()
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			abs, _ := filepath.Abs(path)
			name := d.Name()
			if abs == self || name == "testdata" || (strings.HasPrefix(name, ".") && path != dir) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			out = append(out, b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
