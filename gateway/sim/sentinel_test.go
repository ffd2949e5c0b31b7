package sim_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redisstore "github.com/llmgate/llmgate/cache/redis"
	"github.com/llmgate/llmgate/gateway"
	"github.com/llmgate/llmgate/gateway/sim"
)

// redisProc is a redis-server process the test started.
type redisProc struct {
	t    *testing.T
	port int
	args []string
	cmd  *exec.Cmd
}

func (p *redisProc) addr() string { return fmt.Sprintf("127.0.0.1:%d", p.port) }

func startRedis(t *testing.T, port int, args ...string) *redisProc {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("LLMGATE_REQUIRE_REDIS") == "1" {
			t.Fatalf("redis-server expected (LLMGATE_REQUIRE_REDIS=1): %v", err)
		}
		t.Skipf("redis-server not installed: %v", err)
	}
	p := &redisProc{t: t, port: port, args: append([]string{bin}, args...)}
	p.start()
	t.Cleanup(p.kill)
	return p
}

func (p *redisProc) start() {
	args := append([]string{}, p.args[1:]...)
	if len(args) == 0 || !strings.HasSuffix(args[0], ".conf") {
		args = append([]string{"--port", fmt.Sprint(p.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", p.t.TempDir()}, args...)
	}
	p.cmd = exec.Command(p.args[0], args...)
	if err := p.cmd.Start(); err != nil {
		p.t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: p.addr(), MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	eventually(p.t, 10*time.Second, "redis-server on "+p.addr(), func() bool { return c.Ping(context.Background()).Err() == nil })
}

func (p *redisProc) kill() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		p.cmd = nil
	}
}

func (p *redisProc) signal(s syscall.Signal) { _ = p.cmd.Process.Signal(s) }

// eventually polls cond (an external process's state, which sends no event
// to wait on) until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// sentinelSet is a primary with one replica under one Sentinel.
type sentinelSet struct {
	primary, replica *redisProc
	sentinel         string
	master           string
}

func startSentinelSet(t *testing.T) *sentinelSet {
	s := &sentinelSet{master: "llmgate-sim"}
	s.primary = startRedis(t, freePort(t))
	s.replica = startRedis(t, freePort(t), "--replicaof", "127.0.0.1", fmt.Sprint(s.primary.port))
	s.waitSynced(t, s.replica.addr())
	port := freePort(t)
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 10000\n",
		port, s.master, s.primary.port, s.master, s.master)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	startRedis(t, port, conf, "--sentinel")
	s.sentinel = fmt.Sprintf("127.0.0.1:%d", port)
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.sentinel})
	defer sc.Close()
	eventually(t, 10*time.Second, "Sentinel seeing the replica", func() bool {
		reps, err := sc.Replicas(context.Background(), s.master).Result()
		return err == nil && len(reps) == 1
	})
	return s
}

// waitSynced waits until one of addrs is a replica in sync with its
// master. After a failover the old primary comes back as the new one's
// replica, but Sentinel may fail over again once it is in sync (seen in
// CI under load: the just-promoted replica missed down-after-milliseconds
// and the synced old primary was promoted back); then the other node is
// the replica in sync, and the pair is as settled as the test needs.
func (s *sentinelSet) waitSynced(t *testing.T, addrs ...string) {
	var clients []*redis.Client
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		defer c.Close()
		clients = append(clients, c)
	}
	infos := make([]string, len(addrs))
	deadline := time.Now().Add(30 * time.Second)
	for {
		for i, c := range clients {
			infos[i], _ = c.Info(context.Background(), "replication").Result()
			if strings.Contains(infos[i], "master_link_status:up") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no replica in sync on %v within 30s:\n%s", addrs, strings.Join(infos, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lossyFailover is the failover that can lose acknowledged writes: the
// replica is stopped (SIGSTOP) and its link cut (CLIENT KILL on the
// primary; what the primary had sent is in the replica's socket and
// survives) while commits go on for stall, the primary is killed, the
// stale replica resumes and Sentinel promotes it; then the old primary
// comes back, empty, and Sentinel makes it the new primary's replica.
func (s *sentinelSet) lossyFailover(t *testing.T, stall time.Duration) {
	s.replica.signal(syscall.SIGSTOP)
	pc := redis.NewClient(&redis.Options{Addr: s.primary.addr()})
	if err := pc.ClientKillByFilter(context.Background(), "TYPE", "replica").Err(); err != nil {
		t.Errorf("cutting the replica's link: %v", err)
	}
	pc.Close()
	time.Sleep(stall) // commits land on the primary alone meanwhile
	s.primary.kill()
	s.replica.signal(syscall.SIGCONT)
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.sentinel})
	defer sc.Close()
	eventually(t, 30*time.Second, "Sentinel promoting the replica", func() bool {
		got, err := sc.GetMasterAddrByName(context.Background(), s.master).Result()
		return err == nil && len(got) == 2 && got[1] == fmt.Sprint(s.replica.port)
	})
	// Back, empty, as the new primary's replica (what Sentinel would make
	// of it, said at its start rather than waited for). Never promoted
	// (replica-priority 0): under a loaded CI machine Sentinel once failed
	// over a second time, to this empty instance before its sync, and the
	// run lost every record — a failover the test did not stage.
	s.primary.args = append(s.primary.args[:1:1], "--replicaof", "127.0.0.1", fmt.Sprint(s.replica.port), "--replica-priority", "0")
	s.primary.start()
	s.waitSynced(t, s.primary.addr(), s.replica.addr())
}

// simulateOnSentinel runs the simulation on a Redis store found through
// Sentinel, with a lossy failover of the primary halfway through.
func simulateOnSentinel(t *testing.T, ops, waitReplicas int, seed int64) *sim.Result {
	set := startSentinelSet(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	o := redisstore.Options{SentinelMaster: set.master, SentinelAddrs: []string{set.sentinel},
		Prefix: "llmgate-sim-" + hex.EncodeToString(b[:]) + ":", PollInterval: 100 * time.Millisecond,
		WaitReplicas: waitReplicas, WaitTimeout: 100 * time.Millisecond}
	res, err := sim.Simulate(sim.Options{Seed: seed, Ops: ops, Workers: simWorkers(t), Dir: t.TempDir(),
		OpenStore: func(clk *sim.Clock) (gateway.Store, error) {
			o.Now, o.After = clk.Now, clk.After
			s, err := redisstore.Open(context.Background(), o)
			if err == nil {
				t.Cleanup(func() { s.Close() })
			}
			return s, err
		},
		Disrupt: func() { set.lossyFailover(t, 300*time.Millisecond) }})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestSimulationSentinelFailover runs the simulation on Redis under
// Sentinel with store.redis.wait_replicas 1 — the recommended setting —
// through a failover that loses the unreplicated writes (the replica
// stopped while commits go on, the primary killed, the stale replica
// promoted): no client may have been shown an answer the failover lost.
func TestSimulationSentinelFailover(t *testing.T) {
	res := simulateOnSentinel(t, simOps(t, 2000), 1, simSeed(t))
	p50, p99 := res.CommitLatency()
	t.Logf("%s; commit p50 %v p99 %v", res.Summary(), p50, p99)
	if len(res.Violations) > 0 {
		t.Fatal(res.Report())
	}
}

// TestSentinelDurabilityTable measures, for wait_replicas 0 and 1, what a
// lossy failover does to acknowledged commits (LLMGATE_SIM_DURABILITY=1;
// it prints the README's table).
func TestSentinelDurabilityTable(t *testing.T) {
	if os.Getenv("LLMGATE_SIM_DURABILITY") != "1" {
		t.Skip("set LLMGATE_SIM_DURABILITY=1 to measure the durability of commits across a lossy Sentinel failover")
	}
	seed := simSeed(t)
	t.Logf("| wait_replicas | requests | violations | commits lost (key committed twice) | of which a client had seen complete | commit p50 | commit p99 | ops/s |")
	for _, wait := range []int{0, 1} {
		res := simulateOnSentinel(t, simOps(t, 4000), wait, seed)
		lost, seen := map[string]bool{}, map[string]bool{}
		for _, v := range res.Violations {
			switch {
			case v.Property == sim.PropAgree:
				seen[v.Key] = true
			case v.Property == sim.PropOneBody && strings.HasPrefix(v.Detail, "commit "):
				lost[v.Key] = true
			}
		}
		p50, p99 := res.CommitLatency()
		t.Logf("| %d | %d | %d | %d | %d | %v | %v | %.0f |", wait, res.Ops, len(res.Violations), len(lost), len(seen),
			p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), float64(res.Ops)/res.Elapsed.Seconds())
		for i, v := range res.Violations {
			if i < 5 {
				t.Logf("  wait_replicas %d: %s key %s: %s", wait, v.Property, v.Key, v.Detail)
			}
		}
	}
}
