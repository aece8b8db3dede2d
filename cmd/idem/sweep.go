package main

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/cmd/idem/internal/explain"
)

var sweepCmd = &command{
	name:     "sweep",
	synopsis: "[--batch N] [--json]",
	summary:  "delete expired records, in batches, until none are left",
	help: `
Sweep deletes the records whose retention has passed (their expires_at is
before the store's clock), --batch at a time, until a batch finds none.
Expired records already behave as absent; sweeping reclaims their space
(and the space of keys no delivery will ever ask about again). Records
that have not expired are never touched, whatever their state.

On a terminal it shows progress on one updating line; it always ends with
a summary. Ctrl-C stops it cleanly between batches (what was deleted stays
deleted; run it again to continue).`,
	exits: `  0    done: no expired record left
  1    the store failed (the summary says how far it got)
  2    usage error
  130  interrupted (Ctrl-C) between batches`,
	run: runSweep,
}

type sweepSummary struct {
	Deleted     int     `json:"deleted"`
	Batches     int     `json:"batches"`
	Seconds     float64 `json:"seconds"`
	Interrupted bool    `json:"interrupted"`
	Error       string  `json:"error,omitempty"`
}

func runSweep(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	batch := fs.Int("batch", 1000, "delete at most `N` records per store call")
	asJSON := fs.Bool("json", false, "print the summary as JSON")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if *batch < 1 {
		return usagef("--batch must be at least 1, got %d", *batch)
	}
	s, err := a.open(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	var sum sweepSummary
	progress := a.stderrTTY && !*asJSON
	// A batch runs to its end even when Ctrl-C arrives during it: stopping
	// happens between batches.
	bctx := context.WithoutCancel(ctx)
	var serr error
	for {
		if ctx.Err() != nil {
			sum.Interrupted = true
			break
		}
		n, err := s.Sweep(bctx, *batch)
		if err != nil {
			serr = fmt.Errorf("sweeping (after %d deleted): %w", sum.Deleted, err)
			break
		}
		if n == 0 {
			break
		}
		sum.Deleted += n
		sum.Batches++
		if progress {
			fmt.Fprintf(a.stderr, "\r\033[Ksweeping: %d expired records deleted in %d batches (%s)", sum.Deleted, sum.Batches, explain.Dur(time.Since(start)))
		}
	}
	if progress && sum.Batches > 0 {
		fmt.Fprint(a.stderr, "\r\033[K")
	}
	took := time.Since(start)
	sum.Seconds = took.Seconds()
	if serr != nil {
		sum.Error = serr.Error()
	}
	if *asJSON {
		if err := writeJSON(a.stdout, sum); err != nil {
			return err
		}
	} else {
		batches := "batches"
		if sum.Batches == 1 {
			batches = "batch"
		}
		status := "no expired record left"
		switch {
		case sum.Interrupted:
			status = "interrupted; run it again to continue"
		case serr != nil:
			status = "stopped by a store error"
		}
		fmt.Fprintf(a.stdout, "swept %d expired records in %d %s (%s): %s\n", sum.Deleted, sum.Batches, batches, explain.Dur(took), status)
	}
	switch {
	case serr != nil:
		return serr
	case sum.Interrupted:
		return &codeError{exitInterrupted, nil}
	}
	return nil
}
