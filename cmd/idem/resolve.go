package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/explain"
	"github.com/idemkit/idem/store"
)

var releaseCmd = &command{
	name:     "release",
	synopsis: "[--fence N] [--force] [--reason TEXT] [--by NAME] [--json] KEY",
	summary:  "make a key claimable again (the next delivery runs it)",
	help: `
Release makes KEY claimable at once: the next delivery runs the operation
again, as the next attempt (the fence grows, so the attempt that held the
key is refused if it ever finishes). Use it for a lapsed or indeterminate
key whose effect did not happen, or to retry a key that failed for good.

It refuses a key whose lease is live (an attempt may still be running and
sending) unless --force, and a completed key (releasing it repeats its
effect) unless --force. --fence N acts only if the key is still at fence N,
the attempt you inspected; if it moved on, nothing is changed.

Release is 'idem resolve KEY --not-done' by another name.`,
	exits: `  0  released (or already released)
  1  the store failed, or refused: the key is completed, or moved past --fence
  2  usage error
  3  no record for KEY
  4  refused: the key's lease is live (use --force)`,
	run: runRelease,
}

var resolveCmd = &command{
	name:     "resolve",
	synopsis: "--done [--result STRING | --result-file F] [--retention D] | --not-done [--fence N] [--force] [--reason TEXT] [--by NAME] [--json] KEY",
	summary:  "decide an indeterminate key: its effect happened (--done) or not (--not-done)",
	help: `
Resolve records an operator's decision on a key whose attempt never
finished: typically an at_most_once key left indeterminate by a crash
between the effect and its record ('idem ls --stuck' lists them). Look the
effect up first (the mail provider's log, the payment), then:

  --done      the effect happened: the key becomes completed, and duplicates
              get the result given by --result or --result-file (empty by
              default), kept for --retention.
  --not-done  it did not: the key is released and the next delivery runs it.

Keys of the HTTP middleware (httpidem, http:...) and of webhook receivers
(accept:SOURCE:EVENT) replay only answers they recorded themselves, and an
operator's --result is not one. After --done, an HTTP key's retries get 422
response-not-kept (done; no response to replay) and the handler does not
run again; a webhook key's retries get 200 with the usual accepted body
(no message id), and the event is not queued again.

The fence grows, so the attempt that held the key is refused if it ever
finishes. Resolve refuses a key whose lease is live (an attempt may still be
running) unless --force, and a key that is not in progress (completed,
failed, released) unless --force. --fence N acts only if the key is still at
fence N, the attempt you inspected. --reason is recorded in the record and
its journal.`,
	exits: `  0  resolved
  1  the store failed, or refused: the key is not in progress, or moved past --fence
  2  usage error
  3  no record for KEY
  4  refused: the key's lease is live (use --force)`,
	run: runResolve,
}

type decision struct {
	key    string
	fence  int64
	force  bool
	res    store.ResolveRequest
	asJSON bool
}

func decisionFlags(fs *flag.FlagSet, d *decision, force string) {
	fs.Int64Var(&d.fence, "fence", 0, "act only if the key is still at fence `N`, the attempt you inspected")
	fs.BoolVar(&d.force, "force", false, force)
	fs.StringVar(&d.res.Reason, "reason", "", "record `TEXT` as the reason, in the record and its journal")
	fs.StringVar(&d.res.By, "by", operator(), "record `NAME` in the journal as who decided")
	fs.BoolVar(&d.asJSON, "json", false, "print the record after the change as JSON")
}

func runRelease(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	var d decision
	decisionFlags(fs, &d, "release even if the key's lease is live, or the key is completed")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if d.key, err = keyArg(pos); err != nil {
		return err
	}
	if d.res.Reason == "" {
		d.res.Reason = "released with idem release"
	}
	return a.decide(ctx, d, "release")
}

func runResolve(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	var (
		d                     decision
		done, notDone         bool
		result, resultFile    string
		retention             = idem.DefaultRetention
		resultSet, retention0 bool
	)
	decisionFlags(fs, &d, "resolve even if the key's lease is live, or the key is not in progress")
	fs.BoolVar(&done, "done", false, "the effect happened: complete the key")
	fs.BoolVar(&notDone, "not-done", false, "the effect did not happen: release the key for the next delivery")
	fs.StringVar(&result, "result", "", "with --done: `STRING` is the result duplicates get")
	fs.StringVar(&resultFile, "result-file", "", "with --done: read the result from file `F` (- reads standard input)")
	fs.Var(durationValue{&retention}, "retention", "with --done: keep the completed record for `D` (36h, 7d)")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if d.key, err = keyArg(pos); err != nil {
		return err
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "result", "result-file":
			resultSet = true
		case "retention":
			retention0 = true
		}
	})
	switch {
	case done == notDone:
		return usagef("say what happened: --done or --not-done")
	case result != "" && resultFile != "":
		return usagef("--result and --result-file are exclusive")
	case notDone && (resultSet || retention0):
		return usagef("--result, --result-file and --retention go with --done")
	case retention <= 0:
		return usagef("--retention must be positive")
	}
	d.res.Done = done
	if done {
		d.res.Retention = retention
		d.res.Result = []byte(result)
		if resultFile != "" {
			var b []byte
			if resultFile == "-" {
				b, err = io.ReadAll(os.Stdin)
			} else {
				b, err = os.ReadFile(resultFile)
			}
			if err != nil {
				return fmt.Errorf("reading --result-file: %w", err)
			}
			d.res.Result = b
		}
	}
	if d.res.Reason == "" {
		if done {
			d.res.Reason = "resolved as done with idem resolve"
		} else {
			d.res.Reason = "resolved as not done with idem resolve"
		}
	}
	return a.decide(ctx, d, "resolve")
}

// decide checks the key's state against what the operator asked, then
// applies the resolution at the fence it read: to an attempt in progress
// only while it still is in progress, to a finished record (--force, or
// release of a failed key) as long as it still has that fence.
func (a *app) decide(ctx context.Context, d decision, verb string) error {
	s, err := a.open(ctx)
	if err != nil {
		return err
	}
	rec, now, err := getRecord(ctx, s, d.key)
	if err != nil {
		return err
	}
	st, noop, err := planDecision(&d, verb, &rec, now, d.key)
	if err != nil {
		return err
	}
	if noop {
		if d.asJSON {
			return writeJSONIndent(a.stdout, toJSON(&rec, now, true)) // nothing changed
		}
		fmt.Fprintf(a.stdout, "%s is already released (fence %d): the next delivery runs it as attempt %d; nothing done\n", d.key, rec.Fence, rec.Attempt+1)
		return nil
	}
	after, err := s.Resolve(ctx, d.res)
	switch {
	case errors.Is(err, idem.ErrLeaseLost) && d.res.Lapsed:
		return refused("%q changed while it was being decided (its attempt's heartbeat revived the lease, another attempt claimed it, or someone resolved it); nothing done, inspect it again", d.key)
	case errors.Is(err, idem.ErrLeaseLost):
		return refused("%q changed while it was being decided (another attempt claimed it, or someone resolved it); nothing done, inspect it again", d.key)
	case errors.Is(err, store.ErrNotFound):
		return notFound(d.key)
	case err != nil:
		return err
	}
	if d.asJSON {
		return writeJSONIndent(a.stdout, toJSON(&after, now, true))
	}
	was := fmt.Sprintf("was %s: attempt %d, owner %s, fence %d; now fence %d", st, rec.Attempt, orDash(rec.Owner), rec.Fence, after.Fence)
	switch {
	case d.res.Done:
		fmt.Fprintf(a.stdout, "resolved %s as done (%s)\nduplicates now get the result %s (%d bytes) until %s (%s)\n",
			d.key, was, preview(after.Result), len(after.Result), stamp(after.ExpiresAt), rel(after.ExpiresAt, now))
	case verb == "release":
		fmt.Fprintf(a.stdout, "released %s (%s)\nthe next delivery runs it as attempt %d\n", d.key, was, after.Attempt+1)
	default:
		fmt.Fprintf(a.stdout, "resolved %s as not done (%s)\nreleased: the next delivery runs it as attempt %d\n", d.key, was, after.Attempt+1)
	}
	if st == explain.StateInProgress {
		fmt.Fprintf(a.stdout, "attempt %d may still be running: its writes are refused from now on (fence %d is stale), but its effect may still happen\n", rec.Attempt, rec.Fence)
	}
	return nil
}

// planDecision checks rec, read at now, against what the operator asked
// (verb is "release" or "resolve"), as the CLI and the console both do, and
// sets d.res's conditions and fence for the write: an attempt in progress
// only with force, a completed key released only with force, a key not in
// progress resolved only with force. noop reports a release of a key
// already released: nothing to write. name is the key as messages show it
// (the console shows a hash under --hash-keys). The errors are the CLI's
// (refused, leaseLive).
func planDecision(d *decision, verb string, rec *idem.Record, now time.Time, name string) (st explain.State, noop bool, err error) {
	st = explain.StateOf(rec, now)
	if d.fence != 0 && rec.Fence != d.fence {
		return st, false, refused("%q is at fence %d, not %d: it changed since you inspected it (now %s, attempt %d); nothing done, inspect it again",
			name, rec.Fence, d.fence, st, rec.Attempt)
	}
	switch st {
	case explain.StateInProgress:
		if !d.force {
			return st, false, leaseLive("%q: attempt %d (owner %s) holds a live lease until %s (%s); it may still be running its effect. Wait for the lease to pass, or use --force",
				name, rec.Attempt, orDash(rec.Owner), stamp(rec.LeaseUntil), rel(rec.LeaseUntil, now))
		}
		d.res.InProgress = true
	case explain.StateLapsed, explain.StateIndeterminate:
		// The attempt inspected (its fence, below), and only while its
		// lease has passed: a heartbeat of an attempt that was only slow
		// may revive it between this read and the write, and then it is
		// running again, not something to decide.
		d.res.Lapsed = true
	case explain.StateReleased:
		if verb == "release" {
			return st, true, nil
		}
		fallthrough
	default:
		switch {
		case d.force:
		case verb == "release" && st == explain.StateFailed:
			// Retrying a permanent failure is what release is for.
		case verb == "release":
			return st, false, refused("%q is completed: releasing it makes the next delivery run its effect again; use --force if that is what you want", name)
		default:
			return st, false, refused("%q is %s, not in progress: there is nothing to decide; use --force to overwrite it", name, st)
		}
	}
	d.res.Key, d.res.Fence = d.key, rec.Fence
	return st, false, nil
}
