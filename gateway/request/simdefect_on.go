//go:build simdefects

package request

import (
	"context"
	"sync/atomic"

	"github.com/llmgate/llmgate/gateway/apierror"
)

// simDefectID names a past defect of the keyed path that this build
// (-tags simdefects) can re-introduce, to show that the fault simulation
// (package gateway/sim) catches it. Only test builds contain this file.
type simDefectID int

const (
	defectEndBeforeCommit simDefectID = iota
	defectCommitUnderClient
)

var simDefects [2]atomic.Bool

// Re-introducible defects, for SetSimDefect.
const (
	// DefectStreamEndBeforeCommit sends a keyed stream's held-back end
	// before its commit: a client can see a stream end normally whose
	// commit then fails, and its retry gets a different answer.
	DefectStreamEndBeforeCommit = "stream-end-before-commit"
	// DefectCommitUnderClientContext commits under the client's context:
	// once the client has left, or its deadline passed, the commit fails,
	// the key is released, and the finished answer is lost — the retry
	// pays for a second, different one.
	DefectCommitUnderClientContext = "commit-under-client-context"
)

// SetSimDefect switches a re-introduced defect on or off, process-wide.
func SetSimDefect(name string, on bool) {
	switch name {
	case DefectStreamEndBeforeCommit:
		simDefects[defectEndBeforeCommit].Store(on)
	case DefectCommitUnderClientContext:
		simDefects[defectCommitUnderClient].Store(on)
	default:
		panic("unknown simulation defect " + name)
	}
}

func simDefect(d simDefectID) bool { return simDefects[d].Load() }

// simCommitUnderClient is what a commit under the client's context did:
// with the client gone its store call failed on the cancelled context, and
// the key was released (as Lease.Commit does on a failure).
func simCommitUnderClient(k *keyedCall) error {
	if !simDefect(defectCommitUnderClient) {
		return nil
	}
	ctx := k.cl.In.Context()
	if ctx.Err() == nil {
		return nil
	}
	k.lease.Release(k.work)
	return &apierror.StoreUnavailable{Err: context.Cause(ctx)}
}
