package e2e

// Issue 16, "Resuming a workflow, end to end": the example program
// e2e/workflow — three LLM steps keyed wf-<id>/<step>, each prompt built
// from the answer before — is killed with SIGKILL while its second step's
// call is in flight, and run again with the same id, then once more.

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// recipeWorkflowRun is one run of the workflow program.
type recipeWorkflowRun struct {
	t     *testing.T
	id    string
	cmd   *exec.Cmd
	lines chan string // its stdout, closed at EOF
	seen  []string
	err   *syncBuffer
}

func startRecipeWorkflow(t *testing.T, bin string, g *recipeGateway, id string) *recipeWorkflowRun {
	t.Helper()
	cmd := exec.Command(bin, "-id", id)
	cmd.Env = append(os.Environ(), "LLMGATE_BASE_URL="+g.base, "LLMGATE_API_KEY="+recipeClientKey)
	w := &recipeWorkflowRun{t: t, id: id, cmd: cmd, lines: make(chan string, 64), err: &syncBuffer{}}
	cmd.Stderr = w.err
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(w.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return w
}

// until reads the run's output up to and including the line want.
func (w *recipeWorkflowRun) until(want string) {
	w.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-w.lines:
			if !ok {
				w.t.Fatalf("workflow ended before %q; it printed %q\n%s", want, w.seen, w.err.String())
			}
			w.seen = append(w.seen, l)
			if l == want {
				return
			}
		case <-timeout:
			w.t.Fatalf("workflow did not print %q within 30s; it printed %q", want, w.seen)
		}
	}
}

// finish reads the run's output to its end and waits for it to exit 0.
func (w *recipeWorkflowRun) finish() {
	w.t.Helper()
	w.until("wf-" + w.id + " finished")
	for l := range w.lines {
		w.seen = append(w.seen, l)
	}
	if err := w.cmd.Wait(); err != nil {
		w.t.Fatalf("workflow: %v\n%s", err, w.err.String())
	}
}

// done returns what the run printed when step finished: replayed and the
// digest of the answer's bytes; ok is false if it never finished it.
func (w *recipeWorkflowRun) done(step string) (replayed, digest string, ok bool) {
	for _, l := range w.seen {
		rest, found := strings.CutPrefix(l, "wf-"+w.id+"/"+step+" done ")
		if !found {
			continue
		}
		for f := range strings.FieldsSeq(rest) {
			if v, ok := strings.CutPrefix(f, "replayed="); ok {
				replayed = v
			}
			if v, ok := strings.CutPrefix(f, "sha256="); ok {
				digest = v
			}
		}
		return replayed, digest, true
	}
	return "", "", false
}

func TestRecipeWorkflowResume(t *testing.T) {
	g := startRecipeGateway(t)
	bin := filepath.Join(t.TempDir(), "workflow")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/llmgate/llmgate/e2e/workflow").CombinedOutput(); err != nil {
		t.Fatalf("go build e2e/workflow: %v\n%s", err, out)
	}
	const id = "7"
	steps := []string{"outline", "draft", "review"}

	// Run 1: the draft's upstream call is held; once the program has said
	// it is calling the draft and the call has reached the upstream, it
	// dies with SIGKILL.
	arrived := g.gate.hold("Write a short draft")
	first := startRecipeWorkflow(t, bin, g, id)
	first.until("wf-7/draft calling")
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the draft's call did not reach the upstream")
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.cmd.Wait()
	for l := range first.lines {
		first.seen = append(first.seen, l)
	}
	if _, _, ok := first.done("draft"); ok {
		t.Fatalf("run 1 finished the draft before it was killed: %q", first.seen)
	}

	// Run 2, same id: the draft's call went on without its client; it is
	// let through once run 2 asks for the draft again.
	second := startRecipeWorkflow(t, bin, g, id)
	second.until("wf-7/draft calling")
	g.gate.open()
	second.finish()

	// Run 3: everything is answered from the store.
	third := startRecipeWorkflow(t, bin, g, id)
	third.finish()
	t.Logf("run 1: %q\nrun 2: %q\nrun 3: %q", first.seen, second.seen, third.seen)

	r1, d1, _ := first.done("outline")
	r2, d2, _ := second.done("outline")
	if r1 != "false" || r2 != "true" || d1 == "" || d1 != d2 {
		t.Fatalf("outline: run 1 replayed=%s sha256=%s, run 2 replayed=%s sha256=%s: want a fresh answer replayed byte for byte", r1, d1, r2, d2)
	}
	if r, _, _ := second.done("draft"); r != "true" {
		t.Fatalf("draft in run 2: replayed=%s, want the answer of the call that went on after run 1 died", r)
	}
	if r, _, _ := second.done("review"); r != "false" {
		t.Fatalf("review in run 2: replayed=%s, want a fresh call", r)
	}
	for _, step := range steps {
		_, d2, ok2 := second.done(step)
		r3, d3, ok3 := third.done(step)
		if !ok2 || !ok3 || r3 != "true" || d2 != d3 {
			t.Fatalf("%s: run 2 sha256=%s, run 3 replayed=%s sha256=%s: want run 2's bytes replayed", step, d2, r3, d3)
		}
		if n := g.upstreamCalls("wf-" + id + "/" + step); n != 1 {
			t.Fatalf("%s: %d upstream calls, want 1", step, n)
		}
	}
	if n := g.fake.Calls(""); n != len(steps) {
		t.Fatalf("%d upstream calls in all, want %d", n, len(steps))
	}
}
