package main

import (
	"context"

	"github.com/idemkit/idem/cmd/idem/internal/explain"
)

var explainCmd = &command{
	name:     "explain",
	synopsis: "[--json] KEY",
	summary:  `tell a key's story and answer "two emails, one booking"`,
	help: `
Explain tells what happened to KEY in plain words, from its record and its
journal of attempts: who claimed it, when and under which policy, how each
attempt ended (result recorded, error, idem.NotDone, permanent failure,
lease ran out), takeovers of lapsed attempts and what a Reconcile hook
found, attempts still running after losing their lease (a refused
heartbeat or outcome), who resolved a key, expiry and re-runs.

Then it walks the "two emails, one booking" decision tree over that
journal and gives its verdict:

  1. Was completion recorded before the second attempt? (with idem only
     after the completed record expired, or an operator released it)
     yes: check the job key, table and record lifetime
  2. Did attempts overlap? (an attempt still running after a later one took
     over) yes: concurrent attempts; lengthen the lease / fix heartbeats
  3. Did an attempt run again after an earlier one lapsed, crashed or
     returned an error under at_least_once? yes: send succeeded, recording
     failed or crashed
  otherwise: no second effect could come from idem's side (an idem.NotDone
  release under at_most_once, a resolution as not done, or a takeover whose
  Reconcile hook found the effect done and repeated nothing).

With --json it prints the story, the questions with their answers and the
verdict (code, cause, text, attempts) as one JSON object.`,
	exits: `  0  explained
  1  the store failed
  2  usage error
  3  no record for KEY (never claimed, or expired or swept)`,
	run: runExplain,
}

func runExplain(ctx context.Context, a *app, args []string) error {
	rec, now, asJSON, err := keyedRecord(ctx, a, args, "print the explanation as JSON")
	if err != nil {
		return err
	}
	x := explain.Explain(rec, now)
	if asJSON {
		return writeJSONIndent(a.stdout, x)
	}
	return explain.Write(a.stdout, x, "")
}
