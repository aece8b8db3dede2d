// Package chaostest runs a store under the faults a deployment meets,
// for real, and checks that idem keeps each policy's promise through
// them (docs/guarantees.md):
//
//   - worker processes (the test binary again, each with its own
//     [idem.Ledger] owned by "chaos-PID") share a set of keys that arrive
//     over the run, as a queue would deliver them, and redeliver every key
//     (in random order, a few goroutines a worker) until it is terminal:
//     completed, or indeterminate under AtMostOnce. A busy key, a store
//     error or a lost lease is delivered again later;
//   - the effect of a key is one O_APPEND write of "key pid correlation"
//     to a file shared by the workers (it survives SIGKILL), followed by a
//     short pause: the window between an effect and its completion. Under
//     DoTx the effect is instead a row written in the ledger's
//     transaction;
//   - while the keys arrive, the parent cuts about a third of the
//     workers' store connections every 200-400 ms with the store's own
//     means (Target.Fault: pg_terminate_backend, CLIENT KILL, another
//     process holding SQLite's write lock), and SIGKILLs a random worker
//     every 2-3 s, starting another in its place. The lease is 4 s, so the
//     keys a killed worker held lapse and are taken over (or left
//     indeterminate) during the run. The faults stop before the final
//     pass, in which the workers finish every key.
//
// Then it reads every key's record and checks, by the journal entry the
// effect's correlation id names:
//
//   - AtLeastOnce: every key completed; exactly one effect per key belongs
//     to the attempt that completed it, and every other effect was made by
//     a worker that was SIGKILLed before its attempt completed. So
//     duplicates ≤ effects cut by a kill, and none from store faults.
//   - AtMostOnce: no key has two effects; every key is completed (with its
//     one effect) or indeterminate, and every indeterminate key was left by
//     a killed worker. None is left by a live worker, whatever the faults.
//   - Transactional (DoTx): exactly one effect row per key, written by the
//     owner of its completed record; every key completed.
//
// [Run] logs one line of figures per scenario. IDEM_CHAOS_KEYS and
// IDEM_CHAOS_DURATION (the fault phase; default 300 keys over 15 s) make
// a longer run; IDEM_CHAOS_LEASE sets the workers' lease (default 4 s).
package chaostest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/store"
)

// Knobs for a longer run (the figures in docs/guarantees.md).
const (
	EnvKeys     = "IDEM_CHAOS_KEYS"     // how many keys (default 300)
	EnvDuration = "IDEM_CHAOS_DURATION" // how long faults and kills go on, a time.Duration (default 15s)
	EnvLease    = "IDEM_CHAOS_LEASE"    // the workers' lease, a time.Duration (default 4s)
)

// Rows is what ScanEffects reads: *sql.Rows and pgx.Rows both are.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// ScanEffects reads the rows of a query "SELECT key, who FROM <effects>"
// into who per key, for a Target's Effects. The caller closes rows.
func ScanEffects(rows Rows) (map[string][]string, error) {
	m := map[string][]string{}
	for rows.Next() {
		var k, who string
		if err := rows.Scan(&k, &who); err != nil {
			return nil, err
		}
		m[k] = append(m[k], who)
	}
	return m, rows.Err()
}

// The run's shape.
const (
	defaultKeys     = 300
	defaultDuration = 15 * time.Second
	workers         = 3                      // worker processes alive at once
	goroutines      = 4                      // Do calls under way in a worker at once
	defaultLease    = 4 * time.Second        // short, so lapsed keys are taken over during the run; long enough that a worker starved of CPU under -race keeps its lease
	finalPass       = 3 * time.Minute        // bound of the pass after the faults stop
	effectWindow    = 40 * time.Millisecond  // the longest pause between an effect and fn's return
	claimWindow     = 3 * time.Millisecond   // the longest pause between the claim and the effect
	faultMin        = 200 * time.Millisecond // faults every faultMin..faultMax
	faultMax        = 400 * time.Millisecond
	killMin         = 2 * time.Second // a kill every killMin..killMax
	killMax         = 3 * time.Second
)

// The environment of a worker process.
const (
	envRole     = "IDEM_CHAOS_CHILD"          // "worker"
	envTest     = "IDEM_CHAOS_CHILD_TEST"     // t.Name() of the Run call the worker plays for
	envLocator  = "IDEM_CHAOS_CHILD_LOCATOR"  // Target.Setup's locator
	envConnName = "IDEM_CHAOS_CHILD_CONNNAME" // the name the worker's connections carry
	envDir      = "IDEM_CHAOS_CHILD_DIR"      // the run's directory: the effect log
	envKeys     = "IDEM_CHAOS_CHILD_KEYS"     // how many keys
	envLease    = "IDEM_CHAOS_CHILD_LEASE"    // the workers' lease
	envStart    = "IDEM_CHAOS_CHILD_START"    // when the first key arrives (Unix ns)
	envSpread   = "IDEM_CHAOS_CHILD_SPREAD"   // the keys arrive evenly over this duration
	envDeadline = "IDEM_CHAOS_CHILD_DEADLINE" // the worker gives up then (Unix ns)
)

// Target is the store under test.
type Target struct {
	// Setup runs in the parent only: it makes a fresh place for the
	// scenario's records (a schema, a key prefix, a file) and, for a
	// transactional scenario, the effect table, removed when t ends. It
	// returns the locator Open and Fault are given.
	Setup func(t *testing.T, transactional bool) (locator string)
	// Open opens the store at locator, in a worker (and in the parent for
	// the checks). Its connections carry connName (application_name, a
	// Redis client name) so that Fault can find them.
	Open func(ctx context.Context, locator, connName string) (store.Store, error)
	// Fault runs in the parent every 200-400 ms while faults are on: it
	// breaks about a third of the connections named connName, for real,
	// and returns how many it broke.
	Fault func(ctx context.Context, locator, connName string) (int, error)
	// Faults names what Fault does, for the figures ("pg_terminate_backend").
	Faults string
	// DoTx, for a transactional scenario, calls idem.DoTx on l for key
	// (passing opts) with an fn that writes one row (key, who) to the
	// effect table Setup made at locator, in the ledger's transaction.
	// Effects reads those rows (in the parent): who per key.
	DoTx    func(ctx context.Context, locator string, l *idem.Ledger, key, who string, opts ...idem.CallOption) (idem.Result, error)
	Effects func(ctx context.Context, locator string) (map[string][]string, error)
}

// Scenario is one run: a policy, or DoTx (exactly once).
type Scenario struct {
	Policy        idem.Policy
	Transactional bool
}

func (sc Scenario) String() string {
	if sc.Transactional {
		return "transactional"
	}
	return sc.Policy.String()
}

// Run runs sc on tg: as the parent, or, in a worker process started by
// the parent of this test, as that worker. Call it from a (sub)test that
// does nothing else before it that a worker must not do.
func Run(t *testing.T, tg Target, sc Scenario) {
	if os.Getenv(envRole) == "worker" {
		if os.Getenv(envTest) != t.Name() {
			t.Skipf("chaostest worker for %q", os.Getenv(envTest))
		}
		work(t, tg, sc)
		return
	}
	if testing.Short() {
		t.Skip("chaostest: not in -short mode")
	}
	keys := envInt(t, EnvKeys, defaultKeys)
	dur := defaultDuration
	if v := os.Getenv(EnvDuration); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a duration such as 60s", EnvDuration, v)
		}
		dur = d
	}
	lease := defaultLease
	if v := os.Getenv(EnvLease); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a duration such as 2s", EnvLease, v)
		}
		lease = d
	}
	locator := tg.Setup(t, sc.Transactional)
	var rb [4]byte
	for i := range rb {
		rb[i] = byte('a' + rand.N(26))
	}
	r := &run{t: t, tg: tg, sc: sc, locator: locator, keys: keys, dir: t.TempDir(),
		connName: "idemchaos-" + string(rb[:]) + strconv.Itoa(os.Getpid()), killed: map[int]bool{}}
	r.dur, r.lease = dur, lease
	r.main()
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// run is the parent's side of a scenario.
type run struct {
	t        *testing.T
	tg       Target
	sc       Scenario
	locator  string
	connName string
	keys     int
	dur      time.Duration // of the faults
	lease    time.Duration // the workers'
	dir      string
	env      []string

	mu      sync.Mutex
	workers map[int]*worker // by pid, alive
	ended   []*worker       // exited (killed or done)
	killed  map[int]bool
	cuts    atomic.Int64
	faultE  atomic.Int64 // Fault calls that failed
}

// worker is a running worker process.
type worker struct {
	cmd  *exec.Cmd
	out  *testlog.Buffer // its output, written by exec's goroutine
	done chan struct{}
	err  error
}

func (r *run) main() {
	t, dur := r.t, r.dur
	began := time.Now()
	start := began.Add(2 * time.Second) // time for the first workers to open the store
	deadline := start.Add(dur + finalPass)
	r.env = []string{
		envRole + "=worker",
		envTest + "=" + t.Name(),
		envLocator + "=" + r.locator,
		envConnName + "=" + r.connName,
		envDir + "=" + r.dir,
		envKeys + "=" + strconv.Itoa(r.keys),
		envLease + "=" + r.lease.String(),
		envStart + "=" + strconv.FormatInt(start.UnixNano(), 10),
		envSpread + "=" + (dur * 3 / 4).String(),
		envDeadline + "=" + strconv.FormatInt(deadline.UnixNano(), 10),
	}
	r.workers = map[int]*worker{}
	t.Cleanup(func() {
		r.mu.Lock()
		alive := make([]*worker, 0, len(r.workers))
		for _, w := range r.workers {
			alive = append(alive, w)
		}
		r.mu.Unlock()
		for _, w := range alive {
			_ = w.cmd.Process.Kill()
			<-w.done
		}
	})
	for range workers {
		r.start()
	}

	ctx, stop := context.WithDeadline(context.Background(), start.Add(dur))
	defer stop()
	var faults sync.WaitGroup
	faults.Go(func() { r.inject(ctx) })
	kills := r.kill(ctx)
	faults.Wait()

	// The final pass: no more faults; the workers finish every key.
	r.mu.Lock()
	alive := make([]*worker, 0, len(r.workers))
	for _, w := range r.workers {
		alive = append(alive, w)
	}
	r.mu.Unlock()
	for _, w := range alive {
		select {
		case <-w.done:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("a worker did not finish in the final pass\n%s", tail(w.out.String(), 40))
		}
	}
	r.mu.Lock()
	for _, w := range r.ended {
		if pid := w.cmd.Process.Pid; w.err != nil && !r.killed[pid] {
			t.Errorf("worker %d failed: %v\n%s", pid, w.err, tail(w.out.String(), 60))
		}
	}
	r.mu.Unlock()
	if t.Failed() {
		t.FailNow()
	}
	took := time.Since(began)
	r.check(kills, took)
}

// start starts a worker process.
func (r *run) start() {
	t := r.t
	var pattern []string
	for part := range strings.SplitSeq(t.Name(), "/") {
		pattern = append(pattern, "^"+regexp.QuoteMeta(part)+"$")
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(pattern, "/"), "-test.count=1", "-test.v",
		"-test.timeout="+(r.dur+finalPass+time.Minute).String())
	cmd.Env = append(os.Environ(), r.env...)
	w := &worker{cmd: cmd, out: new(testlog.Buffer), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = w.out, w.out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting a worker: %v", err)
	}
	pid := cmd.Process.Pid
	r.mu.Lock()
	r.workers[pid] = w
	r.mu.Unlock()
	go func() {
		w.err = cmd.Wait()
		r.mu.Lock()
		delete(r.workers, pid)
		r.ended = append(r.ended, w)
		r.mu.Unlock()
		close(w.done)
	}()
}

// inject runs Target.Fault every 200-400 ms until ctx ends.
func (r *run) inject(ctx context.Context) {
	for sleep(ctx, faultMin+rand.N(faultMax-faultMin)) {
		n, err := r.tg.Fault(ctx, r.locator, r.connName)
		if err != nil && ctx.Err() == nil {
			r.faultE.Add(1)
			r.t.Logf("fault: %v", err)
		}
		r.cuts.Add(int64(n))
	}
}

// kill SIGKILLs a random worker every 2-3 s until ctx ends, starting
// another in its place, and returns how many it killed.
func (r *run) kill(ctx context.Context) int {
	n := 0
	for sleep(ctx, killMin+rand.N(killMax-killMin)) {
		r.mu.Lock()
		var pick *worker
		i := 0
		for _, w := range r.workers {
			if rand.N(i+1) == 0 {
				pick = w
			}
			i++
		}
		r.mu.Unlock()
		if pick == nil {
			continue
		}
		select {
		case <-pick.done: // it finished on its own before the signal
		default:
			if err := pick.cmd.Process.Signal(syscall.SIGKILL); err == nil {
				r.mu.Lock()
				r.killed[pick.cmd.Process.Pid] = true
				r.mu.Unlock()
				n++
			}
		}
		<-pick.done
		r.start()
	}
	return n
}

// effect is one line of the effect log, or one effect row.
type effect struct {
	key, corr string
	pid       int
}

// check reads the records and the effects and checks the scenario's
// promise.
func (r *run) check(kills int, took time.Duration) {
	t := r.t
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := r.tg.Open(ctx, r.locator, r.connName+"-check")
	if err != nil {
		t.Fatalf("opening the store for the checks: %v", err)
	}
	defer s.Close()
	recs := make(map[string]store.Record, r.keys)
	for i := range r.keys {
		k := keyName(i)
		rec, err := s.Get(ctx, k)
		if err != nil {
			t.Fatalf("Get(%q): %v", k, err)
		}
		recs[k] = rec
	}
	effects := map[string][]effect{}
	total := 0
	if r.sc.Transactional {
		rows, err := r.tg.Effects(ctx, r.locator)
		if err != nil {
			t.Fatalf("reading the effect rows: %v", err)
		}
		for k, whos := range rows {
			for _, who := range whos {
				pid, _ := strconv.Atoi(who)
				effects[k] = append(effects[k], effect{key: k, pid: pid})
				total++
			}
		}
	} else {
		f, err := os.Open(filepath.Join(r.dir, "effects"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			parts := strings.Fields(sc.Text())
			if len(parts) != 3 {
				t.Fatalf("a malformed line in the effect log: %q", sc.Text())
			}
			pid, err := strconv.Atoi(parts[1])
			if err != nil {
				t.Fatalf("a malformed line in the effect log: %q", sc.Text())
			}
			effects[parts[0]] = append(effects[parts[0]], effect{key: parts[0], pid: pid, corr: parts[2]})
			total++
		}
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	for k := range effects {
		if _, ok := recs[k]; !ok {
			t.Errorf("an effect of %q, which is not one of the keys", k)
		}
	}

	ledgerLog, _ := os.ReadFile(filepath.Join(r.dir, "ledger.log"))
	logged := map[string]int{}
	for line := range strings.SplitSeq(string(ledgerLog), "\n") {
		if _, rest, ok := strings.Cut(line, " outcome="); ok {
			outcome, _, _ := strings.Cut(rest, " ")
			logged[outcome]++
			if _, rest, ok := strings.Cut(rest, " op="); ok && outcome == "store-error" {
				op, _, _ := strings.Cut(rest, " ")
				logged[outcome+":"+op]++
			}
		}
	}
	// story returns the ledger's log lines about key k, for a failure.
	story := func(k string) string {
		var b strings.Builder
		for line := range strings.SplitSeq(string(ledgerLog), "\n") {
			if strings.Contains(line, " key="+k+" ") {
				b.WriteString("\n\t" + line)
			}
		}
		return b.String()
	}
	failures := 0
	fail := func(k, format string, args ...any) {
		failures++
		msg := k + ": " + fmt.Sprintf(format, args...)
		if failures <= 10 {
			msg += "\nthe ledger's warnings about " + k + ":" + story(k)
		}
		t.Error(msg)
	}
	var dups, cut, indeterminate int
	killedOwner := func(owner string) bool {
		pid, err := strconv.Atoi(strings.TrimPrefix(owner, "chaos-"))
		return err == nil && r.killed[pid]
	}
	for i := range r.keys {
		k := keyName(i)
		rec, es := recs[k], effects[k]
		switch {
		case r.sc.Transactional:
			if rec.Status != store.StatusCompleted {
				fail(k, "%s, want completed", rec.Status)
			}
			if len(es) != 1 {
				fail(k, "%d effect rows, want exactly 1", len(es))
				dups += max(len(es)-1, 0)
			} else if rec.Owner != owner(es[0].pid) {
				fail(k, "the effect row was written by %d, the record is owned by %s", es[0].pid, rec.Owner)
			}
		case r.sc.Policy == idem.AtLeastOnce:
			if rec.Status != store.StatusCompleted {
				fail(k, "%s, want completed", rec.Status)
				continue
			}
			done := 0
			for _, e := range es {
				je, ok := entryByCorr(rec, e.corr)
				switch {
				case ok && je.AttemptID == rec.AttemptID:
					done++
				case r.killed[e.pid]:
					cut++ // its worker was killed before the attempt completed
				case ok:
					fail(k, "an effect of a live worker's attempt (%s) that did not complete it: journal entry %+v; record fence %d", e.corr, je, rec.Fence)
				default:
					fail(k, "an effect of a live worker (%d, %s) whose attempt the journal no longer holds", e.pid, e.corr)
				}
			}
			if done != 1 {
				fail(k, "%d effects of the attempt that completed it, want 1 (effects %v)", done, es)
			}
			dups += max(len(es)-1, 0)
		case r.sc.Policy == idem.AtMostOnce:
			if len(es) > 1 {
				fail(k, "%d effects under AtMostOnce, want at most 1: %v", len(es), es)
				dups += len(es) - 1
			}
			switch rec.Status {
			case store.StatusCompleted:
				if len(es) != 1 {
					fail(k, "completed with %d effects, want 1", len(es))
				} else if je, ok := entryByCorr(rec, es[0].corr); !ok || je.AttemptID != rec.AttemptID {
					fail(k, "its effect (%s) is not the completing attempt's (journal %+v)", es[0].corr, rec.Journal)
				}
			case store.StatusInProgress:
				indeterminate++
				if !killedOwner(rec.Owner) {
					fail(k, "left indeterminate by %s, a worker that was not killed (journal %+v)", rec.Owner, rec.Journal)
				}
				if len(es) == 1 && es[0].pid != pidOf(rec.Owner) {
					fail(k, "indeterminate, held by %s, but its effect is %d's", rec.Owner, es[0].pid)
				}
				if len(es) == 1 {
					cut++
				}
			default:
				fail(k, "%s, want completed or indeterminate", rec.Status)
			}
		}
	}
	if r.sc.Policy == idem.AtLeastOnce && !r.sc.Transactional && dups > cut {
		t.Errorf("%d duplicates, more than the %d effects cut by a kill", dups, cut)
	}
	storeErrs, _ := os.ReadFile(filepath.Join(r.dir, "store-errors"))
	failed := map[string]int{}
	for op := range strings.FieldsSeq(string(storeErrs)) {
		failed[op]++
	}
	var seen []string
	if !r.sc.Transactional {
		seen = append(seen, fmt.Sprintf("failed store calls: claim=%d finish=%d extend=%d get=%d;", failed["claim"], failed["finish"], failed["extend"], failed["get"]))
	}
	seen = append(seen, "ledger log:")
	for _, o := range []string{"store-error", "store-error:claim", "store-error:claim-tx", "store-error:complete", "heartbeat-failed", "lease-ran-out", "lease-lost", "claim-undone", "claim-lost", "takeover", "indeterminate"} {
		seen = append(seen, o+"="+strconv.Itoa(logged[o]))
	}
	t.Logf("chaos %s %s: keys=%d effects=%d duplicates=%d kills=%d effects-cut-by-kills=%d indeterminate=%d faults=%d (%s, %d failed) workers-started=%d duration=%s; %s",
		storeName(), r.sc, r.keys, total, dups, kills, cut, indeterminate, r.cuts.Load(), r.tg.Faults, r.faultE.Load(),
		len(r.ended), took.Round(100*time.Millisecond), strings.Join(seen, " "))
}

// entryByCorr returns the journal entry of rec's attempt whose correlation
// id is corr: the attempt of the Do call that made an effect.
func entryByCorr(rec store.Record, corr string) (store.JournalEntry, bool) {
	for _, e := range rec.Journal {
		if e.Correlation == corr && !e.Decision {
			return e, true
		}
	}
	return store.JournalEntry{}, false
}

func owner(pid int) string { return "chaos-" + strconv.Itoa(pid) }

func pidOf(owner string) int {
	pid, _ := strconv.Atoi(strings.TrimPrefix(owner, "chaos-"))
	return pid
}

func keyName(i int) string { return "chaos:" + strconv.Itoa(i) }

// storeName names the store under test: the test binary's package
// ("pgstore" of pgstore.test).
func storeName() string { return strings.TrimSuffix(filepath.Base(os.Args[0]), ".test") }

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// work plays a worker: it delivers every key until each is terminal.
func work(t *testing.T, tg Target, sc Scenario) {
	nsInt := func(name string) int64 {
		n, err := strconv.ParseInt(os.Getenv(name), 10, 64)
		if err != nil {
			t.Fatalf("chaostest worker: %s: %v", name, err)
		}
		return n
	}
	keys := int(nsInt(envKeys))
	lease, err := time.ParseDuration(os.Getenv(envLease))
	if err != nil {
		t.Fatalf("chaostest worker: %s: %v", envLease, err)
	}
	start := time.Unix(0, nsInt(envStart))
	spread, err := time.ParseDuration(os.Getenv(envSpread))
	if err != nil {
		t.Fatalf("chaostest worker: %s: %v", envSpread, err)
	}
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, nsInt(envDeadline)))
	defer cancel()
	pid := os.Getpid()
	me := strconv.Itoa(pid)

	var s store.Store
	for {
		if s, err = tg.Open(ctx, os.Getenv(envLocator), os.Getenv(envConnName)); err == nil {
			break
		}
		if !sleep(ctx, 50*time.Millisecond) {
			t.Fatalf("chaostest worker: opening the store: %v", err)
		}
	}
	defer s.Close()
	f, err := os.OpenFile(filepath.Join(os.Getenv(envDir), "effects"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The ledger's warnings and errors (store errors, failed heartbeats,
	// claims undone, takeovers), one O_APPEND write a line, for the
	// figures and for a failing check to show a key's story.
	lf, err := os.OpenFile(filepath.Join(os.Getenv(envDir), "ledger.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	log := slog.New(slog.NewTextHandler(lf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if !sc.Transactional { // DoTx needs the store's own type
		ef, err := os.OpenFile(filepath.Join(os.Getenv(envDir), "store-errors"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer ef.Close()
		s = counting{Store: s, f: ef}
	}
	l := idem.New(s, idem.WithOwner(owner(pid)), idem.WithLease(lease), idem.WithPolicy(sc.Policy), idem.WithLogger(log))

	var (
		mu      sync.Mutex
		done    = make([]bool, keys)
		left    = keys
		counts  = map[string]int{}
		fatal   error
		arrived = func() int {
			if spread <= 0 {
				return keys
			}
			return min(keys, int(float64(keys)*float64(time.Since(start))/float64(spread))+1)
		}
	)
	next := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if left == 0 || fatal != nil {
			return 0, false
		}
		n := max(arrived(), 0)
		var open []int
		for i := range n {
			if !done[i] {
				open = append(open, i)
			}
		}
		if len(open) == 0 {
			return -1, true
		}
		return open[rand.N(len(open))], true
	}
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for {
				i, ok := next()
				if !ok {
					return
				}
				if i < 0 { // the keys that arrived are done: wait for more
					if !sleep(ctx, 20*time.Millisecond) {
						mu.Lock()
						fatal = errors.New("the worker's deadline passed while keys were still to arrive")
						mu.Unlock()
						return
					}
					continue
				}
				key := keyName(i)
				corr := strconv.FormatUint(rand.Uint64(), 36)
				var err error
				if sc.Transactional {
					_, err = tg.DoTx(ctx, os.Getenv(envLocator), l, key, me, idem.WithCorrelationID(corr))
				} else {
					_, err = l.Do(ctx, idem.RawKey(key), func(context.Context) ([]byte, error) {
						time.Sleep(rand.N(claimWindow))
						if _, err := f.Write([]byte(key + " " + me + " " + corr + "\n")); err != nil {
							return nil, idem.Permanent(err)
						}
						time.Sleep(rand.N(effectWindow)) // a kill may land here
						return []byte(me), nil
					}, idem.WithCorrelationID(corr))
				}
				var ip *idem.InProgressError
				terminal := false
				switch {
				case err == nil, errors.Is(err, idem.ErrIndeterminate) && sc.Policy == idem.AtMostOnce:
					terminal = true
				case errors.As(err, &ip):
					sleep(ctx, min(ip.RetryAfter, 20*time.Millisecond+rand.N(30*time.Millisecond)))
				case errors.Is(err, idem.ErrLeaseLost), isStoreError(err),
					// fn's own error under DoTx (its statement met the cut
					// connection): rolled back, delivered again.
					sc.Transactional && !errors.Is(err, idem.ErrMismatch) && !errors.Is(err, idem.ErrFailed) && !errors.Is(err, idem.ErrCorrupt):
					sleep(ctx, 10*time.Millisecond+rand.N(20*time.Millisecond))
				default:
					mu.Lock()
					fatal = fmt.Errorf("Do(%q): %w", key, err)
					mu.Unlock()
					return
				}
				mu.Lock()
				if err != nil {
					counts[errName(err)]++
				}
				if terminal && !done[i] {
					done[i] = true
					left--
				}
				mu.Unlock()
				if ctx.Err() != nil {
					mu.Lock()
					fatal = fmt.Errorf("the worker's deadline passed with %d keys left", left)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if fatal != nil {
		t.Fatalf("chaostest worker %d: %v", pid, fatal)
	}
	fmt.Printf("chaostest worker %d: every key terminal; errors met: %v\n", pid, counts)
}

func isStoreError(err error) bool {
	var se *idem.StoreError
	return errors.As(err, &se)
}

func errName(err error) string {
	switch {
	case errors.Is(err, idem.ErrInProgress):
		return "in-progress"
	case errors.Is(err, idem.ErrIndeterminate):
		return "indeterminate"
	case errors.Is(err, idem.ErrLeaseLost):
		return "lease-lost"
	case isStoreError(err):
		return "store"
	}
	return "other"
}

// counting is the worker's store: it appends the name of every call that
// failed (the store's error, not a refusal such as ErrLeaseLost) to a
// file, so the figures say how many of the faults reached the Ledger.
type counting struct {
	store.Store
	f *os.File
}

func (c counting) note(op string, err error) {
	if err != nil && !errors.Is(err, store.ErrLeaseLost) && !errors.Is(err, store.ErrNotFound) {
		_, _ = c.f.Write([]byte(op + "\n"))
	}
}

func (c counting) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	cr, err := c.Store.Claim(ctx, req)
	c.note("claim", err)
	return cr, err
}

func (c counting) Finish(ctx context.Context, req store.FinishRequest) error {
	err := c.Store.Finish(ctx, req)
	c.note("finish", err)
	return err
}

func (c counting) Extend(ctx context.Context, req store.ExtendRequest) (time.Time, error) {
	until, err := c.Store.Extend(ctx, req)
	c.note("extend", err)
	return until, err
}

func (c counting) Get(ctx context.Context, key string) (store.Record, error) {
	rec, err := c.Store.Get(ctx, key)
	c.note("get", err)
	return rec, err
}
