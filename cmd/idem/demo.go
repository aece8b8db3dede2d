package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/cmd/idem/internal/demo"
	"github.com/idemkit/idem/cmd/idem/internal/storeurl"
	_ "modernc.org/sqlite" // the "sqlite" driver, to look at an earlier run's file
)

var demoCmd = &command{
	name:     "demo",
	synopsis: "[--orders N] [--seed N] [--lease D] [--store URL]",
	summary:  "run the receipts worker through crashes; leave a key to resolve",
	help: `
Demo runs the receipts worker of "Preventing Duplicate Sends" on the
embedded default: the SQLite file idem-demo.db in the working directory,
which it leaves there when it ends, so that the commands it prints at the
end can be run on it. Each run starts clean: it deletes the idem-demo.db
an earlier run left (and refuses to touch an idem-demo.db that holds no
idem store). An explicit --store uses that store instead (the demo picks
keys it does not hold yet; it creates a PostgreSQL table if missing);
IDEM_STORE is ignored here so the demo never writes to your real store by
accident.

  - receipt jobs published to a queue: sqlqueue in the store's own SQLite
    file (an in-process memqueue on another store), some jobs enqueued
    again by the sender under a new message id;
  - two queue.Consumer workers keying each job
    idem.Key("receipt", orderID, userID) and sending the email through a
    simulated mail provider;
  - two more workers that receive a job, claim its key, send, and die
    before recording it or acknowledging the message, one job under
    at_least_once and one under at_most_once.

It prints the messages and deliveries and what became of each (sent,
sent again after a crash, duplicate skipped, key busy, refused), the
emails sent, the workers' log lines for the two crashed keys, and
'idem explain' of the key that was emailed twice. The at_most_once key is
left indeterminate: the demo ends with the commands that list it
(ls --stuck), explain it and resolve it, ready to paste.

It checks those numbers and exits 1 if idem did not keep its promise.`,
	exits: `  0    the demo ran and every number was as idem promises
  1    the store failed, idem-demo.db holds something else, or a key was
       sent a number of times idem does not allow
  2    usage error
  130  interrupted (Ctrl-C)`,
	run: runDemo,
}

// demoFile is the database the demo leaves in the working directory.
const demoFile = "idem-demo.db"

func runDemo(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	cfg := demo.Config{Lease: 300 * time.Millisecond}
	fs.IntVar(&cfg.Orders, "orders", 20, "how many receipt jobs (`N`, at least 7)")
	seed := fs.Uint64("seed", 1, "which jobs the sender enqueues twice (`N`)")
	fs.Var(durationValue{&cfg.Lease}, "lease", "the ledger's lease (`D`); the crashed attempts lapse after it")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	cfg.Seed = *seed
	if cfg.Orders < 7 {
		return usagef("--orders must be at least 7, got %d", cfg.Orders)
	}
	if cfg.Lease < 10*time.Millisecond {
		return usagef("--lease must be at least 10ms")
	}
	cfg.Visibility = cfg.Lease * 5 / 3

	out := a.stdout
	url := a.storeURL
	var where string
	if a.storeExplicit {
		where = fmt.Sprintf("store: %s (the demo uses keys it does not hold yet)", storeurl.Redact(url))
	} else {
		url = "sqlite:" + demoFile
		replaced, err := clearDemoFile(demoFile)
		if err != nil {
			return err
		}
		dir, err := os.Getwd()
		if err != nil {
			return err
		}
		where = fmt.Sprintf("database: %s in %s, kept when the demo ends", demoFile, dir)
		if replaced {
			where += fmt.Sprintf("\n(the %s an earlier run left was deleted: each run starts clean)", demoFile)
		}
	}
	if a.store == nil {
		s, err := a.stores.Open(ctx, url, storeurl.Options{})
		if err != nil {
			return err
		}
		defer s.Close()
		a.store = s
	}
	cfg.Store = a.store

	fmt.Fprintln(out, "idem demo: order receipts sent through a queue by workers that sometimes crash")
	fmt.Fprintln(out, where)
	sum, err := demo.Run(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%d orders, one receipt email each, keyed idem.Key(\"receipt\", orderID, userID)\n", sum.Orders)
	fmt.Fprintf(out, "queue: %s; %d messages = %d jobs + %d duplicates the sender enqueued again + %d jobs enqueued again after the crashes\n",
		sum.Queue, sum.Published, sum.Orders, sum.Reenqueued, sum.CrashReenqueued)
	fmt.Fprintf(out, "workers: %d (queue.Consumer); a claim on a key lapses if not renewed for %s (the lease); a message not acknowledged within %s is delivered again\n",
		2, cfg.Lease, cfg.Visibility)
	fmt.Fprintf(out, "%d more workers crash after sending, before recording the send or acknowledging the message:\n", len(sum.Crashes))
	for _, c := range sum.Crashes {
		fmt.Fprintf(out, "  %s\n", c)
	}

	fmt.Fprintln(out)
	fmt.Fprintf(out, "%d deliveries in %s = %d messages + %d delivered again (%d not acknowledged by a crashed worker, %d put back to try again):\n",
		sum.Deliveries, sum.Took.Round(time.Millisecond), sum.Published, sum.Redelivered, len(sum.Crashes), sum.BusyRetries+sum.Retries)
	row := func(n int, format string, args ...any) {
		fmt.Fprintf(out, "%5d  %s\n", n, fmt.Sprintf(format, args...))
	}
	row(len(sum.Crashes), "to the workers that crashed: email sent, then the worker died")
	row(sum.Executed, "email sent and recorded, message acknowledged")
	row(sum.Takeovers, "email sent again: %s, whose crashed worker's claim had lapsed (at_least_once)", strings.Join(sum.TakeoverKeys, ", "))
	row(sum.Replayed, "duplicates skipped: already sent, the recorded result returned, message acknowledged")
	row(sum.BusyRetries, "key busy (another worker was sending it): message put back to try again")
	row(sum.Indeterminate, "refused: %s may have been sent by its crashed worker, and at_most_once never sends twice;",
		sum.CrashedAtMostOnce)
	fmt.Fprintf(out, "%5s  put back %d times, then its %d messages set aside (dead-lettered) for a person to decide\n",
		"", sum.Indeterminate-sum.IndeterminateDeadLettered, sum.IndeterminateDeadLettered)
	for _, o := range slices.Sorted(maps.Keys(sum.Other)) {
		row(sum.Other[o], "other: %s", o)
	}
	var twice []string
	for _, k := range sum.Keys {
		if n := sum.Sends[k]; n != 1 {
			twice = append(twice, fmt.Sprintf("%d for %s", n, k))
		}
	}
	except := ""
	if len(twice) > 0 {
		except = ", except " + strings.Join(twice, ", ")
	}
	fmt.Fprintf(out, "%d emails sent for %d orders = %d by the crashed workers + %d sent + %d sent again: one per order%s\n",
		sum.Sent, sum.Orders, len(sum.Crashes), sum.Executed, sum.Takeovers, except)

	fmt.Fprintln(out)
	fmt.Fprintln(out, "the workers' log lines for the two crashed keys, one per delivery:")
	for _, ln := range sum.Lines {
		if ln.Key == sum.CrashedAtLeastOnce || ln.Key == sum.CrashedAtMostOnce {
			fmt.Fprintf(out, "  %s\n", demoLogLine(ln.Text))
		}
	}

	prog := demoProg()
	shown := storeurl.Redact(url)
	cmdline := func(args ...string) string {
		return prog + " " + strings.Join(quoteArgs(append([]string{"--store", shown}, args...)), " ")
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "Why did %s get two emails? explain reads its record:\n", sum.CrashedAtLeastOnce)
	fmt.Fprintf(out, "$ %s\n", cmdline("explain", sum.CrashedAtLeastOnce))
	prev := a.cmd
	a.cmd = explainCmd
	err = explainCmd.run(ctx, a, []string{sum.CrashedAtLeastOnce})
	a.cmd = prev
	if err != nil {
		return err
	}

	var result string
	if m := sum.Outbox[sum.CrashedAtMostOnce]; len(m) > 0 {
		result = m[0].ProviderID
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "%s is left for you: its worker died after the email went out, and under at_most_once\n", sum.CrashedAtMostOnce)
	fmt.Fprintln(out, "idem neither sends it again nor guesses; it stays indeterminate until a person decides.")
	fmt.Fprintf(out, "The mail provider accepted %s for it (above), so it was sent: resolve it as done with that result.\n", result)
	switch {
	case strings.HasPrefix(url, "mem:"):
		fmt.Fprintln(out, "The store was in this process's memory and is gone; run the demo without --store to keep one on disk.")
	default:
		if shown != url {
			fmt.Fprintln(out, "Next (the password is hidden: put yours back in --store):")
		} else {
			fmt.Fprintln(out, "Next, in this directory:")
		}
		for _, c := range [][]string{
			{"ls", "--stuck"},
			{"explain", sum.CrashedAtMostOnce},
			{"resolve", sum.CrashedAtMostOnce, "--done", "--result", result, "--reason", "provider log shows " + result + " accepted"},
			{"ls", "--stuck"},
		} {
			fmt.Fprintf(out, "  %s\n", cmdline(c...))
		}
		fmt.Fprintf(out, "After the resolve, ls --stuck lists nothing and a delivery of %s is skipped as already sent.\n", sum.CrashedAtMostOnce)
		if !a.storeExplicit {
			fmt.Fprintf(out, "To start over, run the demo again: it deletes %s first.\n", demoFile)
		}
	}
	if err := sum.Check(); err != nil {
		return fmt.Errorf("idem did not keep its promise:\n%w", err)
	}
	return nil
}

// clearDemoFile deletes the database an earlier demo left at path (and
// SQLite's files beside it), and reports whether there was one. It
// refuses to delete a file that holds no idem store: that is not the
// demo's.
func clearDemoFile(path string) (bool, error) {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return false, err
	case fi.IsDir():
		return false, refused("%s is a directory, not the database an earlier demo left; move it away or run the demo in another directory", path)
	case fi.Size() > 0:
		if err := isIdemDatabase(path); err != nil {
			return false, refused("%s is not the database an earlier demo left (%v); move it away or run the demo in another directory", path, err)
		}
	}
	existed := err == nil
	for _, p := range []string{path, path + "-wal", path + "-shm", path + "-journal"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("starting clean: %w", err)
		}
	}
	return existed, nil
}

// isIdemDatabase returns nil if path is a SQLite database with idem's
// records table.
func isIdemDatabase(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	head := make([]byte, 16)
	_, err = io.ReadFull(f, head)
	f.Close()
	if err != nil || string(head) != "SQLite format 3\x00" {
		return errors.New("not a SQLite database")
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		return err
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'idem_records'`).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return errors.New("no idem_records table")
	}
	return nil
}

// demoProg is how the user ran this command, for the commands the demo
// prints: "go run ./cmd/idem" under go run in a checkout, else the
// program as it was called.
func demoProg() string {
	exe, _ := os.Executable()
	wd, _ := os.Getwd()
	module := ""
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" && !strings.HasSuffix(bi.Main.Version, "+dirty") {
		module = bi.Main.Path + "/cmd/idem@" + bi.Main.Version
	}
	return progName(os.Args[0], exe, os.Getenv("GOCACHE"), wd, module, func(p string) bool {
		_, err := os.Stat(p)
		return err == nil
	})
}

// progName is demoProg's answer for a program called as arg0, running
// from exe, in the working directory wd. Go run builds into a go-build*
// temporary directory or its build cache (GOCACHE, by default
// .../go-build); module is the module path at its version if the build
// knows one.
func progName(arg0, exe, gocache, wd, module string, exists func(string) bool) string {
	goRun := false
	for _, el := range strings.Split(filepath.ToSlash(filepath.Dir(exe)), "/") {
		goRun = goRun || strings.HasPrefix(el, "go-build")
	}
	if gocache != "" {
		if rel, err := filepath.Rel(gocache, exe); err == nil && !strings.HasPrefix(rel, "..") {
			goRun = true
		}
	}
	if !goRun {
		if arg0 == "" {
			return "idem"
		}
		return quoteArgs([]string{arg0})[0]
	}
	switch {
	case exists(filepath.Join(wd, "cmd", "idem", "main.go")):
		return "go run ./cmd/idem"
	case filepath.Base(wd) == "idem" && filepath.Base(filepath.Dir(wd)) == "cmd" && exists(filepath.Join(wd, "main.go")):
		return "go run ."
	case module != "":
		return "go run " + module
	}
	return "idem"
}

// demoLogLine shortens a consumer's log line for the demo's output: the
// reason, which repeats what the outcome says, goes.
func demoLogLine(s string) string {
	if i := strings.Index(s, " reason="); i >= 0 {
		s = s[:i]
	}
	return s
}

// quoteArgs quotes args for a POSIX shell: an argument with anything but
// letters, digits and _@%+=:,./- goes in single quotes.
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, s := range args {
		if s == "" || strings.IndexFunc(s, func(r rune) bool {
			return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("_@%+=:,./-", r))
		}) >= 0 {
			s = "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
		}
		out[i] = s
	}
	return out
}
