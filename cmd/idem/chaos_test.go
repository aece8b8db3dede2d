package main

import (
	"context"
	"encoding/json"
	"image/png"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testenv"
)

// chaosJSON runs idem chaos with args plus --json and returns the result
// and the figures.
func chaosJSON(t *testing.T, args ...string) (result, *chaosReport) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "chaos.json")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	res := idemRun(ctx, append([]string{"chaos", "--json", file}, args...)...)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("no JSON figures: %v\n%s", err, res)
	}
	var rep chaosReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("the JSON figures: %v\n%s", err, b)
	}
	return res, &rep
}

// TestChaos runs idem chaos on the embedded default, one policy at a
// time, with every fault, and checks its verdict and the figures behind
// it: each policy's guarantee holds, and the faults did happen.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("idem chaos runs worker processes for about 15 s per policy")
	}
	for _, p := range chaosPolicies {
		t.Run(p, func(t *testing.T) {
			res, rep := chaosJSON(t, "--policies", p, "--keys", "60", "--duration", "5s", "--seed", "7")
			if res.code != 0 {
				t.Fatalf("idem chaos: %s", res)
			}
			if len(rep.Policies) != 1 {
				t.Fatalf("%d policies in the figures, want 1", len(rep.Policies))
			}
			pr := rep.Policies[0]
			if !rep.OK || !pr.OK || pr.ViolationCount != 0 || pr.Keys != 60 || pr.Lost != 0 {
				t.Fatalf("figures: %+v", pr)
			}
			if !rep.Fused {
				t.Error("the embedded default ran unfused: the queue shares the store's file, so it should receive and claim in one commit")
			}
			kills := pr.FaultsInjected[faultKillBeforeEffect] + pr.FaultsInjected[faultKillAfterEffect] + pr.FaultsInjected[faultKillBeforeAck]
			if kills == 0 || pr.FaultsInjected[faultStoreCut] == 0 || pr.WorkersStarted <= 3 {
				t.Errorf("too few faults to prove anything: %v, %d workers started", pr.FaultsInjected, pr.WorkersStarted)
			}
			switch p {
			case "transactional", "reconcile":
				if pr.KeysWith1 != pr.Keys || pr.Duplicates != 0 {
					t.Errorf("%d of %d keys once, %d duplicates: want every key exactly once", pr.KeysWith1, pr.Keys, pr.Duplicates)
				}
			case "at_least_once":
				if pr.KeysWith0 != 0 {
					t.Errorf("%d keys without an effect", pr.KeysWith0)
				}
				if pr.DuplicateCauses["none: a live worker"] != 0 {
					t.Errorf("duplicates by live workers: %v", pr.DuplicateCauses)
				}
			case "at_most_once":
				if pr.KeysWith2 != 0 || pr.Duplicates != 0 {
					t.Errorf("%d keys with 2+ effects", pr.KeysWith2)
				}
				if pr.Indeterminate != pr.ListedStuck {
					t.Errorf("%d keys indeterminate, %d listed by ls --stuck", pr.Indeterminate, pr.ListedStuck)
				}
				if pr.KeysWith0 > pr.Indeterminate {
					t.Errorf("%d keys without an effect, only %d indeterminate", pr.KeysWith0, pr.Indeterminate)
				}
			}
			if !strings.Contains(res.stdout, p) || !strings.Contains(res.stdout, "kept") {
				t.Errorf("the table does not say the guarantee was kept:\n%s", res.stdout)
			}
		})
	}
}

// TestChaosUnfused runs the separate path (--fused=false: the queue's
// receive and ack apart from the ledger's claim and completion), with
// more handlers and synchronous=NORMAL, as the long runs do: the
// guarantees hold there too, and the figures say how the run was made.
func TestChaosUnfused(t *testing.T) {
	if testing.Short() {
		t.Skip("idem chaos runs worker processes")
	}
	res, rep := chaosJSON(t, "--fused=false", "--handlers", "16", "--synchronous", "normal", "--cut-every", "150ms",
		"--policies", "at_least_once,reconcile", "--keys", "60", "--duration", "5s", "--seed", "3")
	if res.code != 0 || !rep.OK {
		t.Fatalf("idem chaos --fused=false: %s", res)
	}
	if rep.Fused || rep.Handlers != 16 || rep.Sync != "normal" || rep.CutEvery != "150ms" {
		t.Errorf("figures: fused %t, %d handlers, synchronous %q, cut every %q; want false, 16, normal, 150ms", rep.Fused, rep.Handlers, rep.Sync, rep.CutEvery)
	}
	for _, pr := range rep.Policies {
		if pr.Lost != 0 || pr.KeysWith0 != 0 || pr.FaultsInjected[faultStoreCut] == 0 {
			t.Errorf("%s: %d lost, %d without an effect, faults %v", pr.Policy, pr.Lost, pr.KeysWith0, pr.FaultsInjected)
		}
		if pr.Policy == "reconcile" && (pr.KeysWith1 != pr.Keys || pr.Duplicates != 0) {
			t.Errorf("reconcile: %d of %d keys once, %d duplicates", pr.KeysWith1, pr.Keys, pr.Duplicates)
		}
	}
	for _, bad := range [][]string{{"--handlers", "0"}, {"--synchronous", "off"}, {"--cut-every", "1ms"}} {
		if res := idemRun(context.Background(), append([]string{"chaos"}, bad...)...); res.code != exitUsage || !strings.Contains(res.stderr, bad[0]) {
			t.Errorf("idem chaos %s: exit %d, want %d naming the flag\n%s", strings.Join(bad, " "), res.code, exitUsage, res)
		}
	}
}

// TestChaosCatchesABrokenLedger shows that the checker can fail: workers
// that skip the shared ledger (--broken-ledger) run a key's copies on
// several workers, and idem chaos must report duplicates and exit 1.
func TestChaosCatchesABrokenLedger(t *testing.T) {
	if testing.Short() {
		t.Skip("idem chaos runs worker processes")
	}
	res, rep := chaosJSON(t, "--broken-ledger", "--policies", "at_least_once,reconcile", "--faults", "none", "--keys", "60", "--duration", "3s")
	if res.code != exitError {
		t.Fatalf("exit %d, want %d: a broken ledger went unnoticed\n%s", res.code, exitError, res)
	}
	if rep.OK {
		t.Fatal("the figures say OK")
	}
	for _, pr := range rep.Policies {
		if pr.OK || pr.ViolationCount == 0 || pr.Duplicates == 0 || pr.KeysWith2 == 0 {
			t.Errorf("%s: want duplicates and violations: %+v", pr.Policy, pr)
		}
		if pr.DuplicateCauses["none: a live worker"] == 0 {
			t.Errorf("%s: no duplicate blamed on a live worker: %v", pr.Policy, pr.DuplicateCauses)
		}
	}
	if !strings.Contains(res.stdout, "BROKEN") || !strings.Contains(res.stderr, "a guarantee broke") {
		t.Errorf("the output does not say it broke:\n%s", res)
	}
}

// TestChaosReport writes the chart and the page from figures.
func TestChaosReport(t *testing.T) {
	dir := t.TempDir()
	rep := &chaosReport{Seed: 3, Keys: 10, Workers: 2, Duration: "5s", Faults: allChaosFaults, Policies: []*chaosPolicyReport{
		{Policy: "at_least_once", Keys: 10, KeysWith1: 8, KeysWith2: 2, Duplicates: 2, OK: true,
			DuplicateCauses: map[string]int{faultKillAfterEffect: 2}, FaultsInjected: map[string]int{faultKillAfterEffect: 2}},
		{Policy: "at_most_once", Keys: 10, KeysWith0: 1, KeysWith1: 9, Indeterminate: 2, ViolationCount: 1,
			Violations: []string{"chaos:1: <b>left</b>"}, IndeterminateWhy: map[string]int{faultStop: 2}},
	}}
	if err := writeChaosReport(dir, rep); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "chart.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("chart.png: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 800 || b.Dy() != 420 {
		t.Errorf("chart is %v", b)
	}
	// The upper panel's first bar has the red of the duplicated keys.
	red := false
	for y := range 420 {
		for x := range 400 {
			if r, g, b, _ := img.At(x, y).RGBA(); r>>8 == 200 && g>>8 == 40 && b>>8 == 40 {
				red = true
			}
		}
	}
	if !red {
		t.Error("no bar of keys with 2+ effects in the chart")
	}
	page, err := os.ReadFile(filepath.Join(dir, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a guarantee broke", "BROKEN (1)", "&lt;b&gt;left&lt;/b&gt;", "chart.png", "idem chaos --policies at_least_once,at_most_once --faults " + strings.Join(allChaosFaults, ",") + " --keys 10 --workers 2 --duration 5s"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("index.html lacks %q", want)
		}
	}
}

// TestChaosPostgres runs idem chaos on PostgreSQL (pgstore and sqlqueue
// in a schema of the run's own, pg_terminate_backend as the store cut),
// every policy at once, and checks that every guarantee held and that
// the run's schema is gone afterwards.
func TestChaosPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("idem chaos runs worker processes")
	}
	pg := testPostgres(t)
	res, rep := chaosJSON(t, "--store", pg, "--keys", "40", "--duration", "4s", "--seed", "11")
	if res.code != 0 || !rep.OK {
		t.Fatalf("idem chaos on PostgreSQL: %s", res)
	}
	if !strings.HasPrefix(rep.Target, "PostgreSQL") || strings.Contains(rep.Target, passwordOf(pg)) {
		t.Errorf("target %q", rep.Target)
	}
	for _, pr := range rep.Policies {
		if pr.FaultsInjected[faultStoreCut] == 0 {
			t.Errorf("%s: no connection terminated: %v", pr.Policy, pr.FaultsInjected)
		}
		if (pr.Policy == "transactional" || pr.Policy == "reconcile") && pr.KeysWith1 != pr.Keys {
			t.Errorf("%s: %d of %d keys exactly once", pr.Policy, pr.KeysWith1, pr.Keys)
		}
	}
	var left int
	if err := pgConnect(t).QueryRow(context.Background(), "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'idem_chaos_%'").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d idem_chaos_ schemas left behind", left)
	}
}

// passwordOf returns the password of a URL, or a string no target holds.
func passwordOf(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		if p, ok := u.User.Password(); ok && p != "" {
			return p
		}
	}
	return "\x00"
}

// TestChaosRedis runs idem chaos on Redis (redisstore under a key prefix
// of the run's own, sqlqueue in a SQLite file as the broker, CLIENT KILL
// as the store cut): every policy but transactional, which needs DoTx.
func TestChaosRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("idem chaos runs worker processes")
	}
	rd := testenv.Require(t, testenv.Redis, "idem chaos on Redis")
	res, rep := chaosJSON(t, "--store", rd, "--keys", "40", "--duration", "4s", "--seed", "13")
	if res.code != 0 || !rep.OK {
		t.Fatalf("idem chaos on Redis: %s", res)
	}
	if len(rep.Policies) != 3 {
		t.Errorf("%d policies, want 3 (all but transactional)", len(rep.Policies))
	}
	for _, pr := range rep.Policies {
		if pr.FaultsInjected[faultStoreCut] == 0 {
			t.Errorf("%s: no connection cut: %v", pr.Policy, pr.FaultsInjected)
		}
		if pr.Policy == "reconcile" && pr.KeysWith1 != pr.Keys {
			t.Errorf("%s: %d of %d keys exactly once", pr.Policy, pr.KeysWith1, pr.Keys)
		}
	}
	if res := idemRun(context.Background(), "--store", rd, "chaos", "--policies", "transactional"); res.code != exitUsage {
		t.Errorf("transactional on Redis: %s, want a usage error", res)
	}
}
