package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// redisProc is a redis-server process of one test's own, on a free
// loopback port with its own directory, so that the test may pause, kill
// and restart it (the shared Redis at LLMGATE_REDIS_ADDR is never touched).
type redisProc struct {
	t      *testing.T
	bin    string
	port   int
	dir    string
	args   []string
	cmd    *exec.Cmd
	exited chan error
	log    *syncBuffer
}

// startRedis starts a redis-server with no persistence unless args say
// otherwise (later flags win). Without redis-server the test is skipped,
// or fails under LLMGATE_REQUIRE_REDIS=1 (CI), as the replica tests do.
func startRedis(t *testing.T, args ...string) *redisProc {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("LLMGATE_REQUIRE_REDIS") == "1" {
			t.Fatalf("redis-server expected (LLMGATE_REQUIRE_REDIS=1): %v", err)
		}
		t.Skipf("redis-server not installed (%v): install Redis 7 to run the fault tests", err)
	}
	r := &redisProc{t: t, bin: bin, dir: t.TempDir(), args: args}
	for attempt := 0; ; attempt++ {
		r.port = freeLoopbackPort(t)
		if err := r.start(); err == nil {
			break
		} else if attempt == 4 {
			t.Fatal(err)
		}
	}
	t.Cleanup(r.kill)
	return r
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// URL is the redis:// URL of the server.
func (r *redisProc) URL() string { return "redis://127.0.0.1:" + strconv.Itoa(r.port) + "/0" }

// start runs the server and waits for its "Ready to accept connections"
// log line (after it has loaded any append-only file), or its exit.
func (r *redisProc) start() error {
	args := append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--logfile", "", "--daemonize", "no"}, r.args...)
	r.cmd = exec.Command(r.bin, args...)
	// This run's log, which its reader below writes: a restart replaces
	// r.log while the last run's reader may still be draining its pipe.
	log := &syncBuffer{}
	r.log = log
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	r.cmd.Stderr = log
	if err := r.cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		closed := false
		for sc.Scan() {
			line := sc.Text()
			_, _ = log.Write([]byte(line + "\n"))
			if !closed && strings.Contains(line, "Ready to accept connections") {
				close(ready)
				closed = true
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	r.exited = make(chan error, 1)
	cmd, exited := r.cmd, r.exited
	go func() { exited <- cmd.Wait() }()
	select {
	case <-ready:
		return nil
	case err := <-r.exited:
		r.cmd = nil
		return fmt.Errorf("redis-server on port %d exited before it was ready: %v\n%s", r.port, err, r.log.String())
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.exited
		r.cmd = nil
		return fmt.Errorf("redis-server on port %d not ready within 10s:\n%s", r.port, r.log.String())
	}
}

// restart starts the server again on the same port and directory (so an
// append-only file, if any, is loaded).
func (r *redisProc) restart() {
	r.t.Helper()
	if r.cmd != nil {
		r.t.Fatal("restart of a running redis-server")
	}
	if err := r.start(); err != nil {
		r.t.Fatal(err)
	}
}

// signal sends sig and, for SIGKILL and SIGTERM, waits for the exit.
func (r *redisProc) signal(sig syscall.Signal) {
	r.t.Helper()
	if r.cmd == nil {
		return
	}
	if err := r.cmd.Process.Signal(sig); err != nil {
		r.t.Fatalf("signal %v to redis-server: %v", sig, err)
	}
	if sig != syscall.SIGKILL && sig != syscall.SIGTERM {
		return
	}
	select {
	case <-r.exited:
		r.cmd = nil
	case <-time.After(10 * time.Second):
		r.t.Fatalf("redis-server did not exit on %v:\n%s", sig, r.log.String())
	}
}

// pause stops the server with SIGSTOP and waits until the kernel reports
// it stopped: from then on it accepts connections (the kernel completes
// the handshake) but runs no command until resume.
func (r *redisProc) pause() {
	r.t.Helper()
	r.signal(syscall.SIGSTOP)
	deadline := time.Now().Add(5 * time.Second)
	for procState(r.cmd.Process.Pid) != 'T' {
		if time.Now().After(deadline) {
			r.t.Fatal("redis-server not stopped 5s after SIGSTOP")
		}
		// Waiting for the kernel to act on a signal: there is no event to
		// wait on but the process state.
		time.Sleep(time.Millisecond)
	}
}

// resume continues a paused server: the commands that queued in its
// sockets meanwhile run now.
func (r *redisProc) resume() {
	r.t.Helper()
	r.signal(syscall.SIGCONT)
}

func (r *redisProc) kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGCONT) // a paused server must run to die
	_ = r.cmd.Process.Kill()
	<-r.exited
	r.cmd = nil
}

// procState is the state letter of /proc/<pid>/stat (R, S, T, ...).
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ...: comm may hold spaces, so look after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}
