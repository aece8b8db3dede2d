package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/explain"
	"github.com/idemkit/idem/cmd/idem/internal/storeurl"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// clock is a fake store clock tests move by hand.
type clock struct {
	mu    sync.Mutex
	t     time.Time
	onSet func(time.Time) // if set, called with the new time by Advance (under mu)
}

// t0 is where a new fake clock starts.
var t0 = time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC)

func newClock() *clock { return &clock{t: t0} }

// fenceAt is the fence of a record's first claim at t on a store that
// never had that key (store.FirstFence): the clock in microseconds. Each
// later claim (a takeover, a claim after expiry) or resolve of the record
// adds 1. So the fixture's records claimed at t0 have fence fenceAt(t0).
func fenceAt(t time.Time) int64 { return t.UnixMicro() }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	if c.onSet != nil {
		c.onSet(c.t)
	}
}

// backend makes a store on a fake clock for the command tests. open returns
// the store and the --store URL the commands open it by, or "" for a
// mem:NAME alias of the store.
type backend struct {
	name string
	open func(t *testing.T, clk *clock) (store.Store, string)
}

// backends are the stores the command tests run on. A backend whose
// server is not configured skips the test (see postgres_test.go).
func backends() []backend {
	return []backend{{"mem", openMem}, {"sqlite", openSQLite}, {"postgres", openPostgres}}
}

func openMem(t *testing.T, clk *clock) (store.Store, string) {
	return memstore.New(memstore.WithClock(clk.Now)), ""
}

// env is one store under test, reachable by the commands as --store URL.
type env struct {
	t      *testing.T
	store  store.Store
	clk    *clock
	url    string
	stores *storeurl.Openers // the commands' openers, holding the mem:NAME alias

	attempts map[string]string // key/fence → the attempt id e.claim made
}

func newEnv(t *testing.T, b backend) *env {
	t.Helper()
	clk := newClock()
	s, url := b.open(t, clk)
	t.Cleanup(func() { s.Close() })
	stores := storeurl.New()
	if url == "" {
		url = "mem:test"
		stores.SetMem("test", s)
	}
	return &env{t: t, store: s, clk: clk, url: url, stores: stores}
}

type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// idemRun runs the command as a process of its own does.
func idemRun(ctx context.Context, args ...string) result {
	return runWith(ctx, storeurl.New(), args...)
}

// runWith runs the command with stores, which may hold stores of earlier
// runs (mem:NAME).
func runWith(ctx context.Context, stores *storeurl.Openers, args ...string) result {
	var out, errb bytes.Buffer
	code := run(ctx, stores, args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

// run runs the command on e's store.
func (e *env) run(args ...string) result {
	e.t.Helper()
	return runWith(context.Background(), e.stores, append([]string{"--store", e.url}, args...)...)
}

func (r result) expect(t *testing.T, code int, stdout ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %s", code, r)
	}
	for _, s := range stdout {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("stdout lacks %q:\n%s", s, r)
		}
	}
}

func (r result) expectErr(t *testing.T, code int, stderr ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %s", code, r)
	}
	for _, s := range stderr {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("stderr lacks %q:\n%s", s, r)
		}
	}
}

const (
	lease     = 10 * time.Second
	retention = time.Hour
)

func (e *env) claim(key string, p idem.Policy, owner string, l time.Duration) int64 {
	e.t.Helper()
	res, err := e.store.Claim(context.Background(), store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key, Owner: owner, Correlation: "msg-" + owner, Policy: p, Lease: l, Retention: retention})
	if err != nil || !res.Acquired {
		e.t.Fatalf("claim %s: %v %+v", key, err, res)
	}
	if e.attempts == nil {
		e.attempts = map[string]string{}
	}
	e.attempts[fmt.Sprintf("%s/%d", key, res.Record.Fence)] = res.Record.AttemptID
	return res.Record.Fence
}

// attempt is the id of the attempt e.claim made that holds key at fence.
func (e *env) attempt(key string, fence int64) string {
	e.t.Helper()
	id, ok := e.attempts[fmt.Sprintf("%s/%d", key, fence)]
	if !ok {
		e.t.Fatalf("no claim of %s at fence %d", key, fence)
	}
	return id
}

func (e *env) complete(key string, fence int64, result string, ret time.Duration) {
	e.t.Helper()
	if err := e.store.Finish(context.Background(), store.FinishRequest{Key: key, Fence: fence, AttemptID: e.attempt(key, fence), Outcome: store.OutcomeCompleted, Result: []byte(result), Retention: ret}); err != nil {
		e.t.Fatalf("complete %s: %v", key, err)
	}
}

func (e *env) get(key string) idem.Record {
	e.t.Helper()
	r, err := e.store.Get(context.Background(), key)
	if err != nil {
		e.t.Fatalf("get %s: %v", key, err)
	}
	return r
}

// fixture fills e with one record in each state, plus the journals the
// explain verdicts need. Afterwards the clock is at t0+1m.
//
//	done       completed, result "ses-1"
//	running    in_progress, lease live
//	lapsed     in_progress past its lease, at_least_once
//	indet      in_progress past its lease, at_most_once
//	failed     failed permanently
//	released   released
//	crash      attempt 1 lapsed, attempt 2 took over and completed
//	overlap    as crash, and attempt 1 finished late
//	expired    completed, expired after a minute, claimed again and completed
//	short      completed with a retention of 30s: expired at the end
func (e *env) fixture() {
	ctx := context.Background()
	e.t.Helper()
	f := e.claim("expired", idem.AtLeastOnce, "w1", lease)
	e.complete("expired", f, "ses-e1", 30*time.Second)
	f = e.claim("done", idem.AtLeastOnce, "w1", lease)
	e.complete("done", f, "ses-1", retention)
	f = e.claim("short", idem.AtLeastOnce, "w1", lease)
	e.complete("short", f, "ses-s", 30*time.Second)
	e.claim("lapsed", idem.AtLeastOnce, "w1", time.Second)
	e.claim("indet", idem.AtMostOnce, "w1", time.Second)
	e.claim("crash", idem.AtLeastOnce, "w1", time.Second)
	f1 := e.claim("overlap", idem.AtLeastOnce, "w1", time.Second)
	f = e.claim("failed", idem.AtLeastOnce, "w1", lease)
	if err := e.store.Finish(ctx, store.FinishRequest{Key: "failed", Fence: f, AttemptID: e.attempt("failed", f), Outcome: store.OutcomeFailed, Reason: "card declined", Retention: retention}); err != nil {
		e.t.Fatal(err)
	}
	f = e.claim("released", idem.AtLeastOnce, "w1", lease)
	if err := e.store.Finish(ctx, store.FinishRequest{Key: "released", Fence: f, AttemptID: e.attempt("released", f), Outcome: store.OutcomeReleased, Reason: "smtp: connection refused"}); err != nil {
		e.t.Fatal(err)
	}
	e.clk.Advance(2 * time.Second)
	f = e.claim("crash", idem.AtLeastOnce, "w2", lease)
	e.complete("crash", f, "ses-c2", retention)
	f2 := e.claim("overlap", idem.AtLeastOnce, "w2", lease)
	e.clk.Advance(time.Second)
	if err := e.store.Finish(ctx, store.FinishRequest{Key: "overlap", Fence: f1, AttemptID: e.attempt("overlap", f1), Outcome: store.OutcomeCompleted, Result: []byte("late"), Retention: retention}); !errors.Is(err, idem.ErrLeaseLost) {
		e.t.Fatalf("late complete: %v", err)
	}
	e.complete("overlap", f2, "ses-o2", retention)
	e.clk.Advance(57 * time.Second) // t0+1m: "expired" and "short" have expired
	f = e.claim("expired", idem.AtLeastOnce, "w2", lease)
	e.complete("expired", f, "ses-e2", retention)
	e.claim("running", idem.AtLeastOnce, "w3", time.Hour)
}

func forEachBackend(t *testing.T, f func(t *testing.T, e *env)) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b)
			e.fixture()
			f(t, e)
		})
	}
}

func TestHelp(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		r := idemRun(ctx, args...)
		r.expect(t, 0, "Usage:", "idem [--store URL] COMMAND", "Exit codes:", "4    refused because the key's lease is live (use --force)", "--store URL",
			"Stores:", "sqlite:PATH, sqlite://PATH", "postgres://USER:PASSWORD@HOST:PORT/DB", "idem_table=T", "postgresql://", "mem:")
		for _, c := range allCommands() {
			if !strings.Contains(r.stdout, "  "+c.name+" ") {
				t.Errorf("%v: top-level help lacks command %s", args, c.name)
			}
		}
	}
	for _, c := range allCommands() {
		for _, args := range [][]string{{c.name, "--help"}, {c.name, "-h"}, {"help", c.name}, {"--store", "mem:", c.name, "--help"}} {
			r := idemRun(ctx, args...)
			r.expect(t, 0, "Usage: idem [--store URL] "+c.name, "Flags:", "--store URL", "Exit codes:")
			if r.stderr != "" {
				t.Errorf("%v: stderr %q", args, r.stderr)
			}
		}
	}
	// Flags of each command appear in its help.
	for cmd, flags := range map[string][]string{
		"inspect": {"--json"},
		"ls":      {"--status S", "--stuck", "--indeterminate", "--prefix P", "--updated-after T", "--updated-before T", "--limit N", "--after KEY", "--json"},
		"release": {"--fence N", "--force", "--reason TEXT"},
		"resolve": {"--done", "--not-done", "--result STRING", "--result-file F", "--retention D", "--fence N", "--force", "--reason TEXT"},
		"delete":  {"--force"},
		"sweep":   {"--batch N", "(default 1000)"},
		"explain": {"--json"},
		"demo":    {"--orders N", "--seed N", "--lease D", "idem-demo.db"},
		"version": {"--json"},
		"serve":   {"--listen ADDR", "(default 127.0.0.1:7070)", "--token-file PATH", "--max-body BYTES", "(default 1048576)", "--hash-keys", "--metrics"},
	} {
		idemRun(ctx, "help", cmd).expect(t, 0, flags...)
	}
}

func TestUsageErrors(t *testing.T) {
	ctx := context.Background()
	idemRun(ctx).expectErr(t, 2, "Usage:")
	idemRun(ctx, "frobnicate").expectErr(t, 2, `unknown command "frobnicate"`)
	idemRun(ctx, "help", "frobnicate").expectErr(t, 2, `unknown command "frobnicate"`)
	idemRun(ctx, "--bogus", "ls").expectErr(t, 2, "flag provided but not defined: -bogus")
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"inspect"}, "missing KEY"},
		{[]string{"inspect", "a", "b"}, "takes one KEY"},
		{[]string{"explain"}, "missing KEY"},
		{[]string{"release"}, "missing KEY"},
		{[]string{"delete"}, "missing KEY"},
		{[]string{"delete", "a", "b"}, "takes one KEY"},
		{[]string{"ls", "--bogus"}, "flag provided but not defined"},
		{[]string{"ls", "extra"}, "takes no arguments"},
		{[]string{"ls", "--status", "weird"}, `unknown --status "weird"`},
		{[]string{"ls", "--stuck", "--status", "completed"}, "cannot be combined"},
		{[]string{"ls", "--limit", "-1"}, "--limit must be"},
		{[]string{"resolve", "k"}, "--done or --not-done"},
		{[]string{"resolve", "k", "--done", "--not-done"}, "--done or --not-done"},
		{[]string{"resolve", "k", "--not-done", "--result", "x"}, "go with --done"},
		{[]string{"resolve", "k", "--done", "--result", "x", "--result-file", "f"}, "exclusive"},
		{[]string{"resolve", "k", "--done", "--retention", "soon"}, "invalid duration"},
		{[]string{"sweep", "--batch", "0"}, "--batch must be at least 1"},
		{[]string{"demo", "--orders", "3"}, "--orders must be at least 7"},
	} {
		r := idemRun(ctx, append([]string{"--store", "mem:"}, tc.args...)...)
		r.expectErr(t, 2, tc.msg, "--help' for usage")
	}
	idemRun(ctx, "--store", "ftp://host/x", "ls").expectErr(t, 2, `unknown store scheme "ftp"`)
	idemRun(ctx, "--store", "idem.db", "ls").expectErr(t, 2, "no scheme")
	r := idemRun(ctx, "--store", "mongodb://u:pw@h/0", "ls")
	r.expectErr(t, 2, `store "mongodb://u:xxxxx@h/0": unknown store scheme "mongodb" (available: dynamodb, mem, postgres, postgresql, redis, rediss, sqlite)`)
	if strings.Contains(r.stderr, "pw") {
		t.Errorf("the password is printed:\n%s", r)
	}
}

func TestStoreFromEnvironment(t *testing.T) {
	e := newEnv(t, backends()[0])
	e.fixture()
	t.Setenv("IDEM_STORE", e.url)
	runWith(context.Background(), e.stores, "inspect", "done").expect(t, 0, "ses-1")
	// The flag wins over the environment, before or after the command.
	runWith(context.Background(), e.stores, "inspect", "done", "--store", "mem:").expectErr(t, 3, "no record")
	runWith(context.Background(), e.stores, "--store", "mem:", "inspect", "done").expectErr(t, 3, "no record")
}

func TestMissingStoreFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.db")
	t.Chdir(t.TempDir())
	t.Setenv("IDEM_STORE", "")
	idemRun(context.Background(), "--store", "sqlite:"+path, "ls").expectErr(t, 1, "no database file "+path)
	if _, err := os.Stat(path); err == nil {
		t.Errorf("ls created %s", path)
	}
	// The default store is sqlite:idem.db in the working directory.
	idemRun(context.Background(), "ls").expectErr(t, 1, "no database file idem.db")
}

func TestInspect(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f0 := fenceAt(t0) // "done", claimed at t0; "crash" took over at f0+1
		r := e.run("inspect", "done")
		r.expect(t, 0, "key          done", "status       completed", "state        completed", "policy       at_least_once",
			fmt.Sprintf("fence        %d\n", f0), "attempt      1", "owner        w1", `result       "ses-1" (5 bytes)`, "expires at", "created", "updated",
			"journal (oldest first, times UTC on 2025-06-01)", "ATTEMPT  FENCE             POLICY         OWNER  CORRELATION",
			fmt.Sprintf("  1        %d  at_least_once  w1", f0), "completed")

		e.run("inspect", "lapsed").expect(t, 0, "status       in_progress", "lapsed, next claim takes over", "passed")
		e.run("inspect", "indet").expect(t, 0, "status       in_progress", "indeterminate", "waiting for `idem resolve`", "at_most_once")
		e.run("inspect", "running").expect(t, 0, "state        in_progress", "live, ends in 1h", "(running or unknown)")
		e.run("inspect", "failed").expect(t, 0, "status       failed", "reason       card declined")
		e.run("inspect", "crash").expect(t, 0, "takeover", "lapsed", fmt.Sprintf("fence        %d\n", f0+1), "attempt      2")
		e.run("inspect", "overlap").expect(t, 0, "still running at 10:00:03.000 after a takeover")
		e.run("inspect", "expired").expect(t, 0, "after expiry")

		// Flags after the key; JSON with the journal and the result in base64.
		r = e.run("inspect", "crash", "--json")
		r.expect(t, 0)
		var j struct {
			Key, Status, State, Policy string
			Fence                      int64
			Result                     []byte
			ResultSize                 int `json:"result_size"`
			Journal                    []struct {
				Attempt  int
				Outcome  string
				Takeover bool
			}
		}
		if err := json.Unmarshal([]byte(r.stdout), &j); err != nil {
			t.Fatalf("%v\n%s", err, r.stdout)
		}
		if j.Key != "crash" || j.Status != "completed" || j.State != "completed" || j.Fence != f0+1 || string(j.Result) != "ses-c2" || j.ResultSize != 6 ||
			len(j.Journal) != 2 || j.Journal[0].Outcome != "lapsed" || !j.Journal[1].Takeover {
			t.Errorf("unexpected JSON: %+v\n%s", j, r.stdout)
		}
		if !strings.Contains(r.stdout, `"result": "c2VzLWMy"`) {
			t.Errorf("result not in base64:\n%s", r.stdout)
		}
		e.run("inspect", "indet", "--json").expect(t, 0, `"state": "indeterminate"`, `"policy": "at_most_once"`)

		e.run("inspect", "nope").expectErr(t, 3, `no record for "nope"`)
		e.run("inspect", "short").expectErr(t, 3, "no record") // expired counts as absent
	})
}

func TestLs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		r := e.run("ls")
		r.expect(t, 0, "KEY", "STATE", "FENCE", "ATTEMPT", "OWNER", "UPDATED", "EXPIRES")
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		var keys []string
		for _, l := range lines[1:] {
			keys = append(keys, strings.Fields(l)[0])
		}
		want := []string{"crash", "done", "expired", "failed", "indet", "lapsed", "overlap", "released", "running"}
		if strings.Join(keys, ",") != strings.Join(want, ",") {
			t.Errorf("ls keys = %v, want %v (expired records are not listed)\n%s", keys, want, r.stdout)
		}
		f0 := fenceAt(t0) // "indet" and "lapsed" were claimed once, at t0
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^indet\s+indeterminate\s+%d\s+1\s+w1\s+`, f0)).MatchString(r.stdout) {
			t.Errorf("indet line wrong:\n%s", r.stdout)
		}
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^lapsed\s+lapsed\s+%d\s+1\s+w1\s+1m ago\s+in 59m`, f0)).MatchString(r.stdout) {
			t.Errorf("lapsed line wrong:\n%s", r.stdout)
		}

		r = e.run("ls", "--stuck")
		r.expect(t, 0, "indet", "lapsed")
		if n := strings.Count(strings.TrimSpace(r.stdout), "\n"); n != 2 {
			t.Errorf("--stuck listed %d records:\n%s", n, r.stdout)
		}
		r = e.run("ls", "--status", "indeterminate")
		if !strings.Contains(r.stdout, "indet") || strings.Contains(r.stdout, "lapsed ") {
			t.Errorf("--status indeterminate:\n%s", r)
		}
		// in_progress as the STATE column shows it: a live lease only.
		r = e.run("ls", "--status", "in_progress")
		r.expect(t, 0, "running")
		for _, k := range []string{"indet", "lapsed", "done"} {
			if strings.Contains(r.stdout, k) {
				t.Errorf("--status in_progress lists %s:\n%s", k, r)
			}
		}
		e.run("ls", "--status", "in_progress", "--stuck").expectErr(t, 2, "cannot be combined with --status in_progress")
		e.run("ls", "--status", "lapsed", "--stuck").expect(t, 0, "lapsed")
		e.run("ls", "--status", "failed").expect(t, 0, "failed  failed")
		e.run("ls", "--status", "released", "--after", "released").expect(t, 0, "no records match")

		// The list API's filters.
		r = e.run("ls", "--indeterminate")
		if !strings.Contains(r.stdout, "indet ") || strings.Count(strings.TrimSpace(r.stdout), "\n") != 1 {
			t.Errorf("--indeterminate:\n%s", r)
		}
		r = e.run("ls", "--prefix", "r")
		if r.expect(t, 0, "released", "running"); strings.Count(strings.TrimSpace(r.stdout), "\n") != 2 {
			t.Errorf("--prefix r:\n%s", r)
		}
		e.run("ls", "--prefix", "l", "--stuck").expect(t, 0, "lapsed")
		e.run("ls", "--prefix", "l", "--indeterminate").expect(t, 0, "no records match")
		if r := e.run("ls", "--updated-after", "2000-01-01T00:00:00Z"); strings.Count(r.stdout, "\n") != 10 {
			t.Errorf("--updated-after 2000: want every record:\n%s", r)
		}
		e.run("ls", "--updated-before", "2000-01-01T00:00:00Z").expect(t, 0, "no records match")
		e.run("ls", "--updated-after", "3650d").expect(t, 0, "crash", "running")
		e.run("ls", "--updated-before", "yesterday").expectErr(t, 2, "--updated-before")
		e.run("ls", "--indeterminate", "--status", "failed").expectErr(t, 2, "cannot be combined with --status failed")

		r = e.run("ls", "--limit", "3")
		r.expect(t, 0, "crash", "done", "expired", `(3 shown; more follow: idem ls --after "expired" ...)`)
		r = e.run("ls", "--limit", "3", "--after", "expired")
		r.expect(t, 0, "failed", "indet", "lapsed", `--after "lapsed"`)
		if strings.Contains(r.stdout, "crash") {
			t.Errorf("--after did not skip:\n%s", r)
		}
		r = e.run("ls", "--after", "overlap", "--limit", "2")
		r.expect(t, 0, "released", "running")
		if strings.Contains(r.stdout, "more follow") {
			t.Errorf("claims more records after the last:\n%s", r)
		}
		// --limit 0 lists all, paging through the store.
		if r := e.run("ls", "--limit", "0"); strings.Count(r.stdout, "\n") != 10 {
			t.Errorf("--limit 0:\n%s", r)
		}

		r = e.run("ls", "--json", "--stuck")
		r.expect(t, 0)
		var states []string
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			var j struct{ Key, State string }
			if err := json.Unmarshal([]byte(l), &j); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			states = append(states, j.Key+"="+j.State)
		}
		if strings.Join(states, " ") != "indet=indeterminate lapsed=lapsed" {
			t.Errorf("ls --json --stuck = %v", states)
		}
		r = e.run("ls", "--json", "--limit", "1")
		if !strings.Contains(r.stderr, "more records follow") || strings.Count(r.stdout, "\n") != 1 {
			t.Errorf("ls --json --limit 1:\n%s", r)
		}
	})
}

func TestRelease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.run("release", "running").expectErr(t, 4, "live lease", "use --force")
		if e.get("running").Status != idem.StatusInProgress {
			t.Fatal("refused release changed the record")
		}
		f0 := fenceAt(t0) // "lapsed" was claimed once, at t0
		e.run("release", "lapsed", "--fence", "7").expectErr(t, 1, fmt.Sprintf("is at fence %d, not 7", f0), "nothing done")
		e.run("release", "done").expectErr(t, 1, "is completed", "--force")
		e.run("release", "released").expect(t, 0, "already released", "nothing done")
		e.run("release", "nope").expectErr(t, 3, "no record")

		r := e.run("release", "lapsed", "--fence", fmt.Sprint(f0), "--reason", "checked: never sent", "--by", "alice")
		r.expect(t, 0, fmt.Sprintf("released lapsed (was lapsed: attempt 1, owner w1, fence %d; now fence %d)", f0, f0+1), "the next delivery runs it as attempt 2")
		rec := e.get("lapsed")
		if rec.Status != idem.StatusReleased || rec.Fence != f0+1 || rec.Reason != "checked: never sent" {
			t.Errorf("after release: %+v", rec)
		}
		e.run("release", "failed").expect(t, 0, "released failed (was failed")

		r = e.run("release", "running", "--force")
		r.expect(t, 0, "released running (was in_progress", "may still be running", "refused from now on")
		if rec := e.get("running"); rec.Status != idem.StatusReleased {
			t.Errorf("forced release: %+v", rec)
		}
		// The key can be claimed again at once, as the next attempt.
		res, err := e.store.Claim(context.Background(), store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "lapsed", Owner: "w9", Lease: lease, Retention: retention})
		if err != nil || !res.Acquired || res.Record.Attempt != 2 {
			t.Errorf("claim after release: %v %+v", err, res)
		}
		e.run("release", "done", "--force", "--json").expect(t, 0, `"status": "released"`)
	})
}

func TestResolve(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.run("resolve", "running", "--done").expectErr(t, 4, "live lease")
		e.run("resolve", "done", "--not-done").expectErr(t, 1, "is completed, not in progress")
		e.run("resolve", "nope", "--done").expectErr(t, 3, "no record")
		f0 := fenceAt(t0) // "indet" was claimed once, at t0
		e.run("resolve", "indet", "--done", "--fence", fmt.Sprint(f0+1)).expectErr(t, 1, fmt.Sprintf("is at fence %d, not %d", f0, f0+1))

		r := e.run("resolve", "indet", "--done", "--result", "ses-0007", "--reason", "provider log shows it", "--fence", fmt.Sprint(f0), "--retention", "36h")
		r.expect(t, 0, fmt.Sprintf("resolved indet as done (was indeterminate: attempt 1, owner w1, fence %d; now fence %d)", f0, f0+1),
			`duplicates now get the result "ses-0007" (8 bytes)`, "(in 1d12h)")
		rec := e.get("indet")
		now := e.clk.Now()
		if rec.Status != idem.StatusCompleted || string(rec.Result) != "ses-0007" || rec.Reason != "provider log shows it" ||
			!rec.ExpiresAt.Equal(now.Add(36*time.Hour)) {
			t.Errorf("after resolve --done: %+v", rec)
		}
		if last := rec.Journal[len(rec.Journal)-1]; last.Outcome != store.OutcomeResolvedDone {
			t.Errorf("journal: %+v", rec.Journal)
		}
		// A duplicate now replays the decision.
		l := idem.New(e.store, idem.WithLogger(slog.New(slog.DiscardHandler)))
		res, err := l.Do(context.Background(), idem.RawKey("indet"), func(context.Context) ([]byte, error) { return nil, errors.New("ran") })
		if err != nil || !res.Replayed || string(res.Value) != "ses-0007" {
			t.Errorf("duplicate after resolve: %v %+v", err, res)
		}

		e.run("resolve", "lapsed", "--not-done").expect(t, 0, "resolved lapsed as not done", "the next delivery runs it as attempt 2")
		if rec := e.get("lapsed"); rec.Status != idem.StatusReleased {
			t.Errorf("after --not-done: %+v", rec)
		}

		file := filepath.Join(t.TempDir(), "result.bin")
		os.WriteFile(file, []byte{0, 1, 2, 0xff}, 0o600)
		e.run("resolve", "running", "--done", "--result-file", file, "--force").expect(t, 0, "hex 000102ff (4 bytes)", "may still be running")
		if rec := e.get("running"); !bytes.Equal(rec.Result, []byte{0, 1, 2, 0xff}) || !rec.ExpiresAt.Equal(now.Add(idem.DefaultRetention)) {
			t.Errorf("resolve --result-file: %+v", rec)
		}
		e.run("resolve", "done", "--done", "--result", "x", "--force", "--json").expect(t, 0, `"result": "eA=="`)
		e.run("resolve", "released", "--done", "--result-file", filepath.Join(t.TempDir(), "missing")).expectErr(t, 1, "reading --result-file")
	})
}

// recompleting is a store on which, once, right after a command read the
// key, the key is deleted and then claimed and completed again by another
// caller: the record the command decides on is no longer the attempt it
// inspected. Fences never repeat, so the new record has a higher fence and
// another attempt id.
type recompleting struct {
	store.Store
	once sync.Once
	err  error
}

func (s *recompleting) Get(ctx context.Context, key string) (idem.Record, error) {
	rec, err := s.Store.Get(ctx, key)
	if err != nil {
		return rec, err
	}
	s.once.Do(func() {
		if s.err = s.Store.Delete(ctx, key); s.err != nil {
			return
		}
		cr, err := s.Store.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key, Owner: "other", Lease: lease, Retention: retention})
		if err != nil || !cr.Acquired {
			s.err = fmt.Errorf("other's claim: %v %+v", err, cr)
			return
		}
		if cr.Record.Fence <= rec.Fence {
			s.err = fmt.Errorf("fence after delete: %d, not above the deleted record's %d", cr.Record.Fence, rec.Fence)
			return
		}
		s.err = s.Store.Finish(ctx, store.FinishRequest{Key: key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("theirs"), Retention: retention})
	})
	return rec, err
}

// TestResolveRecompletedAtItsFence: resolve and release decide the
// in-progress attempt they inspected, not a record that was deleted and
// claimed again by someone else after they read it.
func TestResolveRecompletedAtItsFence(t *testing.T) {
	for _, args := range [][]string{
		{"resolve", "k", "--done", "--result", "mine"},
		{"resolve", "k", "--not-done"},
		{"release", "k"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			clk := newClock()
			s := &recompleting{Store: memstore.New(memstore.WithClock(clk.Now))}
			ctx := context.Background()
			cr, err := s.Store.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "w1", Policy: idem.AtMostOnce, Lease: lease, Retention: retention})
			if err != nil || !cr.Acquired {
				t.Fatalf("claim: %v %+v", err, cr)
			}
			clk.Advance(lease + time.Second) // indeterminate
			stores := storeurl.New()
			stores.SetMem("test", s)
			r := runWith(ctx, stores, append([]string{"--store", "mem:test"}, args...)...)
			if s.err != nil {
				t.Fatal(s.err)
			}
			r.expectErr(t, 1, "changed while it was being decided")
			rec, err := s.Store.Get(ctx, "k")
			if err != nil || rec.Status != idem.StatusCompleted || rec.Fence <= cr.Record.Fence || rec.Owner != "other" || string(rec.Result) != "theirs" {
				t.Fatalf("after the refused %s: %v %+v, want the other caller's completed record", args[0], err, rec)
			}
		})
	}
}

func TestSweep(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		// "short" and the first "expired" record expired at t0+30s; the
		// second "expired" was claimed over it. Now expire more: the
		// released record (expires with the claim's retention, 1h) and
		// nothing else.
		before := e.run("ls", "--limit", "0").stdout
		r := e.run("sweep")
		r.expect(t, 0, "swept 1 expired records in 1 batch", "no expired record left")
		if after := e.run("ls", "--limit", "0").stdout; after != before {
			t.Errorf("sweep changed the records that had not expired:\n%s\n%s", before, after)
		}
		e.run("sweep").expect(t, 0, "swept 0 expired records in 0 batches")

		// Many expired records, small batches: it loops until none are left.
		for i := range 25 {
			k := fmt.Sprintf("bulk-%02d", i)
			f := e.claim(k, idem.AtLeastOnce, "w", lease)
			e.complete(k, f, "x", time.Minute)
		}
		e.clk.Advance(time.Minute + time.Second)
		r = e.run("sweep", "--batch", "10", "--json")
		r.expect(t, 0)
		var sum sweepSummary
		if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil {
			t.Fatal(err, r)
		}
		if sum.Deleted != 25 || sum.Batches != 3 || sum.Interrupted {
			t.Errorf("sweep --batch 10: %+v", sum)
		}
		// Records still within their retention, in any state, survive.
		for _, k := range []string{"done", "running", "lapsed", "indet", "failed", "crash", "overlap", "expired"} {
			if _, err := e.store.Get(context.Background(), k); err != nil {
				t.Errorf("%s: %v", k, err)
			}
		}
		// Interrupted before the first batch: stops cleanly, exit 130.
		for i := range 3 {
			k := fmt.Sprintf("more-%d", i)
			f := e.claim(k, idem.AtLeastOnce, "w", lease)
			e.complete(k, f, "x", time.Second)
		}
		e.clk.Advance(2 * time.Second)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var out, errb bytes.Buffer
		a := &app{stdout: &out, stderr: &errb, store: e.store, cmd: sweepCmd}
		r = result{a.exit(runSweep(ctx, a, nil)), out.String(), errb.String()}
		r.expect(t, 130, "swept 0 expired records in 0 batches", "interrupted; run it again to continue")
		e.run("sweep").expect(t, 0, "swept 3 expired records")
	})
}

// A lapsed at_least_once attempt with a fingerprint is taken over only by
// the same request: inspect and explain say that a different request gets
// a mismatch and the key stays until the same request, retention or
// `idem resolve`.
func TestLapsedWithFingerprint(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b)
			ctx := context.Background()
			req := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "fp", Owner: "w1", Correlation: "msg-w1", Fingerprint: "sha256:aa", Policy: idem.AtLeastOnce, Lease: time.Second, Retention: retention}
			if res, err := e.store.Claim(ctx, req); err != nil || !res.Acquired {
				t.Fatalf("claim: %v %+v", err, res)
			}
			e.clk.Advance(2 * time.Second)
			other := req
			other.Owner, other.Fingerprint = "w2", "sha256:bb"
			res, err := e.store.Claim(ctx, other)
			if err != nil || res.Acquired {
				t.Fatalf("a different request took the lapsed key over: %v %+v", err, res)
			}
			if a, err := res.Answer(other.Fingerprint); err != nil || a != store.AnswerMismatch {
				t.Fatalf("a different request's answer = %v, %v, want a mismatch", a, err)
			}
			e.run("inspect", "fp").expect(t, 0, "status       in_progress",
				"lapsed; the same request's next claim takes over (at_least_once: the effect may repeat), a different request gets a mismatch")
			r := e.run("explain", "fp")
			r.expect(t, 0, "only a delivery of the same request (same fingerprint, or none) takes over as attempt 2",
				"a different request gets a mismatch", "or an operator runs `idem resolve fp`")
			if strings.Contains(r.stdout, "the next delivery takes over") {
				t.Errorf("explain says any delivery takes over:\n%s", r.stdout)
			}
		})
	}
}

func TestExplain(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		for key, want := range map[string]struct {
			code string
			text []string
		}{
			"done":    {explain.CodeSingle, []string{"one attempt", "One attempt; no second effect could come from idem's side."}},
			"indet":   {explain.CodeIndeterminate, []string{"waiting for `idem resolve indet --done|--not-done`"}},
			"lapsed":  {explain.CodeSingle, []string{"the next delivery takes over"}},
			"crash":   {explain.CodeTakeover, []string{"Send succeeded, recording failed or crashed: attempt 1 lapsed without recording an outcome and attempt 2 took over", "taking over lapsed attempt 1"}},
			"overlap": {explain.CodeOverlap, []string{"Concurrent attempts: attempt 1 outlived its lease", "attempt 1 was still running at 2025-06-01 10:00:03.000Z (tried to extend its lease or record an outcome) after attempt 2 took over"}},
			"expired": {explain.CodeExpiredRerun, []string{"Check the job key, table and record lifetime: the completed record expired (retention) before the redelivery; raise retention to cover the sender's retry horizon", "after the previous record had expired"}},
			"failed":  {explain.CodeSingle, []string{"failed permanently after 0s (card declined)"}},
		} {
			r := e.run("explain", key)
			r.expect(t, 0, append(want.text, "Story (UTC, 2025-06-01):", "Two emails, one booking?", "Verdict: ", "Now: ")...)
			r = e.run("explain", "--json", key)
			r.expect(t, 0)
			var x explain.Explanation
			if err := json.Unmarshal([]byte(r.stdout), &x); err != nil {
				t.Fatal(err, r)
			}
			if x.Verdict.Code != want.code || x.Key != key || len(x.Steps) == 0 || len(x.Story) == 0 {
				t.Errorf("%s: verdict %s (want %s), %d steps, %d events", key, x.Verdict.Code, want.code, len(x.Steps), len(x.Story))
			}
		}
		e.run("explain", "nope").expectErr(t, 3, "no record")
	})
}

// TestExplainJournalFields runs explain and inspect on journals that use
// the entries' policy, who resolved, decisions, reconciled takeovers and
// refused heartbeats, as the stores keep them.
func TestExplainJournalFields(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, b)
			// reconciled: consumer-1 dies under at_most_once; consumer-2
			// takes over and its Reconcile hook finds the email sent.
			e.claim("reconciled", idem.AtMostOnce, "consumer-1", time.Second)
			// heartbeat: w1 pauses past its lease, w2 takes over, then w1's
			// heartbeat is refused.
			f1 := e.claim("heartbeat", idem.AtLeastOnce, "w1", time.Second)
			// rerun: completed, released by an operator, run again.
			f := e.claim("rerun", idem.AtLeastOnce, "w1", lease)
			e.complete("rerun", f, "ses-r1", retention)
			// notdone: an at_most_once attempt returns idem.NotDone, the
			// next delivery (now at_least_once) runs it.
			f = e.claim("notdone", idem.AtMostOnce, "w1", lease)
			if err := e.store.Finish(ctx, store.FinishRequest{Key: "notdone", Fence: f, AttemptID: e.attempt("notdone", f), Outcome: store.OutcomeReleased, Reason: "smtp: 421 try again later"}); err != nil {
				t.Fatal(err)
			}
			e.clk.Advance(2 * time.Second)

			l := idem.New(e.store, idem.WithOwner("consumer-2"), idem.WithLogger(slog.New(slog.DiscardHandler)))
			res, err := l.Do(ctx, idem.RawKey("reconciled"), func(context.Context) ([]byte, error) {
				return nil, errors.New("ran after the hook found it done")
			}, idem.WithPolicy(idem.AtMostOnce), idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) {
				return []byte("ses-0001"), true, nil
			}))
			if err != nil || !res.Reconciled {
				t.Fatalf("reconcile: %v %+v", err, res)
			}
			f2 := e.claim("heartbeat", idem.AtLeastOnce, "w2", lease)
			e.clk.Advance(time.Second)
			if _, err := e.store.Extend(ctx, store.ExtendRequest{Key: "heartbeat", Fence: f1, AttemptID: e.attempt("heartbeat", f1), Lease: lease}); !errors.Is(err, idem.ErrLeaseLost) {
				t.Fatalf("stale heartbeat: %v", err)
			}
			e.complete("heartbeat", f2, "ses-h2", retention)
			e.run("release", "rerun", "--force", "--by", "alice", "--reason", "customer asked for a resend").expect(t, 0, "released rerun")
			f = e.claim("rerun", idem.AtLeastOnce, "w2", lease)
			e.complete("rerun", f, "ses-r2", retention)
			f = e.claim("notdone", idem.AtLeastOnce, "w2", lease)
			e.complete("notdone", f, "ses-n2", retention)

			for key, want := range map[string]struct {
				code string
				text []string
			}{
				"reconciled": {explain.CodeReconciled, []string{
					"attempt 2 took over, its Reconcile hook found attempt 1's effect done, nothing was repeated: completed with the hook's result (recorded by consumer-2 (reconcile))",
					"Verdict: No second effect from idem's side: attempt 2 took over, its Reconcile hook found attempt 1's effect done, nothing was repeated"}},
				"heartbeat": {explain.CodeOverlap, []string{
					"attempt 1 was still running at 2025-06-01 10:00:03.000Z (tried to extend its lease or record an outcome) after attempt 2 took over",
					"2. Did attempts overlap? yes"}},
				"rerun": {explain.CodeReleasedRerun, []string{
					"resolved as not done by alice (customer asked for a resend)",
					"then an operator (alice) released the completed key"}},
				"notdone": {explain.CodeNoDuplicate, []string{
					"claimed by w1 under at_most_once", "attempt 1 returned idem.NotDone", "claimed by w2 under at_least_once",
					"3. Did an attempt run again after an earlier one may have done its effect? no: attempt 1 returned idem.NotDone under at_most_once"}},
			} {
				r := e.run("explain", key)
				r.expect(t, 0, want.text...)
				if strings.Contains(r.stdout, "Verdict: Send succeeded") || (key == "reconciled" && strings.Contains(r.stdout, "twice")) {
					t.Errorf("%s: verdict says the effect repeated:\n%s", key, r.stdout)
				}
				var x explain.Explanation
				if err := json.Unmarshal([]byte(e.run("explain", "--json", key).stdout), &x); err != nil {
					t.Fatal(err)
				}
				if x.Verdict.Code != want.code || x.Attempts != 2 {
					t.Errorf("%s: verdict %s (want %s), %d attempts", key, x.Verdict.Code, want.code, x.Attempts)
				}
			}

			e.run("inspect", "reconciled").expect(t, 0, "at_most_once  consumer-2", "resolved-done", "takeover; by consumer-2 (reconcile)")
			e.run("inspect", "rerun").expect(t, 0, "alice", "decision, not an attempt", `reason: "customer asked for a resend"`)
			e.run("inspect", "heartbeat").expect(t, 0, "still running at 10:00:03.000 after a takeover")
			r := e.run("inspect", "--json", "reconciled")
			r.expect(t, 0, `"policy": "at_most_once"`, `"resolved_by": "consumer-2 (reconcile)"`)
			e.run("inspect", "--json", "rerun").expect(t, 0, `"decision": true`, `"resolved_by": "alice"`)
		})
	}
}

// testDemoLease is the lease of TestDemo's runs: four times the demo's
// 300 ms, so that only the injected crashes lapse on a loaded machine.
// At 300 ms, and still at 600 ms, attempts that did not crash lapsed on
// SQLite and PostgreSQL while other packages' tests shared the machine
// (every extension waits for a synced commit). A run takes about twice
// its lease.
const testDemoLease = "1200ms"

func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo takes about a second")
	}
	// check checks one run's output and returns the key that was sent
	// twice and the key left indeterminate.
	check := func(t *testing.T, r result) (alo, amo string) {
		t.Helper()
		r.expect(t, 0, "idem demo: order receipts sent through a queue",
			"20 orders, one receipt email each", "21 emails sent for 20 orders = 2 by the crashed workers + 18 sent + 1 sent again: one per order, except 2 for receipt:",
			"at_least_once), sent email ses-", "at_most_once), sent email ses-",
			"Verdict: Send succeeded, recording failed or crashed: attempt 1 lapsed without recording an outcome and attempt 2 took over",
			"is left for you", "stays indeterminate until a person decides")
		if strings.Contains(r.stdout, "seed") {
			t.Errorf("the demo mentions a seed:\n%s", r.stdout)
		}
		if n := strings.Count(r.stdout, "\n"); n > 60 {
			t.Errorf("the demo prints %d lines, want at most 60", n)
		}
		m := regexp.MustCompile(`email sent again: (receipt:\d+:\d+),`).FindStringSubmatch(r.stdout)
		m2 := regexp.MustCompile(`refused: (receipt:\d+:\d+) may have been sent`).FindStringSubmatch(r.stdout)
		if m == nil || m2 == nil {
			t.Fatalf("no key sent again or no key refused:\n%s", r.stdout)
		}
		alo, amo = m[1], m2[1]
		if !strings.Contains(r.stdout, "except 2 for "+alo+"\n") {
			t.Errorf("the emails line does not name %s as sent twice:\n%s", alo, r.stdout)
		}
		if !regexp.MustCompile(`\n\$ .* explain ` + alo + `\n` + alo + `: completed \(at_least_once\)`).MatchString(r.stdout) {
			t.Errorf("no explain of %s:\n%s", alo, r.stdout)
		}
		// The counts add up: deliveries = messages + delivered again = the
		// sum of what each became; messages = jobs + enqueued again.
		n := func(re string) []int {
			t.Helper()
			m := regexp.MustCompile(re).FindStringSubmatch(r.stdout)
			if m == nil {
				t.Fatalf("stdout lacks %s:\n%s", re, r.stdout)
			}
			var ns []int
			for _, s := range m[1:] {
				v, _ := strconv.Atoi(s)
				ns = append(ns, v)
			}
			return ns
		}
		msgs := n(`; (\d+) messages = (\d+) jobs \+ (\d+) duplicates the sender enqueued again \+ (\d+) jobs enqueued again after the crashes`)
		if msgs[0] != msgs[1]+msgs[2]+msgs[3] || msgs[3] != 2 {
			t.Errorf("messages %v do not add up", msgs)
		}
		del := n(`\n(\d+) deliveries in \S+ = (\d+) messages \+ (\d+) delivered again \((\d+) not acknowledged by a crashed worker, (\d+) put back to try again\)`)
		if del[1] != msgs[0] || del[0] != del[1]+del[2] || del[2] != del[3]+del[4] {
			t.Errorf("deliveries %v do not add up", del)
		}
		rows := regexp.MustCompile(`(?m)^ +(\d+)  `).FindAllStringSubmatch(r.stdout, -1)
		sum := 0
		for _, row := range rows {
			v, _ := strconv.Atoi(row[1])
			sum += v
		}
		if len(rows) != 6 || sum != del[0] {
			t.Errorf("%d outcome rows summing to %d, want 6 rows summing to the %d deliveries", len(rows), sum, del[0])
		}
		busy, refused := n(`(?m)^ +(\d+)  key busy`), n(`(?m)^ +(\d+)  refused: .*\n +put back (\d+) times, then its (\d+) messages set aside`)
		if busy[0]+refused[1] != del[4] || refused[0] != refused[1]+refused[2] {
			t.Errorf("busy %v and refused %v do not add up to %d put back", busy, refused, del[4])
		}
		return alo, amo
	}
	t.Run("default store", func(t *testing.T) {
		t.Setenv("IDEM_STORE", "mem:must-not-be-used")
		t.Chdir(t.TempDir())
		r := idemRun(context.Background(), "demo", "--lease", testDemoLease)
		_, amo := check(t, r)
		if !strings.Contains(r.stdout, "database: idem-demo.db in ") || strings.Contains(r.stdout, "was deleted") {
			t.Errorf("the demo did not say where its database is, or deleted one that was not there:\n%s", r.stdout)
		}
		for _, s := range []string{" --store sqlite:idem-demo.db ls --stuck\n", " --store sqlite:idem-demo.db explain " + amo + "\n",
			" --store sqlite:idem-demo.db resolve " + amo + " --done --result ses-", "it deletes idem-demo.db first"} {
			if !strings.Contains(r.stdout, s) {
				t.Errorf("stdout lacks %q:\n%s", s, r.stdout)
			}
		}
		idemRun(context.Background(), "--store", "sqlite:idem-demo.db", "ls", "--stuck").expect(t, 0, amo+"  indeterminate")
		// A second run deletes the first one's file and says so.
		r = idemRun(context.Background(), "demo", "--lease", testDemoLease)
		check(t, r)
		if !strings.Contains(r.stdout, "(the idem-demo.db an earlier run left was deleted: each run starts clean)") {
			t.Errorf("the second run did not say it started clean:\n%s", r.stdout)
		}
		r = idemRun(context.Background(), "--store", "sqlite:idem-demo.db", "ls", "--limit", "0")
		if n := strings.Count(r.stdout, "\n"); n != 21 {
			t.Errorf("ls after two runs lists %d lines, want the second run's 20 keys:\n%s", n, r.stdout)
		}
	})
	t.Run("mem", func(t *testing.T) {
		r := idemRun(context.Background(), "--store", "mem:", "demo", "--lease", testDemoLease)
		check(t, r)
		r.expect(t, 0, "store: mem:", "The store was in this process's memory and is gone")
	})
	t.Run("store given, then looked at", func(t *testing.T) {
		stores := storeurl.New()
		url := "mem:demo-kept"
		r := runWith(context.Background(), stores, "demo", "--store", url, "--lease", testDemoLease)
		check(t, r)
		// The store holds the run's records for the other commands.
		r2 := runWith(context.Background(), stores, "--store", url, "ls", "--limit", "0")
		r2.expect(t, 0, "receipt:1003:", "receipt:1007:")
		if n := strings.Count(r2.stdout, "\n"); n != 21 {
			t.Errorf("ls after the demo lists %d lines:\n%s", n, r2.stdout)
		}
		// A second run on the same store uses fresh keys.
		check(t, runWith(context.Background(), stores, "demo", "--store", url, "--lease", testDemoLease))
	})
	t.Run("postgres", func(t *testing.T) {
		url := postgresURL(t, newPostgresSchema(t), "demo_keys")
		r := idemRun(context.Background(), "--store", url, "demo", "--lease", testDemoLease)
		_, amo := check(t, r)
		r.expect(t, 0, " --store "+quoteArgs([]string{storeurl.Redact(url)})[0]+" explain "+amo+"\n")
		// The demo created the table; the other commands find its records.
		r = idemRun(context.Background(), "--store", url, "ls", "--limit", "0")
		r.expect(t, 0, "receipt:1003:", "receipt:1007:")
		if n := strings.Count(r.stdout, "\n"); n != 21 {
			t.Errorf("ls after the demo lists %d lines:\n%s", n, r.stdout)
		}
	})
}

// TestDemoLeavesAForeignFileAlone: an idem-demo.db that holds no idem
// store is not the demo's to delete.
func TestDemoLeavesAForeignFileAlone(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, content := range []string{"notes\n", ""} {
		if err := os.WriteFile("idem-demo.db", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if content == "" {
			// An SQLite database of another program.
			db, err := sql.Open("sqlite", "idem-demo.db")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec("CREATE TABLE mine (x)"); err != nil {
				t.Fatal(err)
			}
			db.Close()
		}
		r := idemRun(context.Background(), "demo")
		r.expectErr(t, 1, "idem demo: idem-demo.db is not the database an earlier demo left", "move it away or run the demo in another directory")
		if _, err := os.Stat("idem-demo.db"); err != nil {
			t.Errorf("the demo removed a file it did not make: %v", err)
		}
	}
}

// TestProgName: the commands the demo prints start the way the user ran it.
func TestProgName(t *testing.T) {
	for _, tc := range []struct{ arg0, exe, gocache, wd, module, want string }{
		{"./idem", "/src/idem/idem", "", "/src/idem", "", "./idem"},
		{"idem", "/usr/local/bin/idem", "", "/home/u", "", "idem"},
		{"/opt/my tools/idem", "/opt/my tools/idem", "", "/home/u", "", "'/opt/my tools/idem'"},
		// go run ./cmd/idem: a temporary directory, then the build cache.
		{"/tmp/go-build123/b001/exe/idem", "/tmp/go-build123/b001/exe/idem", "", "/src/idem", "", "go run ./cmd/idem"},
		{"/home/u/.cache/go-build/aa/aa77-d/idem", "/home/u/.cache/go-build/aa/aa77-d/idem", "", "/src/idem", "", "go run ./cmd/idem"},
		{"/ci/cache/aa/aa77-d/idem", "/ci/cache/aa/aa77-d/idem", "/ci/cache", "/src/idem", "", "go run ./cmd/idem"},
		{"/tmp/go-build1/b001/exe/idem", "/tmp/go-build1/b001/exe/idem", "", "/src/idem/cmd/idem", "", "go run ."},
		{"/tmp/go-build1/b001/exe/idem", "/tmp/go-build1/b001/exe/idem", "", "/home/u", "github.com/idemkit/idem/cmd/idem@v1.2.0", "go run github.com/idemkit/idem/cmd/idem@v1.2.0"},
		{"/tmp/go-build1/b001/exe/idem", "/tmp/go-build1/b001/exe/idem", "", "/home/u", "", "idem"},
	} {
		// A checkout in /src/idem.
		exists := func(p string) bool { return p == filepath.Join("/src/idem", "cmd", "idem", "main.go") }
		if got := progName(tc.arg0, tc.exe, tc.gocache, tc.wd, tc.module, exists); got != tc.want {
			t.Errorf("progName(%q, %q, %q, %q) = %q, want %q", tc.arg0, tc.exe, tc.gocache, tc.wd, got, tc.want)
		}
	}
}

func TestSweepProgressOnATerminal(t *testing.T) {
	e := newEnv(t, backends()[0])
	for i := range 5 {
		k := fmt.Sprintf("k%d", i)
		f := e.claim(k, idem.AtLeastOnce, "w", lease)
		e.complete(k, f, "x", time.Second)
	}
	e.clk.Advance(2 * time.Second)
	var out, errb bytes.Buffer
	a := &app{stdout: &out, stderr: &errb, store: e.store, cmd: sweepCmd, stderrTTY: true}
	if err := runSweep(context.Background(), a, []string{"--batch", "2"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errb.String(), "\r\033[Ksweeping: 2 expired records deleted in 1 batches") ||
		!strings.Contains(errb.String(), "sweeping: 5 expired records deleted in 3 batches") ||
		!strings.HasSuffix(errb.String(), "\r\033[K") {
		t.Errorf("progress line: %q", errb.String())
	}
	if !strings.Contains(out.String(), "swept 5 expired records in 3 batches") {
		t.Errorf("summary: %q", out.String())
	}
	// Not a terminal: no progress line, the summary only.
	e.run("sweep").expectErr(t, 0)
}

func TestKeysThatLookLikeFlags(t *testing.T) {
	e := newEnv(t, backends()[0])
	f := e.claim("-odd:key", idem.AtLeastOnce, "w", lease)
	e.complete("-odd:key", f, "x", time.Hour)
	e.run("inspect", "--json", "--", "-odd:key").expect(t, 0, `"key": "-odd:key"`)
	e.run("inspect", "-odd:key").expectErr(t, 2, "flag provided but not defined")
	e.run("inspect", "bad\x00key").expectErr(t, 2, "invalid key")
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"7d": 7 * 24 * time.Hour, "36h": 36 * time.Hour, "1d12h": 36 * time.Hour, "90s": 90 * time.Second,
	} {
		if got, err := parseDuration(in); err != nil || got != want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "xd", "1.5d", "7 days", "1d1"} {
		if _, err := parseDuration(in); err == nil {
			t.Errorf("parseDuration(%q) accepted", in)
		}
	}
}

// TestReleaseAlreadyReleasedJSON: with --json, release of a key that is
// already released prints the record as JSON, as every other --json
// answer does, not a sentence.
func TestReleaseAlreadyReleasedJSON(t *testing.T) {
	e := newEnv(t, backend{"mem", openMem})
	e.fixture()
	r := e.run("release", "released", "--json")
	var v map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || r.code != 0 {
		t.Fatalf("release --json of a released key: %v\n%s", err, r)
	}
	if v["status"] != "released" || v["key"] != "released" {
		t.Fatalf("release --json of a released key printed %v", v)
	}
}
