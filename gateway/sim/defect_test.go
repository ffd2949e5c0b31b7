//go:build simdefects

package sim_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/gateway/request"
	"github.com/llmgate/llmgate/gateway/sim"
)

// TestSimulationCatchesDefects re-introduces two past defects of the keyed
// path (go test -tags simdefects) and holds the simulation to catching
// each: for several seeds, the workload doubles from 25 requests until the
// checker reports a violation, and the test fails if a defect escapes
// 3,200 requests. It logs how many requests each seed took.
func TestSimulationCatchesDefects(t *testing.T) {
	seed := simSeed(t)
	for _, defect := range []struct{ name, property string }{
		{request.DefectStreamEndBeforeCommit, sim.PropAgree},
		{request.DefectCommitUnderClientContext, sim.PropOneRun},
	} {
		t.Run(defect.name, func(t *testing.T) {
			request.SetSimDefect(defect.name, true)
			defer request.SetSimDefect(defect.name, false)
			var took []string
			for s := seed; s < seed+5; s++ {
				n, res := catch(t, s)
				if res == nil {
					t.Fatalf("seed %d: %s escaped 3200 requests", s, defect.name)
				}
				if !flags(res, defect.property) {
					t.Errorf("seed %d: caught, but not by %s:\n%s", s, defect.property, res.Report())
				}
				took = append(took, fmt.Sprintf("seed %d: %d ops (%s)", s, n, res.Violations[0].Property))
			}
			t.Logf("%s caught: %s", defect.name, strings.Join(took, "; "))
		})
	}
}

// catch runs ever longer workloads on seed until one has a violation.
func catch(t *testing.T, seed int64) (int, *sim.Result) {
	for n := 25; n <= 3200; n *= 2 {
		res, err := sim.Simulate(sim.Options{Seed: seed, Ops: n, OpenStore: openBadger(t), Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Violations) > 0 {
			return n, res
		}
	}
	return 0, nil
}

func flags(res *sim.Result, property string) bool {
	for _, v := range res.Violations {
		if v.Property == property {
			return true
		}
	}
	return false
}
