package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/explain"
	"github.com/idemkit/idem/store"
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
'idem inspect --json' without the journal).

A record the store cannot decode is listed in its place with the state
CORRUPT (in JSON: {"key":...,"state":"corrupt","error":...}), whatever
--status, and ls goes on past it; after the listing it names each corrupt
record on stderr and exits 1. 'idem delete KEY --force' removes one.`,
	exits: `  0  ok (also when nothing matches)
  1  the store failed, or a record is corrupt (listed, then named on stderr)
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
	q := store.ListQuery{After: *after, Stuck: *stuck}
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
	var corrupt []*idem.CorruptError
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
		last = r.rec.Key
		if r.corrupt != nil {
			corrupt = append(corrupt, r.corrupt)
		}
		switch {
		case *asJSON && r.corrupt != nil:
			err = writeJSON(a.stdout, corruptJSON{Key: r.corrupt.Key, State: stateCorrupt, Error: r.corrupt.Error()})
		case *asJSON:
			err = writeJSON(a.stdout, toJSON(&r.rec, now, false))
		case r.corrupt != nil:
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\n", r.corrupt.Key, strings.ToUpper(stateCorrupt))
		default:
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", r.rec.Key, explain.StateOf(&r.rec, now), r.rec.Fence, r.rec.Attempt, orDash(r.rec.Owner),
				rel(r.rec.UpdatedAt, now), rel(r.rec.ExpiresAt, now))
			if n%500 == 0 {
				err = tw.Flush()
			}
		}
		if err != nil {
			return err
		}
	}
	if *asJSON {
		if n == *limit && n > 0 {
			if _, more, err := it.next(ctx); err == nil && more {
				fmt.Fprintf(a.stderr, "more records follow: idem ls --after %q ...\n", last)
			}
		}
		return corruptErr(corrupt)
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
	return corruptErr(corrupt)
}

// stateCorrupt is the state ls shows for a record the store cannot decode
// (CORRUPT in the table, "corrupt" in JSON).
const stateCorrupt = "corrupt"

// corruptJSON is a corrupt record in ls --json.
type corruptJSON struct {
	Key   string `json:"key"`
	State string `json:"state"`
	Error string `json:"error"`
}

// corruptErr is the error ls ends with when it listed corrupt records
// (exit 1, after the listing).
func corruptErr(cs []*idem.CorruptError) error {
	if len(cs) == 0 {
		return nil
	}
	var b strings.Builder
	if len(cs) == 1 {
		b.WriteString("1 record is corrupt (listed as CORRUPT):")
	} else {
		fmt.Fprintf(&b, "%d records are corrupt (listed as CORRUPT):", len(cs))
	}
	for _, c := range cs {
		fmt.Fprintf(&b, "\n  %s", c.Error())
	}
	b.WriteString("\nevery claim of such a key fails until its record is removed: 'idem delete KEY --force' removes it (the key's next delivery then runs as a new operation)")
	return &codeError{exitError, errors.New(b.String())}
}

// listed is one row of ls: a record, or a record the store cannot decode.
type listed struct {
	rec     idem.Record
	corrupt *idem.CorruptError // rec is only the key's zero record
}

// lister pages through Store.List, keeping the records whose derived state
// is want (any when want is ""). A corrupt record does not end the
// listing: the store fails the whole page that holds it, so the lister
// finds the records before it (see skipCorrupt), returns it as a row of
// its own, whatever want, and lists on after it.
type lister struct {
	s    store.Store
	q    store.ListQuery
	now  time.Time
	want explain.State
	page int
	buf  []listed
	done bool
}

func (l *lister) next(ctx context.Context) (listed, bool, error) {
	for {
		for len(l.buf) > 0 {
			r := l.buf[0]
			l.buf = l.buf[1:]
			if r.corrupt != nil || l.want == "" || explain.StateOf(&r.rec, l.now) == l.want {
				return r, true, nil
			}
		}
		if l.done {
			return listed{}, false, nil
		}
		recs, err := l.list(ctx, l.page)
		var ce *idem.CorruptError
		if errors.As(err, &ce) && ce.Key > l.q.After {
			l.buf, err = l.skipCorrupt(ctx, ce)
			if err != nil {
				return listed{}, false, fmt.Errorf("listing records: %w", err)
			}
			l.q.After = l.buf[len(l.buf)-1].corrupt.Key
			continue
		}
		if err != nil {
			return listed{}, false, fmt.Errorf("listing records: %w", err)
		}
		if len(recs) < l.page {
			l.done = true
		}
		if len(recs) > 0 {
			l.q.After = recs[len(recs)-1].Key
		}
		l.buf = l.buf[:0]
		for _, r := range recs {
			l.buf = append(l.buf, listed{rec: r})
		}
	}
}

func (l *lister) list(ctx context.Context, limit int) ([]idem.Record, error) {
	q := l.q
	q.Limit = limit
	return l.s.List(ctx, q)
}

// skipCorrupt returns the rows from l.q.After up to and including the
// first corrupt record, given that a page of l.page records failed on the
// corrupt record bad. It halves the page until it finds the longest one
// that lists without error (about log2(l.page) calls): those records come
// before the first corrupt one, which ends the longest page plus one.
func (l *lister) skipCorrupt(ctx context.Context, bad *idem.CorruptError) ([]listed, error) {
	var good []idem.Record
	lo, hi := 0, l.page // a page of lo records lists, one of hi fails
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		recs, err := l.list(ctx, mid)
		var ce *idem.CorruptError
		switch {
		case err == nil:
			lo, good = mid, recs
		case errors.As(err, &ce) && ce.Key > l.q.After:
			hi, bad = mid, ce
		default:
			return nil, err
		}
	}
	rows := make([]listed, 0, len(good)+1)
	for _, r := range good {
		if r.Key < bad.Key {
			rows = append(rows, listed{rec: r})
		}
	}
	return append(rows, listed{rec: idem.Record{Key: bad.Key}, corrupt: bad}), nil
}
