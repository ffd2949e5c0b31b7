package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/redis/go-redis/v9"
	"gopkg.in/yaml.v3"

	"github.com/llmgate/llmgate/cache"
	badgerstore "github.com/llmgate/llmgate/cache/badger"
	redisstore "github.com/llmgate/llmgate/cache/redis"
	"github.com/llmgate/llmgate/cmd/gateway/demo"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway"
	"github.com/llmgate/llmgate/gateway/tracing"
)

// run is the whole program: flags, config, store, server, and an ordered
// shutdown when ctx ends. stdout gets the "listening" line (tests read the
// address from it); stderr gets the logs.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "YAML configuration `file` (default: built-in defaults and the environment)")
	checkOnly := fs.Bool("check-config", false, "validate the configuration, print it with secrets redacted, and exit")
	demoFlag := fs.Bool("demo", false, "serve a built-in simulated upstream, with models that fail on purpose, and open the admin API and page: a tour of llmgate with no API key and no network")
	addr := fs.String("addr", "", "listen `address` (host:port); overrides GATEWAY_ADDR, which overrides the file's listen (default 127.0.0.1:8080)")
	demoOutage := fs.Duration("demo-outage", demo.DefaultDemoOutage, "with -demo, how long the model demo-down is down, from its first request")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var demo *demoMode
	if *demoFlag {
		d, err := startDemo(*demoOutage)
		if err != nil {
			return err
		}
		defer d.stop()
		demo, getenv = d, d.env(getenv)
	}
	if *addr != "" {
		getenv = withAddr(getenv, *addr)
	}
	cfg, err := config.LoadFile(*configPath, getenv)
	if err != nil && *addr != "" {
		return fmt.Errorf("configuration (listen from -addr %s): %w", *addr, err)
	}
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if demo != nil {
		if err := demo.configure(&cfg); err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
	}
	if *checkOnly {
		out, err := yaml.Marshal(cfg.Redacted())
		if err != nil {
			return err
		}
		for _, w := range cfg.Warnings() {
			fmt.Fprintf(stderr, "warning: %s\n", w)
		}
		fmt.Fprintf(stdout, "configuration OK\n%s", out)
		return nil
	}
	applyMemory(&cfg, getenv, "/", newLogger(cfg.Log, stderr))
	return serve(ctx, cfg, demo, stdout, stderr)
}

// withAddr is getenv with GATEWAY_ADDR set to addr: the -addr flag goes
// where GATEWAY_ADDR goes (over the file's listen), validated as it is.
func withAddr(getenv func(string) string, addr string) func(string) string {
	return func(k string) string {
		if k == "GATEWAY_ADDR" {
			return addr
		}
		return getenv(k)
	}
}

// serve opens the store, builds the gateway and serves until ctx ends,
// then shuts down in order: readiness goes 503 and retry waits end;
// in-flight requests and streams get the grace period; detached keyed
// calls what is left of it; then the gateway and the store close (the
// deferred calls run in that order).
// demo is nil without -demo.
func serve(ctx context.Context, cfg config.Config, demo *demoMode, stdout, stderr io.Writer) error {
	log := newLogger(cfg.Log, stderr)
	logWarnings(log, cfg)
	// Closed last (deferred first): the spans of calls drained at shutdown
	// are flushed too.
	tracer, err := tracing.Setup(cfg.Tracing, log)
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	defer tracer.Close()
	store, err := openStore(ctx, cfg, log)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer func() {
		if err := store.Close(); err != nil {
			log.Error("closing store", "err", err)
		}
	}()
	opts := gateway.Options{Config: cfg, Store: store, Logger: log, Tracer: tracer}
	if demo != nil {
		opts.AdminSignInCode = demo.code
	}
	gw, err := gateway.New(opts)
	if err != nil {
		return err
	}
	defer gw.Close()

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	srv := newServer(cfg, gw.Handler(), log)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	announce(cfg, ln.Addr().String(), demo, stdout, log)

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// The shutdown context is fresh: ctx is already done.
	log.Info("shutting down", "grace", cfg.Server.ShutdownGrace.D())
	gw.BeginShutdown()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownGrace.D())
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("grace period over; closing remaining connections", "err", err)
		_ = srv.Close()
	}
	// Keyed calls whose clients stopped waiting run on to be committed;
	// they get what is left of the grace, then are cancelled (keys
	// released, dead letters recorded) before the store closes.
	gw.Drain(sctx)
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("stopped")
	return nil
}

// newServer is the HTTP server. Headers are bounded here; bodies are
// bounded per request by the gateway's handler (server.read_body_timeout
// for a client's /v1 request, server.unauthenticated_read_body_timeout for
// the rest), so there is no ReadTimeout. There is no WriteTimeout either: a
// stream may rightly run for as long as retry.deadline.
func newServer(cfg config.Config, h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout.D(),
		IdleTimeout:       cfg.Server.IdleTimeout.D(),
		MaxHeaderBytes:    cfg.Limits.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// announce prints the "listening" line tests read the address from, logs
// the setup, and in demo mode prints the tour (demo.banner).
func announce(cfg config.Config, addr string, demo *demoMode, stdout io.Writer, log *slog.Logger) {
	fmt.Fprintf(stdout, "llmgate listening on http://%s\n", addr)
	log.Info("listening", "addr", addr, "upstreams", upstreamNames(cfg), "clients", len(cfg.Clients),
		"store", cfg.Store.Kind, "data_dir", cfg.DataDir, "admin", cfg.AdminToken != "")
	if demo != nil {
		demo.banner(stdout, cfg, addr)
	}
}

func upstreamNames(cfg config.Config) string {
	names := make([]string, len(cfg.Upstreams))
	for i, u := range cfg.Upstreams {
		names[i] = u.Name
	}
	return strings.Join(names, ",")
}

func newLogger(c config.Log, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// store is the gateway's store plus Close.
type store interface {
	gateway.Store
	Close() error
}

// openStore opens the configured store: Badger in data_dir (one process),
// or Redis shared by several replicas. A Redis that is down at startup is
// not fatal: the gateway starts, keyed requests get 503 and /readyz says
// so until it reconnects.
func openStore(ctx context.Context, cfg config.Config, log *slog.Logger) (store, error) {
	if cfg.Store.Kind == config.StoreRedis {
		// go-redis logs every failed dial (ten a second while Redis is
		// down) to stderr; route it to the gateway's log at debug level.
		// Operators see an outage in /readyz, in 503s and in the request
		// log instead.
		redis.SetLogger(redisLogger{log})
		r := cfg.Store.Redis
		return redisstore.Open(ctx, redisstore.Options{
			URL: r.URL, PoolSize: r.PoolSize, Prefix: r.Prefix, Cluster: r.Cluster, Logger: log,
			WaitReplicas: r.WaitReplicas, WaitTimeout: r.WaitTimeout.D(), DeadLetters: deadLetterBound(cfg),
			SentinelMaster: r.Sentinel.Master, SentinelAddrs: r.Sentinel.Addrs, SentinelPassword: r.Sentinel.Password,
			WriteV1Records: r.WriteV1Records,
		})
	}
	return badgerstore.Open(badgerstore.Options{
		Dir:               cfg.DataDir,
		SyncWrites:        cfg.Store.SyncWrites,
		GCInterval:        cfg.Store.GCInterval.D(),
		WritebackInterval: cfg.Store.WritebackInterval.D(),
		MemoryBudget:      cfg.Memory.BudgetBytes,
		Logger:            log,
		MaxBytes:          cfg.Store.MaxBytes,
		MinFreeBytes:      cfg.Store.MinFreeBytes,
		DeadLetters:       deadLetterBound(cfg),
	})
}

// deadLetterBound is the bound on each client's dead letters that the
// config sets.
func deadLetterBound(cfg config.Config) cache.DeadLetterBound {
	d := cfg.DeadLetters
	return cache.DeadLetterBound{MaxCount: d.MaxPerClient, MaxBytes: d.PerClientBytes(cfg.Store.MaxBytes)}
}

type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

// logWarnings logs what cfg, valid, should still change (Config.Warnings).
func logWarnings(log *slog.Logger, cfg config.Config) {
	for _, w := range cfg.Warnings() {
		log.Warn("configuration: " + w)
	}
}
