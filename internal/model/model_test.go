package model

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testenv"
)

// bounds are the model's bounds for every run: two workers of two
// attempts each, one SIGKILL, one stall, one lost store answer, one fn
// error. A check may change them (withBounds). docs/guarantees.md ("The
// model") gives the state counts, and those of the larger checks.
var bounds = []string{"-DW=2", "-DK=2", "-DCRASHES=1", "-DSTALLS=1", "-DLOSSES=1", "-DERRS=1"}

// The policies, as idem.pml's POL.
const (
	atLeastOnce = "-DPOL=1"
	atMostOnce  = "-DPOL=2"
	reconcile   = "-DPOL=3"
)

// full, when set to 1, adds the larger checks to TestModel: a few minutes
// and up to 1 GiB.
const full = "IDEM_MODEL_FULL"

// TestModel checks the model under each policy: spin explores every
// reachable state and must find no violated invariant, no invalid end
// state, and no search cut short.
func TestModel(t *testing.T) {
	s := newSpin(t)
	for _, c := range []struct {
		name  string
		defs  []string
		large bool // only with IDEM_MODEL_FULL=1
	}{
		// fn's error under AtLeastOnce (a release) is left to
		// at_most_once, which releases on idem.NotDone alike, and to the
		// full check.
		{"at_least_once", []string{atLeastOnce, "-DERRS=0"}, false},
		{"at_most_once", []string{atMostOnce}, false},
		// A stall under Reconcile makes a second effect possible (the
		// stalled attempt's, after the hook found none), which the model
		// allows and counts as the stall's. The stall is in the full check.
		{"reconcile", []string{reconcile, "-DSTALLS=0"}, false},
		{"at_least_once_full", []string{atLeastOnce, "-DLOSSES=2"}, true},
		{"reconcile_full", []string{reconcile}, true},
		// Three workers race for the key, with one kill and one lost
		// answer.
		{"three_workers", []string{atLeastOnce, "-DW=3", "-DSTALLS=0", "-DERRS=0"}, true},
	} {
		if c.large && os.Getenv(full) != "1" {
			t.Logf("%s: not run (%s=1 runs it)", c.name, full)
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			out, states, took := s.check(t, c.defs...)
			if !strings.Contains(out, "errors: 0") || strings.Contains(out, "violated") {
				t.Fatalf("spin found a violation:\n%s", out)
			}
			if strings.Contains(out, "max search depth too small") || strings.Contains(out, "Search not completed") {
				t.Fatalf("spin's search was cut short:\n%s", out)
			}
			// The bounds reach well beyond the first few steps: a model
			// that deadlocked early or lost its faults would pass with a
			// few thousand states.
			if states < 100_000 {
				t.Fatalf("only %d states explored; want the full space (more than 100,000):\n%s", states, out)
			}
			t.Logf("%d states, %.1f s (pan's own time)", states, took)
		})
	}
}

// TestMutants checks that the checker can fail: each mutant of the model
// drops one rule of the protocol, and spin must find a state that breaks
// the invariant that rule keeps.
func TestMutants(t *testing.T) {
	s := newSpin(t)
	for _, c := range []struct {
		mutant, policy, invariant string
		defs                      []string // other bounds than the model's
	}{
		// Finish applied to whatever attempt holds the key.
		{"MUT_FINISH_NO_FENCE", atLeastOnce, "stale_finish_refused", nil},
		// A claim takes over a lapsed AtMostOnce record.
		{"MUT_AMO_TAKEOVER", atMostOnce, "atmostonce_no_second_effect", nil},
		// A claim whose answer was lost is not read back and undone.
		{"MUT_NO_READBACK", atMostOnce, "lost_claim_undone", nil},
		// Resolve decides whatever attempt is there, not the one inspected.
		{"MUT_RESOLVE_NO_FENCE", atLeastOnce, "resolve_respects_fence", nil},
		// Resolve leaves the fence as it was.
		{"MUT_RESOLVE_SAME_FENCE", atMostOnce, "fence_monotonic", nil},
		// A claim takes a record whose lease is running.
		{"MUT_CLAIM_RUNNING", atLeastOnce, "single_holder", nil},
		// A completion whose answer was lost is not sent again: the key
		// is left to its lease, and the next delivery repeats the effect.
		{"MUT_NO_FINISH_RETRY", atLeastOnce, "atleastonce_dup_only_after_fault", nil},
		// A takeover whose answer was lost is undone by a release: the
		// next claim is not a takeover, and the key was not released by
		// an attempt that ran fn, so the Reconcile hook is not asked
		// about the lapsed attempt's effect, and fn runs again.
		{"MUT_UNDO_RELEASES_TAKEOVER", reconcile, "atmostonce_no_second_effect", []string{"-DSTALLS=0"}},
		// fn's idem.NotDone under AtMostOnce abandons the key: left
		// stuck by a live worker, with nothing done.
		{"MUT_NOTDONE_ABANDONS", atMostOnce, "atmostonce_stuck_only_after_fault", nil},
		// A released key answers duplicate: nobody runs it again.
		{"MUT_RELEASED_NOT_CLAIMABLE", atLeastOnce, "atleastonce_no_loss", nil},
	} {
		t.Run(c.mutant, func(t *testing.T) {
			t.Parallel() // most of the time is the C compiler's, on one core
			out, states, _ := s.check(t, append([]string{c.policy, "-D" + c.mutant}, c.defs...)...)
			want := "assertion violated " + c.invariant
			if !strings.Contains(out, want) {
				t.Fatalf("spin did not report %q for %s:\n%s", want, c.mutant, out)
			}
			t.Logf("%s found after %d states", c.invariant, states)
		})
	}
}

// withBounds returns bounds with defs added, a def of a macro that bounds
// defines replacing its value there.
func withBounds(defs []string) []string {
	all := append([]string(nil), bounds...)
	for _, d := range defs {
		name, _, _ := strings.Cut(d, "=")
		i := slices.IndexFunc(all, func(b string) bool { return strings.HasPrefix(b, name+"=") })
		if i >= 0 {
			all[i] = d
		} else {
			all = append(all, d)
		}
	}
	return all
}

type spin struct {
	spin, cc string
	model    []byte
}

func newSpin(t *testing.T) *spin {
	t.Helper()
	bin := testenv.Require(t, testenv.Spin, "the spin check of the protocol model (internal/model)")
	cc, err := exec.LookPath("gcc")
	if err != nil {
		if cc, err = exec.LookPath("cc"); err != nil {
			t.Fatalf("%s is set but there is no C compiler (gcc or cc) to build spin's verifier", testenv.Spin)
		}
	}
	model, err := os.ReadFile("idem.pml")
	if err != nil {
		t.Fatal(err)
	}
	return &spin{spin: bin, cc: cc, model: model}
}

var (
	statesRE  = regexp.MustCompile(`(\d+) states, stored`)
	elapsedRE = regexp.MustCompile(`pan: elapsed time ([0-9.e+]+) seconds`)
)

// check generates the verifier of the model with defs (spin -a), builds
// it for safety properties (assertions and invalid end states), runs it,
// and returns its output, the states it stored and its own time in
// seconds. It fails t only when a step cannot run; what the output says
// is the caller's to judge. The verifier stops at the first violation.
func (s *spin) check(t *testing.T, defs ...string) (out string, states int, took float64) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "idem.pml"), s.model, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
		}
		return string(b)
	}
	args := append([]string{"-a"}, withBounds(defs)...)
	run(s.spin, append(args, "idem.pml")...)
	// -O0: the verifier builds in a fifth of -O2's time and runs these
	// state spaces within seconds all the same.
	run(s.cc, "-O0", "-w", "-DSAFETY", "-o", "pan", "pan.c")
	start := time.Now()
	// -m: depth bound (the deepest path is under 1000 steps); -w22: a
	// hash table of 4M slots (32 MiB), for spaces of up to a few million
	// states.
	out = run(filepath.Join(dir, "pan"), "-m20000", "-w22")
	if m := statesRE.FindStringSubmatch(out); m != nil {
		states, _ = strconv.Atoi(m[1])
	}
	if m := elapsedRE.FindStringSubmatch(out); m != nil {
		took, _ = strconv.ParseFloat(m[1], 64)
	} else {
		took = time.Since(start).Seconds()
	}
	return out, states, took
}
