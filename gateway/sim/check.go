package sim

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
)

// The properties a history is held to. The names are quoted in the README.
const (
	// PropAgree (P1): every response a client saw complete for a key is,
	// byte for byte, every other complete response and replay of that key,
	// and the answer the store keeps for it. (An answer over the record
	// limits is served, not kept, and not held to it.)
	PropAgree = "P1 complete-responses-agree"
	// PropOneBody (P2): a key never has two different committed bodies over
	// its life, and the store holds only bytes a commit wrote.
	PropOneBody = "P2 one-committed-body"
	// PropOneRun (P3): one provider run produced each committed answer (its
	// bytes are that run's); every other run of the key that completed was
	// lost to a cause — an injected store fault on its commit, its lease
	// taken over, an answer too large to keep — counted by cause.
	PropOneRun = "P3 one-run-per-answer"
	// PropSettled (P4): at quiescence no claim is held past its lease, and
	// every key is committed, marked not-stored, or free.
	PropSettled = "P4 settled-at-quiescence"
	// PropPrefix (P5): a partial stream a client saw is a prefix of what a
	// retry gets, or the retry is a fresh run the client was told to expect
	// — an error event, or a connection that broke (the chunked body never
	// ended, which every HTTP client raises) — or the client itself left.
	// A stream that ends cleanly short of its end with no error event is a
	// violation. Broken connections are counted (partial_broken/<mode>).
	PropPrefix = "P5 partial-is-prefix-or-told"
)

// Violation is one property a key broke.
type Violation struct {
	Property, Key, Detail string
}

// keyHistory is one key's part of a history.
type keyHistory struct {
	ops   []*Op
	runs  []*Run
	calls []*StoreCall
	quiet *Final
	final *Final
}

// Check holds the history to the properties; quiet is every key's state at
// quiescence (before the final retries). It returns the violations, and
// the provider runs counted by what became of them with the partial
// streams that ended in a broken connection.
func Check(h *History, quiet map[string]*Final) ([]Violation, map[string]int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	keys := map[string]*keyHistory{}
	get := func(k string) *keyHistory {
		if keys[k] == nil {
			keys[k] = &keyHistory{}
		}
		return keys[k]
	}
	for _, o := range h.ops {
		get(o.Key).ops = append(get(o.Key).ops, o)
	}
	for _, r := range h.runs {
		get(r.Key).runs = append(get(r.Key).runs, r)
	}
	for _, c := range h.calls {
		get(c.Key).calls = append(get(c.Key).calls, c)
	}
	names := make([]string, 0, len(keys))
	for k, kh := range keys {
		kh.quiet, kh.final = quiet[k], h.final[k]
		if kh.final == nil {
			kh.final = &Final{State: "free"}
		}
		names = append(names, k)
	}
	sort.Strings(names)
	var vs []Violation
	runs := map[string]int{}
	for _, k := range names {
		kh := keys[k]
		for _, c := range []func(string, *keyHistory, map[string]int) []Violation{checkAgree, checkOneBody, checkOneRun, checkSettled, checkPrefix} {
			vs = append(vs, c(k, kh, runs)...)
		}
	}
	return vs, runs
}

// kept is the run whose answer the store keeps for the key (0: none).
func (kh *keyHistory) kept() int {
	if kh.final.State == "committed" && kh.final.Status == 200 {
		return kh.final.Run
	}
	return 0
}

func (kh *keyHistory) big() bool {
	for _, o := range kh.ops {
		if o.Big {
			return true
		}
	}
	return false
}

func checkAgree(k string, kh *keyHistory, _ map[string]int) []Violation {
	var complete []*Op
	for _, o := range kh.ops {
		// An answer over the record limits is served, not kept: its
		// client is told so (X-Llmgate-Committed: false), its marker's 410
		// answers the retries, and if the marker could not be stored the
		// retry runs again. P1 holds the answers that are kept.
		if o.Complete && !o.Big {
			complete = append(complete, o)
		}
	}
	if len(complete) == 0 {
		return nil
	}
	sort.SliceStable(complete, func(i, j int) bool { return complete[i].End < complete[j].End })
	first := complete[0]
	var vs []Violation
	for _, o := range complete[1:] {
		if o.Hash != first.Hash {
			vs = append(vs, Violation{PropAgree, k, fmt.Sprintf("op %d saw run %d complete, later op %d saw run %d (%d vs %d bytes)",
				first.ID, first.Run, o.ID, o.Run, first.Size, o.Size)})
		}
	}
	switch {
	case kh.kept() != 0:
		if first.Hash != kh.final.Hash {
			vs = append(vs, Violation{PropAgree, k, fmt.Sprintf("op %d saw run %d complete, the store keeps run %d", first.ID, first.Run, kh.final.Run)})
		}
	default:
		vs = append(vs, Violation{PropAgree, k, fmt.Sprintf("op %d saw run %d complete, but the key ended %s (status %d): a retry does not replay it",
			first.ID, first.Run, kh.final.State, kh.final.Status)})
	}
	return vs
}

func checkOneBody(k string, kh *keyHistory, _ map[string]int) []Violation {
	var vs []Violation
	var first *StoreCall
	wrote := map[[32]byte]bool{}
	for _, c := range kh.calls {
		if c.Method == "Commit" && (c.Applied || c.Maybe) {
			wrote[c.Hash] = true
		}
		if c.Method != "Commit" || !c.Applied {
			continue
		}
		if first == nil {
			first = c
			continue
		}
		if c.Hash != first.Hash {
			vs = append(vs, Violation{PropOneBody, k, fmt.Sprintf("commit %d wrote run %d, commit %d wrote run %d", first.Seq, first.Run, c.Seq, c.Run)})
		}
	}
	if kh.final.State == "committed" && (!wrote[kh.final.Hash] || first != nil && first.Hash != kh.final.Hash) {
		vs = append(vs, Violation{PropOneBody, k, fmt.Sprintf("the store holds run %d, which no applied commit wrote", kh.final.Run)})
	}
	return vs
}

// lostCause is why a completed run of the key was not kept ("" for no
// reason the history shows), and a violation's detail when its commit
// failed by itself.
func (kh *keyHistory) lostCause(run int) (cause, bad string) {
	for _, c := range kh.calls {
		if c.Method != "Commit" || c.Run != run {
			continue
		}
		switch {
		case c.Fault != "":
			return "commit_" + c.Fault, ""
		case strings.Contains(c.Err, "not the owner"):
			return "commit_lease_lost", ""
		case strings.Contains(c.Err, "deadline exceeded"):
			// The store did not answer within store.op_timeout: a real
			// timeout, and the client was told the commit failed.
			return "commit_store_timeout", ""
		case c.Err != "" && !strings.Contains(c.Err, "context canceled"):
			// The store itself failed (a Redis read timeout under load):
			// the client was told. A cancelled commit is no such cause —
			// nothing may cancel a commit.
			return "commit_store_error", ""
		case c.Err != "":
			bad = fmt.Sprintf("commit %d of run %d failed with no injected fault: %s", c.Seq, run, c.Err)
		}
	}
	if bad == "" && kh.big() {
		return "too_large_to_keep", ""
	}
	return "", bad
}

func checkOneRun(k string, kh *keyHistory, runs map[string]int) []Violation {
	var vs []Violation
	kept := kh.kept()
	found := kept == 0
	for _, r := range kh.runs {
		if !r.Completed {
			runs["attempt_"+r.Behavior]++
			continue
		}
		runs["completed"]++
		if r.ID == kept {
			found = true
			runs["kept"]++
			if r.Hash != kh.final.Hash {
				vs = append(vs, Violation{PropOneRun, k, fmt.Sprintf("the store keeps run %d, but not the bytes that run sent", r.ID)})
			}
			continue
		}
		cause, bad := kh.lostCause(r.ID)
		switch {
		case cause != "":
			runs["lost_"+cause]++
		case bad != "":
			vs = append(vs, Violation{PropOneRun, k, bad})
		default:
			vs = append(vs, Violation{PropOneRun, k, fmt.Sprintf("run %d completed but was neither kept nor lost to an injected fault or a takeover", r.ID)})
		}
	}
	if !found {
		vs = append(vs, Violation{PropOneRun, k, fmt.Sprintf("the store keeps run %d, which no completed provider run of this key sent", kept)})
	}
	return vs
}

func checkSettled(k string, kh *keyHistory, _ map[string]int) []Violation {
	var vs []Violation
	if q := kh.quiet; q != nil && q.State != "committed" && q.State != "free" {
		if q.State != "in_flight" || !q.Expired || !q.Claimable {
			vs = append(vs, Violation{PropSettled, k, fmt.Sprintf("at quiescence, after the lease: %s (lease run out %v, claimable %v)", q.State, q.Expired, q.Claimable)})
		}
	}
	if f := kh.final; f.State != "committed" && f.State != "free" && (f.State != "in_flight" || !f.Expired) {
		vs = append(vs, Violation{PropSettled, k, fmt.Sprintf("after the final retries, with every call ended and the lease past: %s (lease run out %v)", f.State, f.Expired)})
	}
	return vs
}

func checkPrefix(k string, kh *keyHistory, counts map[string]int) []Violation {
	var vs []Violation
	kept := kh.kept()
	for _, o := range kh.ops {
		if !o.Stream || o.Complete || o.Status != 200 || o.Run == 0 {
			continue
		}
		partial := o.Body
		if i := bytes.Index(partial, []byte(`data: {"error"`)); i >= 0 {
			partial = partial[:i]
		}
		switch {
		case o.Run == kept:
			if !bytes.HasPrefix(kh.final.Body, partial) {
				vs = append(vs, Violation{PropPrefix, k, fmt.Sprintf("op %d's partial stream of run %d is not a prefix of the kept answer", o.ID, o.Run)})
			}
		case o.ErrorEvent, o.ClientCut:
			// Told (an error event), or it left: its retry may be a fresh run.
		case o.ReadErr != "":
			// The connection broke: the client's HTTP stack raises.
			counts["partial_broken/"+o.Mode]++
		default:
			vs = append(vs, Violation{PropPrefix, k, fmt.Sprintf("op %d's stream of run %d stopped short with no error event (%s), and the key keeps run %d",
				o.ID, o.Run, o.ReadErr, kept)})
		}
	}
	return vs
}
