//go:build !simdefects

package request

// simDefectID names a past defect of the keyed path that a build with
// -tags simdefects can re-introduce (simdefect_on.go), to show that the
// fault simulation (package gateway/sim) catches it. In every other build
// none is on and the compiler drops the hooks.
type simDefectID int

const (
	defectEndBeforeCommit simDefectID = iota
	defectCommitUnderClient
)

func simDefect(simDefectID) bool { return false }

func simCommitUnderClient(*keyedCall) error { return nil }
