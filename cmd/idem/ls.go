package main

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/explain"
)

var lsCmd = &command{
	name:     "ls",
	synopsis: "[--status S] [--stuck] [--limit N] [--after KEY] [--json]",
	summary:  "list records, one line each (--stuck: lapsed and indeterminate keys)",
	help: `
Ls lists records in key order, one line each: key, state, fence, attempt,
owner, when it was last updated and when it expires. The state is the
stored status, except for an in_progress record whose lease has passed: it
shows as "lapsed" (at_least_once: the next claim takes it over) or
"indeterminate" (at_most_once: waiting for 'idem resolve').

--status S lists the records in state S as the STATE column shows it:
in_progress only those whose lease is live. --stuck lists just the lapsed
and indeterminate keys: the ones a crash left behind. When more records match than --limit, ls says how to continue
(--after the last key shown).

With --json it prints one JSON object per line (the fields of
'idem inspect --json' without the journal).`,
	exits: `  0  ok (also when nothing matches)
  1  the store failed
  2  usage error`,
	run: runLs,
}

func runLs(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	status := fs.String("status", "", "only records in state `S` (the STATE column): in_progress (lease live), completed, failed, released, lapsed or indeterminate")
	stuck := fs.Bool("stuck", false, "only lapsed and indeterminate keys (in_progress past their lease)")
	limit := fs.Int("limit", 100, "list at most `N` records; 0 lists all")
	after := fs.String("after", "", "only keys after `KEY` (continue an earlier listing)")
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if *limit < 0 {
		return usagef("--limit must be 0 (all) or more, got %d", *limit)
	}
	q := idem.ListQuery{After: *after, Stuck: *stuck}
	var want explain.State
	switch st := explain.State(*status); st {
	case "":
	case explain.StateLapsed, explain.StateIndeterminate:
		q.Stuck, want = true, st
	case explain.StateInProgress, explain.StateCompleted, explain.StateFailed, explain.StateReleased:
		if *stuck {
			return usagef("--stuck lists lapsed and indeterminate keys; it cannot be combined with --status %s", st)
		}
		q.Status = idem.Status(st)
		if st == explain.StateInProgress {
			// As the STATE column says: a live lease, not the stored
			// in_progress of a lapsed or indeterminate key.
			want = st
		}
	default:
		return usagef("unknown --status %q (want in_progress, completed, failed, released, lapsed or indeterminate)", *status)
	}

	s, err := a.open(ctx)
	if err != nil {
		return err
	}
	now, err := storeNow(ctx, s)
	if err != nil {
		return err
	}
	it := &lister{s: s, q: q, now: now, want: want, page: 500}
	if *limit > 0 {
		it.page = min(*limit, 500)
	}

	tw := newTable(a.stdout)
	if !*asJSON {
		fmt.Fprintln(tw, "KEY\tSTATE\tFENCE\tATTEMPT\tOWNER\tUPDATED\tEXPIRES")
	}
	n := 0
	last := ""
	for *limit == 0 || n < *limit {
		r, ok, err := it.next(ctx)
		if err != nil {
			tw.Flush()
			return err
		}
		if !ok {
			break
		}
		n++
		last = r.Key
		if *asJSON {
			if err := writeJSON(a.stdout, toJSON(&r, now, false)); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", r.Key, explain.StateOf(&r, now), r.Fence, r.Attempt, orDash(r.Owner),
			rel(r.UpdatedAt, now), rel(r.ExpiresAt, now))
		if n%500 == 0 {
			if err := tw.Flush(); err != nil {
				return err
			}
		}
	}
	if *asJSON {
		if n == *limit && n > 0 {
			if _, more, err := it.next(ctx); err == nil && more {
				fmt.Fprintf(a.stderr, "more records follow: idem ls --after %q ...\n", last)
			}
		}
		return nil
	}
	if n == 0 {
		// The header was never flushed.
		fmt.Fprintln(a.stdout, "no records match")
		return nil
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if n == *limit {
		if _, more, err := it.next(ctx); err != nil {
			return err
		} else if more {
			fmt.Fprintf(a.stdout, "(%d shown; more follow: idem ls --after %q ...)\n", n, last)
		}
	}
	return nil
}

// lister pages through Store.List, keeping the records whose derived state
// is want (any when want is "").
type lister struct {
	s    idem.Store
	q    idem.ListQuery
	now  time.Time
	want explain.State
	page int
	buf  []idem.Record
	done bool
}

func (l *lister) next(ctx context.Context) (idem.Record, bool, error) {
	for {
		for len(l.buf) > 0 {
			r := l.buf[0]
			l.buf = l.buf[1:]
			if l.want == "" || explain.StateOf(&r, l.now) == l.want {
				return r, true, nil
			}
		}
		if l.done {
			return idem.Record{}, false, nil
		}
		q := l.q
		q.Limit = l.page
		recs, err := l.s.List(ctx, q)
		if err != nil {
			return idem.Record{}, false, fmt.Errorf("listing records: %w", err)
		}
		if len(recs) < l.page {
			l.done = true
		}
		if len(recs) > 0 {
			l.q.After = recs[len(recs)-1].Key
		}
		l.buf = recs
	}
}
