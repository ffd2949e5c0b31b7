package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
	redisstore "github.com/llmgate/llmgate/cache/redis"
	"github.com/llmgate/llmgate/gateway/idempotency"
	"github.com/llmgate/llmgate/gateway/sim"
)

// The soak's deployment: three gateway processes on one Redis primary with
// one replica under one Sentinel, a short lease so that a stopped replica
// is taken over within seconds, and commits acknowledged by the replica
// (wait_replicas 1, the recommended setting).
const (
	soakLease    = 2 * time.Second
	soakReplicas = 3
	soakWorkers  = 12
	soakMaster   = "llmgate-soak"
	// soakCommitGrace is how long after its provider run ended a replica
	// may still be committing it: a run of a replica killed or stopped
	// within it may be lost to that fault.
	soakCommitGrace = 3 * time.Second
)

// soakReplica is one gateway replica: its own port (kept across restarts,
// so the clients' round robin finds it again), config, and every process
// it has been.
type soakReplica struct {
	name  string
	url   string
	bin   string
	args  []string
	procs []*proc
}

func (r *soakReplica) cur() *proc { return r.procs[len(r.procs)-1] }

// soakFault is a fault done to one replica (or, with replica "", to the
// store) over [from, to] of the history's time.
type soakFault struct {
	kind, replica string
	from, to      time.Duration
}

// soakSentinel is the Redis primary and replica (append-only files on)
// under one Sentinel.
type soakSentinel struct {
	nodes    [2]*redisProc
	base     []string
	sentinel string
}

func startSoakSentinel(t *testing.T) *soakSentinel {
	// appendfsync always: the restart fault kills the primary with SIGKILL,
	// and with everysec Redis postpones the append-only file's write (up
	// to 2 s) while a background fsync runs, yet answers its clients: on a
	// busy disk a kill then loses writes it had acknowledged (and the
	// replica's copy with them, at its full resync), which no gateway can
	// make up for. CI's soak once failed so.
	s := &soakSentinel{base: []string{"--appendonly", "yes", "--appendfsync", "always"}}
	s.nodes[0] = startRedis(t, s.base...)
	s.nodes[1] = startRedis(t, append(append([]string{}, s.base...), "--replicaof", "127.0.0.1", strconv.Itoa(s.nodes[0].port))...)
	port := freeLoopbackPort(t)
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	// down-after 2s: a primary restarted in place (its append-only file
	// loaded) is back before Sentinel would fail it over.
	writeFile(t, conf, fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 2000\nsentinel failover-timeout %s 10000\n",
		port, soakMaster, s.nodes[0].port, soakMaster, soakMaster))
	cmd := exec.Command(s.nodes[0].bin, conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	s.sentinel = fmt.Sprintf("127.0.0.1:%d", port)
	if err := s.healthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	return s
}

// primary is the node Sentinel names as the primary.
func (s *soakSentinel) primary() (*redisProc, *redisProc, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.sentinel, DialTimeout: time.Second})
	defer sc.Close()
	got, err := sc.GetMasterAddrByName(context.Background(), soakMaster).Result()
	if err != nil || len(got) != 2 {
		return nil, nil, fmt.Errorf("asking Sentinel for the primary: %v %v", got, err)
	}
	for i, n := range s.nodes {
		if strconv.Itoa(n.port) == got[1] {
			return n, s.nodes[1-i], nil
		}
	}
	return nil, nil, fmt.Errorf("Sentinel names %v, none of the soak's nodes", got)
}

// healthy polls (the servers send no event) until Sentinel names a running
// primary whose replica is in sync with it and known to Sentinel.
func (s *soakSentinel) healthy(d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		if last = s.check(); last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("Redis set not healthy within %v: %v", d, last)
}

func (s *soakSentinel) check() error {
	p, r, err := s.primary()
	if err != nil {
		return err
	}
	if p.cmd == nil || r.cmd == nil {
		return fmt.Errorf("a node is down")
	}
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port), DialTimeout: time.Second})
	defer c.Close()
	info, err := c.Info(context.Background(), "replication").Result()
	if err != nil || !strings.Contains(info, "master_link_status:up") || !strings.Contains(info, fmt.Sprintf("master_port:%d", p.port)) {
		return fmt.Errorf("replica %d not in sync with primary %d: %v", r.port, p.port, err)
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.sentinel, DialTimeout: time.Second})
	defer sc.Close()
	reps, err := sc.Replicas(context.Background(), soakMaster).Result()
	if err != nil || len(reps) == 0 {
		return fmt.Errorf("Sentinel knows no replica: %v", err)
	}
	return nil
}

// restartPrimary kills the primary with SIGKILL and starts it again at
// once on its directory: it loads its append-only file and goes on as the
// primary.
func (s *soakSentinel) restartPrimary(t *testing.T) {
	p, _, err := s.primary()
	if err != nil {
		t.Fatal(err)
	}
	p.kill()
	p.args = append([]string{}, s.base...)
	p.restart()
}

// failover kills the primary with SIGKILL, waits for Sentinel to promote
// the replica, and starts the old primary again as the new one's replica.
func (s *soakSentinel) failover(t *testing.T) {
	p, r, err := s.primary()
	if err != nil {
		t.Fatal(err)
	}
	p.kill()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if np, _, err := s.primary(); err == nil && np == r {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Sentinel did not promote the replica within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.args = append(append([]string{}, s.base...), "--replicaof", "127.0.0.1", strconv.Itoa(r.port))
	p.restart()
}

func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("LLMGATE_REPLICA_SOAK")
	if v == "" {
		return 30 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("LLMGATE_REPLICA_SOAK=%q: want a duration such as 30s", v)
	}
	return d
}

func soakSeed(t *testing.T) int64 {
	if v := os.Getenv("LLMGATE_SIM_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("LLMGATE_SIM_SEED=%q: %v", v, err)
		}
		return n
	}
	return time.Now().UnixNano()
}

// soakConfig is a replica's config: the simulation's deployment (fast
// retries, a breaker and budget that never stop a request, the record
// limit the provider's big answers exceed) on the Sentinel set.
func soakConfig(t *testing.T, listen, upstream, sentinel, prefix string) string {
	cfg := fmt.Sprintf(`listen: %s
data_dir: %s
admin_token: e2e-admin-token
log:
  format: json
  level: warn
upstreams:
  - name: sim
    base_url: %s
    api_key: sk-e2e-upstream-key
    models: ["*"]
    timeout: 2s
retry:
  base_delay: 1ms
  max_delay: 5ms
  deadline: 10s
  budget_min_per_second: 1000000
breaker:
  consecutive_failures: 1000000000
  min_requests: 1000000000
store:
  kind: redis
  op_timeout: 500ms
  redis:
    prefix: %q
    wait_replicas: 1
    wait_timeout: 200ms
    sentinel:
      master: %s
      addrs: [%q]
idempotency:
  lease: %s
  wait_timeout: 10s
  max_record_events: %d
  max_detached: 1000000
limits:
  stream_idle_timeout: 30s
server:
  shutdown_grace: 5s
`, listen, t.TempDir(), upstream, prefix, soakMaster, sentinel, soakLease, sim.MaxRecordEvents)
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	writeFile(t, path, cfg)
	return path
}

// waitReady polls a replica's /readyz (the process sends no event) until
// it answers 200.
func waitReady(t *testing.T, r *soakReplica, d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		res, err := httpClient.Get(r.url + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s not ready within %v (%v)\n%s", r.name, d, err, tail(r.cur().stderr.String()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(s string) string {
	if len(s) > 4000 {
		return s[len(s)-4000:]
	}
	return s
}

// TestReplicaSoak holds three gateway processes on Redis under Sentinel to
// the simulation's properties while replicas are killed (SIGKILL) and
// restarted, stopped past their lease (SIGSTOP, SIGCONT), the primary is
// restarted on its append-only file, and Sentinel fails the primary over
// to its replica; the clients send the simulation's workload — keyed JSON
// and streams, repeated keys, other bodies, clients that leave or set a
// short deadline — with each duplicate's copies on different replicas.
func TestReplicaSoak(t *testing.T) {
	if testing.Short() || os.Getenv("LLMGATE_REPLICA_SOAK") == "" {
		// Its own step of .ci/run sets it: the -race suite does not pay for
		// it a second time, nor does a developer's go test ./... .
		t.Skip("set LLMGATE_REPLICA_SOAK=30s to run the replica soak (.ci/run does, in its own step)")
	}
	dur, seed := soakDuration(t), soakSeed(t)
	h := sim.NewHistory()
	up := httptest.NewServer(sim.NewProvider(seed, sim.DefaultProviderRates, h))
	defer up.Close()
	set := startSoakSentinel(t)
	prefix := testKeyPrefix()
	bin := gatewayBin(t, "")
	reps := make([]*soakReplica, soakReplicas)
	urls := make([]string, soakReplicas)
	for i := range reps {
		name := fmt.Sprintf("r%d", i)
		listen := fmt.Sprintf("127.0.0.1:%d", freeLoopbackPort(t))
		reps[i] = &soakReplica{name: name, url: "http://" + listen, bin: bin,
			args: []string{"-config", soakConfig(t, listen, up.URL+"/"+name+"/v1", set.sentinel, prefix)}}
		reps[i].procs = append(reps[i].procs, start(t, bin, reps[i].args, nil))
		urls[i] = reps[i].url
	}
	for _, r := range reps {
		waitReady(t, r, 30*time.Second)
	}

	w := sim.NewWorkload(seed, 200000)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: soakWorkers * 2}, Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	began := time.Now()
	end := began.Add(dur)
	var sent int
	done, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		sent = dispatch(w, hc, urls, h, stop)
	}()
	faults, counts := injectFaults(t, reps, set, h, end)
	close(stop)
	<-done
	elapsed := time.Since(began)

	// Quiescence: every replica up, the Redis set in sync, every lease run out.
	for _, r := range reps {
		waitReady(t, r, 30*time.Second)
	}
	if err := set.healthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	st, err := redisstore.Open(context.Background(), redisstore.Options{SentinelMaster: soakMaster,
		SentinelAddrs: []string{set.sentinel}, Prefix: prefix, PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	time.Sleep(soakLease + time.Second) // the leases run out on real time
	quiet := w.Settle(sent, st)
	w.Final(sent, hc, urls, st, h)
	time.Sleep(soakLease + time.Second)
	w.SetFinal(sent, st, h)
	up.Close() // every provider handler has ended and recorded its run

	addObservedCalls(h, reps, faults)
	vs, runs := sim.Check(h, quiet)
	ops := len(h.Ops())
	t.Logf("replica soak: %d ops, %d violations, faults: kill9=%d, sigstop=%d, restart=%d, redis_restart=%d, failover=%d; runs: %s; %.0f ops/s (seed %d, %d workload steps, clients: %s)",
		ops, len(vs), counts["kill9"], counts["sigstop"], counts["restart"], counts["redis_restart"], counts["failover"],
		countsLine(runs), float64(ops)/elapsed.Seconds(), seed, sent, countsLine(w.Modes(sent)))
	if len(vs) > 0 {
		t.Fatal(soakReport(h, vs, seed, faults))
	}
	if counts["kill9"] == 0 || counts["sigstop"] == 0 || counts["redis_restart"] == 0 || counts["failover"] == 0 {
		t.Fatalf("not every kind of fault ran: %v", counts)
	}
}

// dispatch hands the workload's steps to the clients until stop is closed
// (or the workload runs out), and returns how many it handed out once
// every one has ended.
func dispatch(w *sim.Workload, hc *http.Client, urls []string, h *sim.History, stop <-chan struct{}) int {
	steps := make(chan int)
	var wg sync.WaitGroup
	for range soakWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range steps {
				w.Do(i, hc, urls, h)
			}
		}()
	}
	n := 0
send:
	for ; n < w.Len(); n++ {
		select {
		case <-stop:
			break send
		case steps <- n:
		}
	}
	close(steps)
	wg.Wait()
	return n
}

// injectFaults runs the faults in turn until end, and at least once each
// however slow the machine — kill -9 of a replica
// and its restart, SIGSTOP of a replica past its lease and SIGCONT, the
// primary restarted on its append-only file, a Sentinel failover — each
// followed by readiness of every replica and a synced Redis set, and a
// pause for traffic. It returns the faults with their times, and counts.
func injectFaults(t *testing.T, reps []*soakReplica, set *soakSentinel, h *sim.History, end time.Time) ([]soakFault, map[string]int) {
	var faults []soakFault
	counts := map[string]int{}
	kinds := []string{"kill9", "sigstop", "redis_restart", "failover"}
	for n := 0; n < 100 && (time.Now().Before(end) || n < len(kinds)); n++ {
		time.Sleep(time.Second) // traffic between faults
		kind := kinds[n%len(kinds)]
		r := reps[(n/len(kinds)+n)%len(reps)]
		f := soakFault{kind: kind, from: h.Since()}
		switch kind {
		case "kill9":
			f.replica = r.name
			r.cur().kill()
			r.procs = append(r.procs, start(t, r.bin, r.args, nil))
			// Until its successor listens, every run of this replica the
			// provider sees is the dead process's, however late the
			// provider's handler records it (a request sent just before
			// the kill).
			f.to = h.Since()
			faults = append(faults, f)
			counts["restart"]++
		case "sigstop":
			f.replica = r.name
			signalProc(t, r.cur(), syscall.SIGSTOP)
			time.Sleep(soakLease + time.Second) // past its lease: the others take its keys over
			signalProc(t, r.cur(), syscall.SIGCONT)
			f.to = h.Since()
			faults = append(faults, f)
		case "redis_restart":
			set.restartPrimary(t)
			f.to = h.Since()
			faults = append(faults, f)
		case "failover":
			set.failover(t)
			f.to = h.Since()
			faults = append(faults, f)
		}
		counts[kind]++
		for _, r := range reps {
			waitReady(t, r, 30*time.Second)
		}
		if err := set.healthy(30 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return faults, counts
}

// soakLogLine is what the soak reads of a replica's log.
type soakLogLine struct {
	Time time.Time `json:"time"`
	Msg  string    `json:"msg"`
	Key  string    `json:"idempotency_key"`
	Err  string    `json:"err"`
}

// addObservedCalls adds to the history the store calls the soak can see
// from outside the gateways, for Check's P2 and P3:
//   - a commit applied, for every answer a client was shown as a replay
//     and for the record each key holds at the end — the store's contents
//     as observed over the key's life;
//   - for each key's completed runs that the store does not keep, the
//     failed commits the replicas logged and the faults that explain the
//     rest (lostCalls).
func addObservedCalls(h *sim.History, reps []*soakReplica, faults []soakFault) {
	for _, o := range h.Ops() {
		if o.Complete && o.Replayed {
			h.AddCall(&sim.StoreCall{Method: "Commit", Key: o.Key, Applied: true, Run: o.Run, Hash: o.Hash, At: o.Start, Owner: "replayed"})
		}
	}
	finals := h.Finals()
	for k, f := range finals {
		if f.State == "committed" {
			h.AddCall(&sim.StoreCall{Method: "Commit", Key: k, Applied: true, Run: f.Run, Hash: f.Hash, At: h.Since(), Owner: "final"})
		}
	}
	failed := commitFailures(h, reps)
	byKey := map[string][]sim.Run{}
	kept := map[string]*sim.Run{}
	for _, r := range h.Runs() {
		switch {
		case !r.Completed:
		case finals[r.Key].State == "committed" && finals[r.Key].Run == r.ID:
			kept[r.Key] = &r
		default:
			byKey[r.Key] = append(byKey[r.Key], r)
		}
	}
	for k, lost := range byKey {
		logged := map[string][]loggedFailure{}
		for _, r := range lost {
			logged[r.Via] = failed[r.Via+"/"+idempotency.HashKey(cache.Key{ID: k})]
		}
		for _, c := range lostCalls(k, lost, kept[k], logged, faults) {
			h.AddCall(c)
		}
	}
}

// loggedFailure is one "commit failed" line a replica wrote: its error,
// and when, on the history's clock.
type loggedFailure struct {
	err string
	at  time.Duration
}

// lostCalls are the store calls that account for one key's completed runs
// that the store does not keep (lost), given the run it keeps (kept, nil
// for none), the commit failures each replica logged for the key (logged,
// by replica) and the faults:
//   - a failed commit for each logged line, given to the run of its
//     replica that ended last before the line was written. Not to the
//     replica's runs in order: a replica stopped past its lease wakes to
//     find its attempt timed out (the provider had finished it: lost to
//     the stop, with no commit), retries, and logs the retry's failed
//     commit. A line the kept run accounts for (a commit whose reply timed
//     out after it was applied) accounts for no lost run;
//   - a commit lost to a fault, for a run no line accounts for, whose
//     replica was killed (or stopped) after the run started and before
//     soakCommitGrace after its end — the process died before it could
//     commit or log. A killed replica's window ends when its successor
//     listens: a run the provider saw start before then was the dead
//     process's, since the new one had taken no request.
func lostCalls(k string, lost []sim.Run, kept *sim.Run, logged map[string][]loggedFailure, faults []soakFault) []*sim.StoreCall {
	var out []*sim.StoreCall
	paired := map[int]bool{}
	if kept != nil {
		lost = append(slices.Clone(lost), *kept)
	}
	for via, lines := range logged {
		lines = slices.Clone(lines)
		sort.Slice(lines, func(i, j int) bool { return lines[i].at < lines[j].at })
		for _, l := range lines {
			// The line is written after the commit fails, which is after
			// the provider's last byte; 2ms covers the two processes'
			// clock readings.
			best := -1
			for i, r := range lost {
				if r.Via != via || paired[r.ID] || r.End > l.at+2*time.Millisecond {
					continue
				}
				if best < 0 || r.End > lost[best].End {
					best = i
				}
			}
			if best < 0 {
				continue
			}
			r := lost[best]
			paired[r.ID] = true
			if kept != nil && r.ID == kept.ID {
				continue
			}
			out = append(out, &sim.StoreCall{Method: "Commit", Key: k, Owner: r.Via, Run: r.ID, Err: l.err, At: r.End})
		}
	}
	for _, r := range lost {
		if paired[r.ID] || kept != nil && r.ID == kept.ID {
			continue
		}
		for _, f := range faults {
			if f.replica == r.Via && f.from <= r.End+soakCommitGrace && r.Start <= f.to {
				out = append(out, &sim.StoreCall{Method: "Commit", Key: k, Owner: r.Via, Run: r.ID, Fault: "replica_" + f.kind, At: r.End})
				break
			}
		}
	}
	return out
}

// commitFailures reads every "commit failed" line of every process of
// every replica, by replica/hashed key.
func commitFailures(h *sim.History, reps []*soakReplica) map[string][]loggedFailure {
	out := map[string][]loggedFailure{}
	for _, r := range reps {
		for _, p := range r.procs {
			sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				var l soakLogLine
				if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "commit failed" {
					out[r.name+"/"+l.Key] = append(out[r.name+"/"+l.Key], loggedFailure{err: l.Err, at: h.At(l.Time)})
				}
			}
		}
	}
	return out
}

// soakReport is the failure report: the seed, the violations, the
// failing keys' histories.
// The violations come first and again last, with the faults' times, since
// a CI log may keep only its tail.
func soakReport(h *sim.History, vs []sim.Violation, seed int64, faults []soakFault) string {
	var b, sum strings.Builder
	fmt.Fprintf(&sum, "seed %d (LLMGATE_SIM_SEED reproduces the workload and the provider's plan, not the fault timing): %d violations\n", seed, len(vs))
	var keys []string
	seen := map[string]bool{}
	for i, v := range vs {
		if i < 20 {
			fmt.Fprintf(&sum, "  %s key %s: %s\n", v.Property, v.Key, v.Detail)
		}
		if !seen[v.Key] && len(keys) < 5 {
			seen[v.Key] = true
			keys = append(keys, v.Key)
		}
	}
	sum.WriteString("faults:\n")
	for _, f := range faults {
		fmt.Fprintf(&sum, "  %s %s from %.3fms to %.3fms\n", f.kind, f.replica, float64(f.from.Microseconds())/1000, float64(f.to.Microseconds())/1000)
	}
	b.WriteString(sum.String())
	b.WriteString(h.Describe(keys))
	b.WriteString(sum.String())
	return b.String()
}

func countsLine(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
