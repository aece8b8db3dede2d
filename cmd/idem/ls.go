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
	synopsis: "[--status S] [--stuck] [--indeterminate] [--prefix P] [--updated-after T] [--updated-before T] [--limit N] [--after KEY] [--json]",
	summary:  "list records, one line each (--stuck: lapsed and indeterminate keys)",
	help: `
Ls lists records in key order, one line each: key, state, fence, attempt,
owner, when it was last updated and when it expires. The state is the
stored status, except for an in_progress record whose lease has passed: it
shows as "lapsed" (at_least_once: the next claim takes it over) or
"indeterminate" (at_most_once: waiting for 'idem resolve').

--status S lists the records in state S as the STATE column shows it:
in_progress only those whose lease is live. --stuck lists just the lapsed
and indeterminate keys: the ones a crash left behind; --indeterminate just
the indeterminate ones. --prefix P lists the keys that begin with P.
--updated-after T and --updated-before T list the records whose last
change is after (before) T: a time in RFC 3339 (2026-01-02T15:04:05Z) or
a duration ago by the store's clock (90m, 2d). When more records match
than --limit, ls says how to continue (--after the last key shown).

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
	indeterminate := fs.Bool("indeterminate", false, "only indeterminate keys (at_most_once, lease passed, waiting for 'idem resolve')")
	prefix := fs.String("prefix", "", "only keys that begin with `P`")
	updatedAfter := fs.String("updated-after", "", "only records last changed after `T` (RFC 3339, or a duration ago: 1h, 2d)")
	updatedBefore := fs.String("updated-before", "", "only records last changed before `T` (RFC 3339, or a duration ago: 1h, 2d)")
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
	q, want, err := listFilter("--status", *status, *stuck, *indeterminate)
	if err != nil {
		return usagef("%s", err)
	}
	q.After, q.Prefix = *after, *prefix

	s, err := a.open(ctx)
	if err != nil {
		return err
	}
	now, err := storeNow(ctx, s)
	if err != nil {
		return err
	}
	if q.UpdatedAfter, err = timeBound(*updatedAfter, now); err != nil {
		return usagef("--updated-after: %s", err)
	}
	if q.UpdatedBefore, err = timeBound(*updatedBefore, now); err != nil {
		return usagef("--updated-before: %s", err)
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

// listFilter is the store query and the derived state to keep (any when
// "") for a listing by status (a state as ls's STATE column shows it:
// in_progress, completed, failed, released, lapsed or indeterminate),
// stuck (lapsed and indeterminate keys) and indeterminate: the filters
// 'idem ls' and serve's GET /v1/records share. The error says which
// values do not go together.
//
// name is how the caller's user names the status filter ("--status").
func listFilter(name, status string, stuck, indeterminate bool) (store.ListQuery, explain.State, error) {
	q := store.ListQuery{Stuck: stuck, Indeterminate: indeterminate}
	var want explain.State
	switch st := explain.State(status); st {
	case "":
	case explain.StateLapsed:
		if indeterminate {
			return q, "", errors.New("indeterminate keys are not in state lapsed (at_least_once)")
		}
		q.Stuck, want = true, st
	case explain.StateIndeterminate:
		q.Indeterminate = true
	case explain.StateInProgress, explain.StateCompleted, explain.StateFailed, explain.StateReleased:
		if stuck || indeterminate {
			return q, "", fmt.Errorf("the stuck and indeterminate filters list keys whose lease passed; they cannot be combined with %s %s", name, st)
		}
		q.Status = idem.Status(st)
		if st == explain.StateInProgress {
			// As the STATE column says: a live lease, not the stored
			// in_progress of a lapsed or indeterminate key.
			want = st
		}
	default:
		return q, "", fmt.Errorf("unknown %s %q (want in_progress, completed, failed, released, lapsed or indeterminate)", name, status)
	}
	return q, want, nil
}

// timeBound parses a bound of the updated filters: "" (none), a time in
// RFC 3339, or a duration (as a flag takes it: 90m, 2d) before now.
func timeBound(v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	d, err := parseDuration(v)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q is neither a time in RFC 3339 (2026-01-02T15:04:05Z) nor a duration ago (90m, 2d)", v)
	}
	return now.Add(-d), nil
}

// stateCorrupt is the state ls shows for a record the store cannot decode
// (CORRUPT in the table, "corrupt" in JSON).
const stateCorrupt = "corrupt"

// corruptJSON is a corrupt record in ls --json.
type corruptJSON struct {
	Key     string `json:"key,omitempty"`
	KeyHash string `json:"key_hash,omitempty"` // serve --hash-keys: the key's hash, no key
	State   string `json:"state"`
	Error   string `json:"error"`
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
