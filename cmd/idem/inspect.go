package main

import "context"

var inspectCmd = &command{
	name:     "inspect",
	synopsis: "[--json] KEY",
	summary:  "show a key's record and its journal of attempts",
	help: `
Inspect prints the record the store keeps for KEY: its status and derived
state (an in_progress record whose lease has passed is "lapsed" under
at_least_once, and the next claim takes it over, or "indeterminate" under
at_most_once, waiting for 'idem resolve'), policy, fence, attempt, owner,
fingerprint, a preview of the result with its size, the last reason, lease
and retention times, and the journal of the newest attempts: each one's
policy, owner, correlation id, times and outcome, with notes (takeover,
still running after a takeover, who resolved it, an operator's decision
recorded as its own entry).

KEY is the key as stored, e.g. receipt:8891:7 (what idem.Key builds).

With --json it prints the record as one JSON object: snake_case fields,
times in RFC 3339 UTC, the result in base64, the derived state in "state".`,
	exits: `  0  the record was found
  1  the store failed
  2  usage error
  3  no record for KEY (never claimed, or expired or swept)`,
	run: runInspect,
}

func runInspect(ctx context.Context, a *app, args []string) error {
	rec, now, asJSON, err := keyedRecord(ctx, a, args, "print the record as JSON")
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSONIndent(a.stdout, toJSON(&rec, now, true))
	}
	return writeRecord(a.stdout, &rec, now)
}
