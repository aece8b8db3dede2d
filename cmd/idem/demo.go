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

  - a queue of receipt jobs, each delivered 1 to 3 times (the broker
    redelivering a message, the upstream enqueueing the job again under a
    new message id);
  - two concurrent consumers calling ledger.Do with the key
    idem.Key("receipt", orderID, userID) and a "send the email" function
    that records each send in a simulated mail provider;
  - a crash between "email sent" and "recorded" on one key under
    AtLeastOnce and on one under AtMostOnce: the attempt claims the key and
    sends, then its process is gone and nothing more reaches the store.

It prints the deliveries, the emails sent per key (one each, except the key
that crashed under AtLeastOnce: its lease lapsed and the next delivery took
over and sent again), the duplicates suppressed and the busy retries, then
'idem explain' of that key, 'idem ls --stuck' showing the AtMostOnce key
indeterminate, and 'idem resolve' deciding it.

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
	fmt.Fprintf(out, "%d receipt jobs, key idem.Key(\"receipt\", orderID, userID); %d consumers; lease %s\n",
		sum.Orders, 2, cfg.Lease)
	fmt.Fprintf(out, "queue: %d messages (%d redelivered with the same message id, %d re-enqueued with a new one)\n",
		sum.Messages, sum.SameID, sum.NewID)
	fmt.Fprintln(out, `crashes injected between "email sent" and "recorded":`)
	for _, c := range sum.Crashes {
		fmt.Fprintf(out, "  %s\n", c)
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "deliveries handled     %3d  (%d messages, %d after the crashes, %d busy retries) in %s\n",
		sum.Deliveries, sum.Messages, sum.AfterCrash, sum.BusyRetries, sum.Took.Round(time.Millisecond))
	fmt.Fprintf(out, "emails sent            %3d  for %d orders\n", sum.Sent, sum.Orders)
	fmt.Fprintf(out, "duplicates suppressed  %3d  skipped, already done: the stored result replayed\n", sum.Replayed)
	fmt.Fprintf(out, "busy retries           %3d  another consumer held the key: put back with its Retry-After\n", sum.BusyRetries)
	fmt.Fprintf(out, "takeovers              %3d  %s\n", sum.Takeovers, strings.Join(sum.TakeoverKeys, ", "))
	fmt.Fprintf(out, "indeterminate          %3d  deliveries of %s refused and left for an operator\n", sum.Indeterminate, sum.CrashedAtMostOnce)
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
