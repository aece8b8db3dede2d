package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/explain"
	"github.com/idemkit/idem/store"
)

var deleteCmd = &command{
	name:     "delete",
	synopsis: "[--force] KEY",
	summary:  "remove a key's record (a corrupt one, or a key to forget)",
	help: `
Delete removes KEY's record, whatever its state: the key is then absent,
and its next delivery runs the operation as a new one (attempt 1, at a
fence above every fence the key had; the journal is gone). It is for a record the store cannot decode, which
'idem ls' lists as CORRUPT and on which every claim fails, or for a key
that must be forgotten. To let a lapsed, indeterminate or failed key run
again, prefer 'idem resolve' or 'idem release': they keep its journal.

It refuses, unless --force:
  - a key whose lease is live: an attempt may still be running its effect,
    and the next delivery runs it again (the deleted attempt's own writes
    are refused: stop its worker first);
  - a completed key: its duplicates would run the effect again;
  - a corrupt record: its lease cannot be read, so an attempt may hold it.

The store's Delete takes no fence, so there is no --fence: the state is
checked just before the record is deleted, not in the same write.`,
	exits: `  0  deleted
  1  the store failed, or refused: the key is completed, or its record corrupt
  2  usage error
  3  no record for KEY
  4  refused: the key's lease is live (use --force)`,
	run: runDelete,
}

func runDelete(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	force := fs.Bool("force", false, "delete even if the key's lease is live, the key is completed, or its record is corrupt")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	key, err := keyArg(pos)
	if err != nil {
		return err
	}
	s, err := a.open(ctx)
	if err != nil {
		return err
	}
	rec, now, err := getRecord(ctx, s, key)
	var ce *idem.CorruptError
	corrupt := errors.As(err, &ce)
	switch {
	case corrupt && !*force:
		return refused("%v\nits lease cannot be read, so an attempt may still hold the key; use --force to delete the record", err)
	case corrupt:
	case err != nil:
		return err
	}
	var st explain.State
	if !corrupt {
		if st, err = checkDelete(&rec, now, *force, key); err != nil {
			return err
		}
	}
	if err := s.Delete(ctx, key); errors.Is(err, store.ErrNotFound) {
		return notFound(key)
	} else if err != nil {
		return err
	}
	if corrupt {
		fmt.Fprintf(a.stdout, "deleted %s (its record was corrupt: %s)\nthe next delivery runs it as a new operation\n", key, ce.Detail)
		return nil
	}
	fmt.Fprintf(a.stdout, "deleted %s (was %s: attempt %d, owner %s, fence %d)\nthe next delivery runs it as a new operation\n",
		key, st, rec.Attempt, orDash(rec.Owner), rec.Fence)
	if st == explain.StateInProgress {
		fmt.Fprintf(a.stdout, "attempt %d may still be running: its effect may still happen (its writes are refused from now on); stop its worker\n", rec.Attempt)
	}
	return nil
}

// checkDelete refuses, unless force, to delete a key whose lease is live or
// that is completed, as 'idem delete' and the console do; it returns the
// key's state. name is the key as messages show it.
func checkDelete(rec *idem.Record, now time.Time, force bool, name string) (explain.State, error) {
	st := explain.StateOf(rec, now)
	switch {
	case force:
	case st == explain.StateInProgress:
		return st, leaseLive("%q: attempt %d (owner %s) holds a live lease until %s (%s); it may still be running its effect. Wait for the lease to pass, or use --force",
			name, rec.Attempt, orDash(rec.Owner), stamp(rec.LeaseUntil), rel(rec.LeaseUntil, now))
	case st == explain.StateCompleted:
		return st, refused("%q is completed: deleting it makes the next delivery run its effect again; use --force if that is what you want", name)
	}
	return st, nil
}
