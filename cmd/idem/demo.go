package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/demo"
	"github.com/idemkit/idem/cmd/idem/internal/storeurl"
)

var demoCmd = &command{
	name:     "demo",
	synopsis: "[--orders N] [--seed N] [--lease D] [--keep] [--store URL]",
	summary:  "run the receipts worker with redeliveries and crashes, then explain",
	help: `
Demo runs the receipts worker of "Preventing Duplicate Sends" on a fresh
embedded store (SQLite in a temporary directory, removed afterwards; an
explicit --store uses that store instead, creating its PostgreSQL table if
missing, and IDEM_STORE is ignored here so the demo never writes to your
real store by accident):

  - receipt jobs published to a queue: sqlqueue in the store's own SQLite
    file (an in-process memqueue on another store), some jobs enqueued
    again upstream under a new message id;
  - two queue.Consumer workers keying each job
    idem.Key("receipt", orderID, userID) and sending the email through a
    simulated mail provider;
  - two more workers that receive a job, claim its key, send, and die
    before recording it or acking the message, one job under AtLeastOnce
    and one under AtMostOnce.

It prints the deliveries (read off the consumers' own log lines), the
emails sent per key (one each, except the key that crashed under
AtLeastOnce: its lease lapsed and the broker's redelivery took over and
sent again), the duplicates suppressed, the busy retries, the AtMostOnce
key refused as indeterminate and dead-lettered, the consumers' log lines
for the two crashed keys, then 'idem explain' of the first key, 'idem ls
--stuck' showing the second one indeterminate, and 'idem resolve'
deciding it.

It checks those numbers and exits 1 if idem did not keep its promise.`,
	exits: `  0    the demo ran and every number was as idem promises
  1    the store failed, or a key was sent a number of times idem does not allow
  2    usage error
  130  interrupted (Ctrl-C)`,
	run: runDemo,
}

func runDemo(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	cfg := demo.Config{Lease: 300 * time.Millisecond}
	fs.IntVar(&cfg.Orders, "orders", 20, "how many receipt jobs (`N`, at least 7)")
	seed := fs.Uint64("seed", 1, "seed of the queue's duplicates (`N`)")
	fs.Var(durationValue{&cfg.Lease}, "lease", "the ledger's lease (`D`); the crashed attempts lapse after it")
	keep := fs.Bool("keep", false, "keep the temporary store and print its --store URL, to look at it with the other commands")
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

	url := a.storeURL
	if !a.storeExplicit {
		dir, err := os.MkdirTemp("", "idem-demo-")
		if err != nil {
			return err
		}
		if !*keep {
			defer os.RemoveAll(dir)
		}
		url = "sqlite:" + filepath.Join(dir, "idem.db")
	}
	if a.store == nil {
		s, err := a.stores.Open(ctx, url, storeurl.Options{})
		if err != nil {
			return err
		}
		defer s.Close() // before the temporary directory is removed
		a.store = s
	}
	cfg.Store = a.store

	out := a.stdout
	fmt.Fprintf(out, "idem demo: the receipts worker of seed 000 on %s\n", storeurl.Redact(url))
	sum, err := demo.Run(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%d receipt jobs, key idem.Key(\"receipt\", orderID, userID); %d more re-enqueued upstream under a new message id\n",
		sum.Orders, sum.Reenqueued)
	fmt.Fprintf(out, "queue: %s, visibility %s; %d queue.Consumer workers, lease %s\n", sum.Queue, cfg.Visibility, 2, cfg.Lease)
	fmt.Fprintln(out, `crashes injected between "email sent" and "recorded":`)
	for _, c := range sum.Crashes {
		fmt.Fprintf(out, "  %s\n", c)
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "deliveries handled     %3d  (%d messages published, %d handed out again: %d crashed, %d busy retries, %d other retries) in %s\n",
		sum.Deliveries, sum.Published, sum.Redelivered, sum.Redelivered-sum.BusyRetries-sum.Retries, sum.BusyRetries, sum.Retries, sum.Took.Round(time.Millisecond))
	fmt.Fprintf(out, "emails sent            %3d  for %d orders\n", sum.Sent, sum.Orders)
	fmt.Fprintf(out, "duplicates suppressed  %3d  skipped, already done: the stored result replayed, the message acked\n", sum.Replayed)
	fmt.Fprintf(out, "busy retries           %3d  another worker held the key: put back with its Retry-After\n", sum.BusyRetries)
	fmt.Fprintf(out, "takeovers              %3d  %s\n", sum.Takeovers, strings.Join(sum.TakeoverKeys, ", "))
	fmt.Fprintf(out, "indeterminate          %3d  deliveries of %s refused, then dead-lettered (%d) for an operator\n",
		sum.Indeterminate, sum.CrashedAtMostOnce, len(sum.DeadLettered))
	fmt.Fprintln(out)
	fmt.Fprintln(out, "the consumers' log lines for the crashed keys (one per delivery):")
	for _, ln := range sum.Lines {
		if ln.Key == sum.CrashedAtLeastOnce || ln.Key == sum.CrashedAtMostOnce {
			fmt.Fprintf(out, "  %s\n", demoLogLine(ln.Text))
		}
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "sends per key (receipt:ORDER:USER):")
	var cells []string
	for _, k := range sum.Keys {
		cells = append(cells, fmt.Sprintf("%s=%d", strings.TrimPrefix(k, "receipt:"), sum.Sends[k]))
	}
	for chunk := range slices.Chunk(cells, 7) {
		fmt.Fprintf(out, "  %s\n", strings.Join(chunk, "  "))
	}
	fmt.Fprintf(out, "  %s sent %d: crashed under at_least_once; its lease lapsed and the next delivery took over and sent again\n",
		sum.CrashedAtLeastOnce, sum.Sends[sum.CrashedAtLeastOnce])
	fmt.Fprintf(out, "  %s sent %d: crashed under at_most_once; never sent again, indeterminate until resolved\n",
		sum.CrashedAtMostOnce, sum.Sends[sum.CrashedAtMostOnce])

	sub := func(c *command, args ...string) error {
		fmt.Fprintf(out, "\n$ idem %s %s\n", c.name, strings.Join(quoteArgs(args), " "))
		prev := a.cmd
		a.cmd = c
		defer func() { a.cmd = prev }()
		return c.run(ctx, a, args)
	}
	if err := sub(explainCmd, sum.CrashedAtLeastOnce); err != nil {
		return err
	}
	if err := sub(lsCmd, "--stuck"); err != nil {
		return err
	}
	var result string
	if m := sum.Outbox[sum.CrashedAtMostOnce]; len(m) > 0 {
		result = m[0].ProviderID
	}
	if err := sub(resolveCmd, sum.CrashedAtMostOnce, "--done", "--result", result,
		"--reason", "provider log shows "+result+" accepted"); err != nil {
		return err
	}
	// One more delivery of that job now replays the decision.
	l := idem.New(a.store, idem.WithLogger(slog.New(slog.DiscardHandler)))
	res, err := l.Do(ctx, idem.RawKey(sum.CrashedAtMostOnce), func(context.Context) ([]byte, error) {
		return nil, fmt.Errorf("must not run")
	}, idem.WithPolicy(idem.AtMostOnce))
	if err != nil {
		return fmt.Errorf("redelivering %s after resolving it: %w", sum.CrashedAtMostOnce, err)
	}
	fmt.Fprintf(out, "a later delivery of %s: skipped, already done (replayed %q)\n", sum.CrashedAtMostOnce, res.Value)

	if *keep && !a.storeExplicit {
		fmt.Fprintf(out, "\nthe store is kept: idem --store %s ls\n", url)
	}
	if err := sum.Check(); err != nil {
		return fmt.Errorf("idem did not keep its promise:\n%w", err)
	}
	return nil
}

// demoLogLine shortens a consumer's log line for the demo's output: the
// reason, which repeats what the outcome says, goes.
func demoLogLine(s string) string {
	if i := strings.Index(s, " reason="); i >= 0 {
		s = s[:i]
	}
	return s
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, s := range args {
		if s == "" || strings.ContainsAny(s, " '\"$\\") {
			s = "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
		}
		out[i] = s
	}
	return out
}
