package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

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
	if line := chaosCommandLine(rep); !strings.Contains(line, "--handlers 16 --cut-every 150ms --synchronous normal --fused=false") {
		t.Errorf("the command that repeats the run leaves out its sizing: %s", line)
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
			Violations: []string{"chaos:1: <b>left</b>"}, IndeterminateWhy: map[string]int{faultStop: 2},
			Restart: &chaosRestartReport{Restarts: 2, Longest: "1.5s"}},
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
	for _, want := range []string{"a guarantee broke", "BROKEN (1)", "&lt;b&gt;left&lt;/b&gt;", "chart.png", "Store restarts", "<td>at_most_once</td><td>2</td><td>1.5s</td>", "--restart-store CMD", "idem chaos --policies at_least_once,at_most_once --faults " + strings.Join(allChaosFaults, ",") + " --keys 10 --workers 2 --duration 5s"} {
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
	// This process's schemas only: other runs may share the database.
	var left int
	if err := pgConnect(t).QueryRow(context.Background(), "SELECT count(*) FROM pg_namespace WHERE starts_with(nspname, $1)", fmt.Sprintf("idem_chaos_%d_", os.Getpid())).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d idem_chaos_%d_ schemas left behind", left, os.Getpid())
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

// TestChaosOutboxRelayKill runs idem chaos with the producer writing into
// an outbox and relay processes that kill themselves between a confirmed
// publish and the outbox ack: every killed relay's message is published
// again, the queue drops one such re-publish by its dedup id and delivers
// another, and the consumer's ledger absorbs it (every key still exactly
// once under transactional).
func TestChaosOutboxRelayKill(t *testing.T) {
	if testing.Short() {
		t.Skip("idem chaos runs worker and relay processes")
	}
	report := t.TempDir()
	res, rep := chaosJSON(t, "--policies", "at_least_once,transactional", "--faults", "outbox-relay-kill,kill-after-effect",
		"--keys", "40", "--duration", "3s", "--seed", "17", "--report", report)
	if res.code != 0 || !rep.OK {
		t.Fatalf("idem chaos: %s", res)
	}
	for _, pr := range rep.Policies {
		o := pr.Outbox
		if o == nil {
			t.Fatalf("%s: no outbox figures: %+v", pr.Policy, pr)
		}
		if o.RelayKills < 2 || pr.FaultsInjected[faultRelayKill] != o.RelayKills || o.RelaysStarted < 2+o.RelayKills {
			t.Errorf("%s: %d relay kills (%v injected), %d relays started: want at least 2 kills, each relay replaced", pr.Policy, o.RelayKills, pr.FaultsInjected, o.RelaysStarted)
		}
		if o.Republished < o.RelayKills || o.DedupedByTarget == 0 || o.Delivered == 0 || o.DedupedByTarget+o.Delivered != o.Republished {
			t.Errorf("%s: %d re-published (%d deduplicated, %d delivered) after %d kills: want each killed message again, both ways", pr.Policy, o.Republished, o.DedupedByTarget, o.Delivered, o.RelayKills)
		}
		if o.Written != pr.Messages || o.DeadLetters != 0 {
			t.Errorf("%s: %d written into the outbox, %d messages, %d outbox dead letters", pr.Policy, o.Written, pr.Messages, o.DeadLetters)
		}
		if pr.KeysWith0 != 0 || pr.DuplicateCauses["none: a live worker"] != 0 {
			t.Errorf("%s: %d keys lost, duplicates %v", pr.Policy, pr.KeysWith0, pr.DuplicateCauses)
		}
		if pr.Policy == "transactional" && (pr.KeysWith1 != pr.Keys || pr.Duplicates != 0) {
			t.Errorf("transactional: %d of %d keys exactly once", pr.KeysWith1, pr.Keys)
		}
	}
	if !strings.Contains(res.stdout, "RELAY KILLS") || !strings.Contains(res.stdout, "DELIVERED (LEDGER ABSORBED)") {
		t.Errorf("no outbox table:\n%s", res.stdout)
	}
	page, err := os.ReadFile(filepath.Join(report, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "Outbox relay kills") || !strings.Contains(string(page), "<th>delivered (ledger absorbed)</th>") {
		t.Error("index.html has no outbox table")
	}
}

// TestChaosRestartStoreFlag: the store-restart fault only with
// --restart-store, and that only with a store that has a server.
func TestChaosRestartStoreFlag(t *testing.T) {
	ctx := context.Background()
	if res := idemRun(ctx, "chaos", "--faults", "store-restart"); res.code != exitUsage || !strings.Contains(res.stderr, "--restart-store") {
		t.Errorf("store-restart without --restart-store: %s", res)
	}
	if res := idemRun(ctx, "chaos", "--restart-store", "true"); res.code != exitUsage || !strings.Contains(res.stderr, "embedded") {
		t.Errorf("--restart-store on the embedded store: %s", res)
	}
}

// privatePostgres starts a PostgreSQL server of the test's own (initdb
// and pg_ctl in a temporary directory, on a free port), which the test
// may restart without disturbing the shared one, and returns its URL and
// a shell command that restarts it. As root, the server runs as the user
// postgres (initdb refuses root).
func privatePostgres(t *testing.T) (url, restart string) {
	t.Helper()
	bin := os.Getenv(testenv.PostgresBin)
	if bin == "" {
		dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		slices.Sort(dirs)
		for _, d := range slices.Backward(dirs) {
			if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
				bin = d
				break
			}
		}
	}
	if bin == "" {
		t.Skip(testenv.SkipMessage(testenv.PostgresBin, "idem chaos's store-restart fault on a private PostgreSQL"))
	}
	// Not t.TempDir: the postgres user must reach it.
	dir, err := os.MkdirTemp("", "idem-chaos-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var as []string
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, and no postgres user to run PostgreSQL as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		as = []string{"runuser", "-u", "postgres", "--"}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	data, logf := filepath.Join(dir, "data"), filepath.Join(dir, "server.log")
	pgCmd := func(args ...string) {
		t.Helper()
		full := append(slices.Clone(as), args...)
		if out, err := exec.Command(full[0], full[1:]...).CombinedOutput(); err != nil {
			log, _ := os.ReadFile(logf)
			t.Fatalf("%s: %v\n%s\n%s", strings.Join(full, " "), err, out, log)
		}
	}
	pgCmd(filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
	// fsync off: a fast restart checkpoints first, so nothing is lost.
	pgCmd(filepath.Join(bin, "pg_ctl"), "-D", data, "-l", logf, "-w", "start",
		"-o", fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200", port, dir))
	t.Cleanup(func() {
		full := append(slices.Clone(as), filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
		_ = exec.Command(full[0], full[1:]...).Run()
	})
	restart = strings.Join(append(slices.Clone(as), filepath.Join(bin, "pg_ctl"), "-D", data, "-l", logf, "-m", "fast", "-w", "restart"), " ")
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port), restart
}

// TestChaosStoreRestart restarts a private PostgreSQL server, which
// holds the store, the queue and the outbox, twice per policy during the
// run (--restart-store), with relays killed between publish and ack on
// top: the workers and relays ride the restarts out, and every policy
// keeps its guarantee.
func TestChaosStoreRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("idem chaos runs worker processes and restarts a PostgreSQL server")
	}
	pg, restart := privatePostgres(t)
	res, rep := chaosJSON(t, "--store", pg, "--restart-store", restart, "--faults", "store-restart,outbox-relay-kill",
		"--keys", "40", "--duration", "6s", "--seed", "19")
	if res.code != 0 || !rep.OK {
		t.Fatalf("idem chaos with store restarts: %s", res)
	}
	if len(rep.Policies) != len(chaosPolicies) {
		t.Fatalf("%d policies, want %d", len(rep.Policies), len(chaosPolicies))
	}
	for _, pr := range rep.Policies {
		if pr.Restart == nil || pr.Restart.Restarts == 0 || pr.Restart.Failed != 0 || pr.FaultsInjected[faultStoreRestart] != pr.Restart.Restarts {
			t.Errorf("%s: restarts %+v, faults %v: want at least one, none failed", pr.Policy, pr.Restart, pr.FaultsInjected)
		}
		if pr.Outbox == nil || pr.Outbox.RelayKills == 0 || pr.Outbox.Republished < pr.Outbox.RelayKills {
			t.Errorf("%s: outbox %+v", pr.Policy, pr.Outbox)
		}
		if pr.KeysWith0 != 0 || pr.KeysWith2 != 0 || pr.Lost != 0 {
			// No worker was killed or frozen: every policy, at_most_once
			// too, does every key exactly once through the restarts.
			t.Errorf("%s: %d keys without an effect, %d with 2+, %d lost", pr.Policy, pr.KeysWith0, pr.KeysWith2, pr.Lost)
		}
	}
	if !strings.Contains(res.stdout, "STORE RESTARTS") {
		t.Errorf("no restart table:\n%s", res.stdout)
	}
}

// TestChaosStoreRestartRedis restarts a private Redis server (append-only
// file, fsync always: the data survives a restart), which holds the store,
// twice per policy during the run: the workers ride the restarts out.
func TestChaosStoreRestartRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("idem chaos runs worker processes and restarts a Redis server")
	}
	server, err := exec.LookPath("redis-server")
	if err != nil {
		// CI installs redis-server with the Redis it names: there the
		// binary's absence is a failure, not a skip.
		testenv.Require(t, testenv.Redis, "idem chaos's store-restart fault on a private Redis server")
		t.Fatalf("%s is set but redis-server is not on PATH: %v", testenv.Redis, err)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-server without redis-cli: %v", err)
	}
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	start := fmt.Sprintf("%s --bind 127.0.0.1 --port %d --appendonly yes --appendfsync always --save '' --dir %s --daemonize yes --logfile %s/server.log",
		server, port, dir, dir)
	ping := fmt.Sprintf("until %s -p %d ping >/dev/null 2>&1; do sleep 0.05; done", cli, port)
	if out, err := exec.Command("/bin/sh", "-c", start+" && "+ping).CombinedOutput(); err != nil {
		t.Fatalf("starting redis-server: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(cli, "-p", strconv.Itoa(port), "shutdown", "nosave").Run() })
	restart := fmt.Sprintf("%s -p %d shutdown; %s && %s", cli, port, start, ping)
	res, rep := chaosJSON(t, "--store", fmt.Sprintf("redis://127.0.0.1:%d/0", port), "--restart-store", restart,
		"--faults", "store-restart,outbox-relay-kill", "--keys", "40", "--duration", "6s", "--seed", "23")
	if res.code != 0 || !rep.OK {
		t.Fatalf("idem chaos with Redis restarts: %s", res)
	}
	for _, pr := range rep.Policies {
		if pr.Restart == nil || pr.Restart.Restarts == 0 || pr.Restart.Failed != 0 {
			t.Errorf("%s: restarts %+v: want at least one, none failed", pr.Policy, pr.Restart)
		}
		if pr.KeysWith0 != 0 || pr.KeysWith2 != 0 || pr.Lost != 0 {
			t.Errorf("%s: %d keys without an effect, %d with 2+, %d lost", pr.Policy, pr.KeysWith0, pr.KeysWith2, pr.Lost)
		}
	}
}

// checkChaosTarget checks a short run on a store and a broker: exit 0,
// every guarantee kept, every fault kind fired (in one policy at least:
// under at_most_once a short-visibility key may never reach its handler,
// left indeterminate by another key's kill), and in every policy the
// connection faults broke store connections (when the store has a fault)
// and broker connections (when the broker is apart from the store).
func checkChaosTarget(t *testing.T, res result, rep *chaosReport, target string, policies int, storeCuts, brokerCuts bool) {
	t.Helper()
	if res.code != 0 || !rep.OK {
		t.Fatalf("idem chaos on %s: %s", target, res)
	}
	if !strings.HasPrefix(rep.Target, target) {
		t.Errorf("target %q, want it to begin with %q", rep.Target, target)
	}
	if len(rep.Policies) != policies {
		t.Fatalf("%d policies, want %d", len(rep.Policies), policies)
	}
	fired := map[string]int{}
	for _, pr := range rep.Policies {
		for f, n := range pr.FaultsInjected {
			fired[f] += n
		}
	}
	if !slices.Equal(rep.Faults, defaultChaosFaults) {
		t.Errorf("faults %v, want the default %v", rep.Faults, defaultChaosFaults)
	}
	for _, f := range rep.Faults {
		if fired[f] == 0 {
			t.Errorf("no %s fault in the run", f)
		}
	}
	for _, pr := range rep.Policies {
		if pr.FaultsInjected[faultStoreCut] == 0 {
			t.Errorf("%s: no store-cut fault: %v", pr.Policy, pr.FaultsInjected)
		}
		if !pr.OK || pr.ViolationCount != 0 || pr.Lost != 0 {
			t.Errorf("%s: %+v", pr.Policy, pr)
		}
		if storeCuts && pr.ConnectionCuts["store"] == 0 {
			t.Errorf("%s: no store connection broken: %v", pr.Policy, pr.ConnectionCuts)
		}
		if brokerCuts && pr.ConnectionCuts["broker"] == 0 {
			t.Errorf("%s: no broker connection broken: %v", pr.Policy, pr.ConnectionCuts)
		}
		if (pr.Policy == "transactional" || pr.Policy == "reconcile") && (pr.KeysWith1 != pr.Keys || pr.Duplicates != 0) {
			t.Errorf("%s: %d of %d keys exactly once", pr.Policy, pr.KeysWith1, pr.Keys)
		}
	}
}

// chaosShort is a short run: few keys, and a duration that lets the stop
// fault (every 3-5 s) fire.
var chaosShort = []string{"--keys", "40", "--duration", "6s", "--seed", "17"}

// chaosName is the name a run of this process gives policy's own schema,
// stream, queue or table (chaosTargetFor).
func chaosName(format, policy string) string {
	return fmt.Sprintf(format, os.Getpid(), strings.ReplaceAll(policy, "_", ""))
}

// awsTestEnv points the AWS SDK's chain at test credentials and nothing
// else (the workers inherit them).
func awsTestEnv(t *testing.T) {
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "idemtest", "AWS_SECRET_ACCESS_KEY": "idemtest", "AWS_SESSION_TOKEN": "",
		"AWS_PROFILE": "", "AWS_REGION": "", "AWS_CONFIG_FILE": "/nonexistent/idemtest",
		"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/idemtest", "AWS_EC2_METADATA_DISABLED": "true",
	} {
		t.Setenv(k, v)
	}
}

// chaosAWSTest opens a chaos test on an AWS service (testenv's name):
// it skips under -short, requires the service's endpoint, gives the test
// the AWS environment of awsTestEnv, and returns the endpoint and the
// prefix of the run's queues or tables.
func chaosAWSTest(t *testing.T, name, suite string) (ep, prefix string) {
	t.Helper()
	if testing.Short() {
		t.Skip("idem chaos runs worker processes")
	}
	ep = testenv.Require(t, name, suite)
	awsTestEnv(t)
	return ep, "idemchaost" + strconv.Itoa(os.Getpid())
}

// TestChaosJetStream runs idem chaos with the embedded store and
// JetStream as the broker (a stream per policy, its connections cut at
// the harness's proxy); transactional runs, the store having DoTx. The
// run's streams are gone afterwards.
func TestChaosJetStream(t *testing.T) {
	if testing.Short() {
		t.Skip("idem chaos runs worker processes")
	}
	nu := testenv.Require(t, testenv.NATS, "idem chaos on JetStream")
	policies := []string{"at_least_once", "transactional"}
	res, rep := chaosJSON(t, append([]string{"--queue", nu, "--policies", strings.Join(policies, ",")}, chaosShort...)...)
	checkChaosTarget(t, res, rep, "embedded: sqlitestore + JetStream", 2, true, true)
	nc, err := nats.Connect(nu)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := njs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range policies {
		name := chaosName("IDEMCHAOS_%d_%s", strings.ToUpper(p))
		for _, s := range []string{name, name + "_DL"} {
			if _, err := js.Stream(context.Background(), s); !errors.Is(err, njs.ErrStreamNotFound) {
				t.Errorf("stream %s left behind (%v)", s, err)
			}
		}
	}
}

// TestChaosRabbitMQ runs idem chaos on PostgreSQL with RabbitMQ as the
// broker (a queue per policy; the store's connections terminated, the
// broker's cut at the proxy). The run's queues are gone afterwards.
func TestChaosRabbitMQ(t *testing.T) {
	if testing.Short() {
		t.Skip("idem chaos runs worker processes")
	}
	au := testenv.Require(t, testenv.AMQP, "idem chaos on RabbitMQ")
	pg := testPostgres(t)
	policies := []string{"at_most_once", "transactional"}
	res, rep := chaosJSON(t, append([]string{"--store", pg, "--queue", au, "--policies", strings.Join(policies, ",")}, chaosShort...)...)
	checkChaosTarget(t, res, rep, "PostgreSQL: pgstore", 2, true, true)
	if !strings.Contains(rep.Target, "RabbitMQ") || strings.Contains(rep.Target, "guest:guest") {
		t.Errorf("target %q", rep.Target)
	}
	conn, err := amqp.Dial(au)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, p := range policies {
		name := chaosName("idemchaos-%d-%s", p)
		for _, q := range []string{name, name + ".dead-letter", name + ".delay.64ms"} {
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
			var ae *amqp.Error
			if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
				t.Errorf("queue %s left behind (%v)", q, err)
				ch.Close()
			}
		}
	}
}

// TestChaosSQS runs idem chaos with the embedded store and SQS
// (local-aws-sqs) as the broker, named sqs://PREFIX?region=R&endpoint=URL:
// a queue and a dead-letter queue per policy, deleted at the end.
func TestChaosSQS(t *testing.T) {
	ep, prefix := chaosAWSTest(t, testenv.SQS, "idem chaos on SQS")
	res, rep := chaosJSON(t, append([]string{"--queue", "sqs://" + prefix + "?region=us-east-1&endpoint=" + ep,
		"--policies", "at_least_once,reconcile"}, chaosShort...)...)
	checkChaosTarget(t, res, rep, "embedded: sqlitestore + SQS", 2, true, true)
	c, err := sqsClient(context.Background(), "sqs://x?region=us-east-1", ep)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.ListQueues(context.Background(), &sqs.ListQueuesInput{QueueNamePrefix: aws.String(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.QueueUrls) != 0 {
		t.Errorf("queues left behind: %v", out.QueueUrls)
	}
}

// TestChaosDynamoDB runs idem chaos on DynamoDB (dynalite: a table per
// policy, the workers' HTTP connections cut at the proxy) with sqlqueue
// in a SQLite file as the broker: every policy but transactional, which
// needs DoTx. The run's tables are gone afterwards.
func TestChaosDynamoDB(t *testing.T) {
	ep, prefix := chaosAWSTest(t, testenv.DynamoDB, "idem chaos on DynamoDB")
	st := "dynamodb://" + prefix + "?region=us-east-1&endpoint=" + ep
	res, rep := chaosJSON(t, append([]string{"--store", st, "--policies", "at_least_once,at_most_once"}, chaosShort...)...)
	checkChaosTarget(t, res, rep, "DynamoDB: dynamostore", 2, true, true)
	client := dynamodb.New(dynamodb.Options{Region: "us-east-1", BaseEndpoint: aws.String(ep),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "idemtest", SecretAccessKey: "idemtest"}, nil
		})})
	out, err := client.ListTables(context.Background(), &dynamodb.ListTablesInput{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range out.TableNames {
		if strings.HasPrefix(name, prefix) {
			t.Errorf("table %s left behind", name)
		}
	}
	if res := idemRun(context.Background(), "--store", st, "chaos", "--policies", "transactional"); res.code != exitUsage {
		t.Errorf("transactional on DynamoDB: %s, want a usage error", res)
	}
}

// TestChaosPostgresQueue runs idem chaos on Redis with sqlqueue on
// PostgreSQL as the broker (a schema per policy; CLIENT KILL and
// pg_terminate_backend). The run's schemas are gone afterwards.
func TestChaosPostgresQueue(t *testing.T) {
	if testing.Short() {
		t.Skip("idem chaos runs worker processes")
	}
	rd := testenv.Require(t, testenv.Redis, "idem chaos on Redis")
	pg := testPostgres(t)
	res, rep := chaosJSON(t, append([]string{"--store", rd, "--queue", pg, "--policies", "reconcile"}, chaosShort...)...)
	checkChaosTarget(t, res, rep, "Redis: redisstore", 1, true, true)
	if !strings.Contains(rep.Target, "sqlqueue on PostgreSQL") {
		t.Errorf("target %q", rep.Target)
	}
	var left int
	if err := pgConnect(t).QueryRow(context.Background(), "SELECT count(*) FROM pg_namespace WHERE nspname = $1", chaosName("idem_chaos_q_%d_%s", "reconcile")).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("the run's queue schema was left behind")
	}
}

// TestCutOffAttempts: the checker finds, in the workers' log as the
// ledger writes it, the attempts whose live worker could not reach the
// store (a lost lease, or a closing write the store did not take), and
// not the claims that failed, which ran no fn.
func TestCutOffAttempts(t *testing.T) {
	log := filepath.Join(t.TempDir(), "worker.log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	// Written as the workers write them: slog's JSON handler, with the
	// ledger's attributes.
	lg := slog.New(slog.NewJSONHandler(f, nil)).With("pid", 25714)
	lg.Warn("idem lease-lost", "key", "chaos:31", "outcome", "lease-lost", "fence", 1796234349662324, "attempt", 1,
		"attempt_id", "heSNoLxD3Rwbm_FWAfWl7A", "error", "idem: lease lost: the lease ran out before the store granted an extension")
	lg.Error("idem store-error", "key", "chaos:32", "outcome", "store-error", "attempt_id", "Zm9vYmFyYmF6cXV4cXV1eA", "op", "complete",
		"error", "sqlitestore: begin: database is locked (5) (SQLITE_BUSY)")
	lg.Error("idem store-error", "key", "chaos:33", "outcome", "store-error", "attempt_id", "cmVsZWFzZXJlbGVhc2VyZQ", "op", "release",
		"error", strings.Repeat("a long error ", 200000)) // 2.6 MB: past any fixed line buffer
	// Not cut off: a claim's store-error (without an attempt, and with
	// one), a takeover, and an error whose text holds what a field would.
	lg.Error("idem store-error", "key", "chaos:21", "outcome", "store-error", "op", "claim", "error", "database is locked")
	lg.Error("idem store-error", "key", "chaos:22", "outcome", "store-error", "attempt_id", "Y2xhaW1jbGFpbWNsYWltY2w", "op", "claim", "error", "connection reset")
	lg.Warn("idem takeover", "key", "chaos:31", "outcome", "takeover", "attempt_id", "dGFrZW92ZXJ0YWtlb3Zlcg")
	lg.Warn("idem retried", "key", "chaos:40", "outcome", "retried", "attempt_id", "cmV0cmllZHJldHJpZWRyZQ",
		"error", `upstream said outcome=lease-lost attempt_id=EVIL "outcome":"lease-lost","attempt_id":"EVIL"`)
	fmt.Fprintln(f, "panic: a worker's last words, not JSON")
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := cutOffAttempts(log)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"heSNoLxD3Rwbm_FWAfWl7A": chaosLeaseLost,
		"Zm9vYmFyYmF6cXV4cXV1eA": chaosNotRecorded,
		"cmVsZWFzZXJlbGVhc2VyZQ": chaosNotRecorded,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("cut-off attempts %v, want %v", got, want)
	}
	if got, err := cutOffAttempts(filepath.Join(t.TempDir(), "none.log")); err != nil || len(got) != 0 {
		t.Fatalf("no log: %v, %v; want none, nil", got, err)
	}
}
