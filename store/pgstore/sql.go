package pgstore

import (
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/store"
)

// The store's SQL. Every call is one statement (a refused finish takes a
// second one to annotate the journal); the state machine of
// the store package (store.ApplyClaim and its kin) is written here in SQL, over the columns of one row:
//
//   - The clock is statement_timestamp() (plus a test offset, see
//     withClockTable): now() for a statement of its own, and the
//     statement's start inside a transaction (InTx), so that the completion
//     at the end of a long fn gets its own time. It is stable within a
//     statement, so every time a statement writes is the same instant.
//     Hot statements use the expression inline; the others read it once in
//     a CTE c.
//   - Durations are passed as microseconds (bigint) and multiplied by
//     interval '1 microsecond'.
//   - The journal is jsonb, manipulated with jsonb_set, ||, - and
//     jsonb_path_query_array; its entries keep the json field names of
//     store.JournalEntry, so records decode with encoding/json. It is NULL
//     (implicit) while it is the one entry the row's columns say: a key's
//     first attempt (see implicitJournalSQL). The statements on the hot
//     path keep it NULL; the others write it out before they change it.

// recordColumns are the columns of a record, in the order rawRecord.dest
// reads them.
var recordColumns = []string{"key", "status", "policy", "fence", "attempt", "owner", "fingerprint", "result",
	"reason", "lease_until", "expires_at", "created_at", "updated_at", "journal", "correlation"}

// cols returns the record columns qualified by alias.
func cols(alias string) string {
	var b strings.Builder
	for i, c := range recordColumns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(alias)
		b.WriteByte('.')
		b.WriteString(c)
	}
	return b.String()
}

const us = "interval '1 microsecond'"

// live is the condition "the row t has not expired at now" in the WHERE of
// the statements that find rows by key. It is written so that the planner
// cannot match it to the index on expires_at: right after a burst of
// inserts the table's statistics are stale, and the planner would
// otherwise combine a scan of every live row's expires_at with the key
// lookup (a BitmapAnd), turning a lookup of one key into a scan of the
// table's recent rows. The key alone decides the plan.
func live(now string) string { return "t.expires_at + interval '0 s' > " + now }

// implicitJournalSQL is the journal of the row t written out: t.journal,
// or when it is NULL the one entry t's columns say, as
// store.ImplicitEntry builds it when record.go reads the row: the
// attempt t.attempt with fence t.fence, owner and correlation id t's,
// started at t.created_at with t's policy and lease, and once t is no
// longer in_progress, t's status as its outcome, ended at t.updated_at,
// with t's reason unless it completed.
func implicitJournalSQL(t string) string {
	return fmt.Sprintf(`coalesce(%[1]s.journal, jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
		'a', %[1]s.attempt, 'f', %[1]s.fence, 'o', nullif(%[1]s.owner, ''), 'c', nullif(%[1]s.correlation, ''),
		's', %[1]s.created_at, 'l', %[1]s.lease_until, 'p', %[1]s.policy,
		'x', CASE WHEN %[1]s.status <> 'in_progress' THEN %[1]s.status END,
		'e', CASE WHEN %[1]s.status <> 'in_progress' THEN %[1]s.updated_at END,
		'r', CASE WHEN %[1]s.status IN ('failed', 'released') THEN nullif(%[1]s.reason, '') END))))`, t)
}

// keepImplicit is the journal that a statement whose change the columns
// of the row t say (an end, a heartbeat) writes: with implicit journals
// (WithImplicitJournal), NULL for NULL and else patch(t.journal);
// without, patch of the journal written out.
func keepImplicit(t string, implicit bool, patch func(j string) string) string {
	if !implicit {
		return patch(implicitJournalSQL(t))
	}
	return "CASE WHEN " + t + ".journal IS NULL THEN NULL ELSE " + patch(t+".journal") + " END"
}

// trimJournal keeps the newest store.MaxJournal entries of the array j.
func trimJournal(j string) string {
	return fmt.Sprintf("jsonb_path_query_array(%s, '$[last - %d to last]')", j, store.MaxJournal-1)
}

// claimable is the claim condition on the row t at now (store.ApplyClaim)
// for a request with fingerprint fp: expired (absent), or released, or
// in_progress with a lapsed lease that may be taken over (at_least_once, or
// take and at_most_once) by this request (t's fingerprint or fp is empty,
// or they are equal: a lapsed attempt of another request is not taken
// over, and the row not acquired is the ledger's mismatch). A row whose
// status, policy or journal (not an array of objects) is damaged is not
// claimable unless it expired. (Damage inside a journal entry, a field of
// the wrong type, is found only when the row is decoded: a claim may take
// such a row over and then report it corrupt; fn never runs on it.)
func claimable(t, now, take, fp string) string {
	return fmt.Sprintf(`(%[1]s.expires_at <= %[2]s OR ((%[1]s.journal IS NULL OR (jsonb_typeof(%[1]s.journal) = 'array'
		AND NOT jsonb_path_exists(%[1]s.journal, '$[*] ? (@.type() != "object")'))) AND (
		%[1]s.status = 'released' OR (%[1]s.status = 'in_progress' AND %[1]s.lease_until <= %[2]s AND (
			%[1]s.policy = 'at_least_once' OR (%[1]s.policy = 'at_most_once' AND %[3]s))
			AND (%[1]s.fingerprint = '' OR %[4]s = '' OR %[1]s.fingerprint = %[4]s)))))`, t, now, take, fp)
}

// patchEntry returns the journal array j with one entry e replaced by
// patch(e): the last entry (pick "max") or the first (pick "min") for which
// match(e) holds. j is unchanged when no entry matches or j is not an
// array.
func patchEntry(j, pick string, match, patch func(e string) string) string {
	return fmt.Sprintf(`CASE WHEN jsonb_typeof(%[1]s) <> 'array' THEN %[1]s ELSE coalesce((
		SELECT jsonb_agg(CASE WHEN x.o = x.m THEN %[2]s ELSE x.e END ORDER BY x.o)
		FROM (SELECT j.e, j.o, %[3]s(j.o) FILTER (WHERE %[4]s) OVER () AS m
			FROM jsonb_array_elements(%[1]s) WITH ORDINALITY AS j(e, o)) x), %[1]s) END`,
		j, patch("x.e"), pick, match("j.e"))
}

// patchFenceEntry patches the last entry of fence f: the newest entry in
// the usual case (a fast path that does not unnest the array), else the
// one patchEntry finds.
func patchFenceEntry(j, f string, patch func(e string) string) string {
	return fmt.Sprintf(`CASE WHEN %[1]s -> -1 -> 'f' = to_jsonb(%[2]s) THEN jsonb_set(%[1]s, '{-1}', %[3]s) ELSE %[4]s END`,
		j, f, patch("("+j+" -> -1)"),
		patchEntry(j, "max", func(e string) string { return fmt.Sprintf("%s -> 'f' = to_jsonb(%s)", e, f) }, patch))
}

// reasonPatch is the "r" member of a journal entry: reason, or nothing.
func reasonPatch(reason string) string {
	return fmt.Sprintf(`CASE WHEN %[1]s <> '' THEN jsonb_build_object('r', %[1]s) ELSE '{}'::jsonb END`, reason)
}

// claimIn names the inputs of a claim statement: SQL expressions for one
// request's fields.
type claimIn struct {
	key, owner, corr, policy, lease, ret, fp string
	take                                     string // in the ON CONFLICT ... WHERE
}

// newRow is the row a claim inserts for a new key; now is the clock. Its
// journal is implicit (NULL: the attempt's one entry is in its columns),
// or that entry written out.
func newRow(in claimIn, now string, implicit bool) string {
	journal := "NULL"
	if !implicit {
		journal = `jsonb_build_array(jsonb_strip_nulls(jsonb_build_object('a', 1, 'f', 1,
			'o', nullif(` + in.owner + `, ''), 'c', nullif(` + in.corr + `, ''), 's', ` + now + `,
			'l', ` + now + ` + ` + in.lease + ` * ` + us + `, 'p', ` + in.policy + `)))`
	}
	return in.key + `, 'in_progress', ` + in.policy + `, 1, 1, ` + in.owner + `, ` + in.fp + `, NULL, '',
		` + now + ` + ` + in.lease + ` * ` + us + `, ` + now + ` + greatest(` + in.lease + `, ` + in.ret + `) * ` + us + `, ` + now + `, ` + now + `,
		` + journal + `, ` + in.corr
}

// onConflict is the claim's ON CONFLICT clause: when the existing row t is
// claimable at now (excluded.created_at, the clock), it becomes the new
// attempt's, continuing its fence and attempt numbers, reason and journal
// (the new entry is the inserted row's, numbered, marked as a takeover or
// as after expiry; a takeover marks the lapsed attempt's entry).
func onConflict(in claimIn) string {
	const now = "excluded.created_at"
	j := implicitJournalSQL("t")
	return `ON CONFLICT (key) DO UPDATE SET
		status = 'in_progress',
		policy = excluded.policy,
		fence = t.fence + 1,
		attempt = t.attempt + 1,
		owner = excluded.owner,
		fingerprint = excluded.fingerprint,
		result = NULL,
		lease_until = excluded.lease_until,
		expires_at = excluded.expires_at,
		created_at = CASE WHEN t.expires_at <= ` + now + ` THEN ` + now + ` ELSE t.created_at END,
		updated_at = ` + now + `,
		correlation = excluded.correlation,
		journal = ` + trimJournal(`
			CASE
				WHEN jsonb_typeof(t.journal) <> 'array' THEN '[]'::jsonb
				WHEN t.status = 'in_progress' AND t.expires_at > `+now+`
					AND `+j+` -> -1 -> 'f' = to_jsonb(t.fence)
					AND jsonb_typeof(`+j+` -> -1) = 'object'
					AND coalesce(`+j+` -> -1 ->> 'x', '') = ''
				THEN jsonb_set(`+j+`, '{-1,x}', '"`+store.OutcomeLapsed+`"')
				ELSE `+j+`
			END || (jsonb_strip_nulls(jsonb_build_object('o', nullif(excluded.owner, ''), 'c', nullif(excluded.correlation, ''),
					's', `+now+`, 'l', excluded.lease_until, 'p', excluded.policy)) ||
				jsonb_build_object('a', t.attempt + 1, 'f', t.fence + 1) ||
				CASE
					WHEN t.expires_at <= `+now+` THEN '{"ae": true}'::jsonb
					WHEN t.status = 'in_progress' THEN '{"t": true}'::jsonb
					ELSE '{}'::jsonb
				END)`) + `
	WHERE ` + claimable("t", now, in.take, "excluded.fingerprint")
}

// claimReturning are the claim's result columns for an acquired row: the
// record, acquired, claimable, the clock, and whether the INSERT inserted
// the row (xmax = 0: a new key) rather than claiming an existing one.
func claimReturning(ins, now string) string {
	return cols(ins) + ", true, false, " + now + ", " + ins + ".inserted"
}

// claimSQL is the claim of one key: $1 key, $2 owner, $3 correlation, $4
// policy, $5 lease (µs), $6 retention (µs), $7 fingerprint, $8 take lapsed.
//
// It first reads the key's row from the statement's snapshot, without
// locking it. If that row is not claimable (a duplicate of a completed or
// failed key, a busy or indeterminate one), the statement writes nothing
// and returns it: a duplicate costs a read, no row lock, no WAL and no
// commit flush, and duplicates of one key do not queue behind each other.
// Otherwise (absent, expired, released, lapsed and takeable) it runs the
// claim proper: one INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE
// <claimable> RETURNING. Each result row is a record, acquired, claimable
// (for a row not acquired: whether the snapshot's row was claimable, which
// means that it changed under the statement and the claim must run again),
// and the statement's clock.
//
// Concurrency (READ COMMITTED): the INSERT either inserts the key or, on a
// conflict, locks the row's latest committed version, waiting for a
// concurrent writer of the key to finish, and evaluates the WHERE on that
// version; the DO UPDATE reads t.* from it. So an acquired claim is always
// decided on the latest row, never on a stale one. When the WHERE is false,
// the row is left as it is (locked until the statement's transaction
// ends) and RETURNING gives nothing; the snapshot's row (or
// its absence) is then older than the version the WHERE rejected: another
// transaction committed the key in between. The caller detects exactly
// that case (a claimable or missing row, not acquired) and runs the claim
// again, with a new snapshot. A snapshot row that is not claimable is a
// true answer as of the statement's start (for example "busy" for a
// holder that completed a moment later).
func claimSQL(table, now string, implicit bool) string {
	in := claimIn{key: "$1::text", owner: "$2::text", corr: "$3::text", policy: "$4::text",
		lease: "$5::bigint", ret: "$6::bigint", fp: "$7::text", take: "$8::boolean"}
	return `WITH ins AS (
	INSERT INTO ` + table + ` AS t (` + strings.Join(recordColumns, ", ") + `)
	SELECT ` + newRow(in, now, implicit) + `
	WHERE NOT EXISTS (SELECT 1 FROM ` + table + ` AS x WHERE x.key = $1::text AND NOT ` + claimable("x", now, "$8::boolean", in.fp) + `)
	` + onConflict(in) + `
	RETURNING ` + cols("t") + `, t.xmax = 0 AS inserted
)
SELECT ` + claimReturning("ins", now) + ` FROM ins
UNION ALL
SELECT ` + cols("t") + `, false, ` + claimable("t", now, "$8::boolean", in.fp) + `, ` + now + `, false
FROM ` + table + ` AS t
WHERE t.key = $1::text AND NOT EXISTS (SELECT 1 FROM ins)`
}

// claimBatchSQL is claimSQL for many requests with distinct keys: the same
// parameters as arrays, the claimable keys claimed in key order (so that
// concurrent batches lock their rows in the same order and cannot
// deadlock) in one INSERT. The keys' rows are read by primary key (key =
// ANY: the planner looks them up by key whatever its statistics say, never
// scanning the table), the second time only for keys not acquired.
func claimBatchSQL(table, now string, implicit bool) string {
	in := claimIn{key: "r.key", owner: "r.owner", corr: "r.corr", policy: "r.policy",
		lease: "r.lease", ret: "r.ret", fp: "r.fp", take: "(SELECT r.take FROM r WHERE r.key = t.key)"}
	return `WITH c AS (SELECT ` + now + ` AS now),
r AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::text[], $8::boolean[])
	AS u(key, owner, corr, policy, lease, ret, fp, take)),
ins AS (
	INSERT INTO ` + table + ` AS t (` + strings.Join(recordColumns, ", ") + `)
	SELECT ` + newRow(in, "c.now", implicit) + `
	FROM r, c
	WHERE NOT EXISTS (SELECT 1 FROM ` + table + ` AS x
		WHERE x.key = ANY ($1::text[]) AND x.key = r.key AND NOT ` + claimable("x", "c.now", "r.take", in.fp) + `)
	ORDER BY r.key COLLATE "C"
	` + onConflict(in) + `
	RETURNING ` + cols("t") + `, t.xmax = 0 AS inserted
)
SELECT ` + claimReturning("ins", "c.now") + ` FROM ins, c
UNION ALL
SELECT ` + cols("t") + `, false, ` + claimable("t", "c.now", "r.take", in.fp) + `, c.now, false
FROM ` + table + ` AS t JOIN r ON r.key = t.key CROSS JOIN c
WHERE (SELECT count(*) FROM ins) < (SELECT count(*) FROM r)
	AND t.key = ANY ($1::text[]) AND NOT EXISTS (SELECT 1 FROM ins WHERE ins.key = t.key)`
}

// claimNewSQL is the first statement of a batch claim while keys are
// mostly new: it inserts the new record row of each key that has no row
// ($1 .. $7 as in claimBatchSQL), in key order, and does nothing at all for
// a key that has one, whatever its state: no check, no lock, no write (a
// batch of keys that all exist writes nothing and flushes no commit). It
// returns the keys it inserted and their row's times; claimBatchSQL then
// claims the others (an expired, released or lapsed row is claimable, a
// completed one is a duplicate). A key being inserted by a concurrent
// transaction is waited for, as by any INSERT, and then left to
// claimBatchSQL if that transaction committed.
func claimNewSQL(table, now string, implicit bool) string {
	in := claimIn{key: "r.key", owner: "r.owner", corr: "r.corr", policy: "r.policy",
		lease: "r.lease", ret: "r.ret", fp: "r.fp"}
	return `WITH c AS (SELECT ` + now + ` AS now)
INSERT INTO ` + table + ` AS t (` + strings.Join(recordColumns, ", ") + `)
SELECT ` + newRow(in, "c.now", implicit) + `
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::text[])
	AS r(key, owner, corr, policy, lease, ret, fp), c
ORDER BY r.key COLLATE "C"
ON CONFLICT (key) DO NOTHING
RETURNING t.key, t.lease_until, t.expires_at, t.created_at`
}

// ending is how finishSQL ends an attempt.
type ending struct {
	status  store.Status
	outcome string
	set     func(now string) string // more assignments, with $3 (result or reason) and $4 (retention, µs)
	reason  string                  // the journal entry's reason
}

var (
	endComplete = ending{store.StatusCompleted, store.OutcomeCompleted,
		func(now string) string { return "result = $3::bytea, expires_at = " + now + " + $4::bigint * " + us }, "''"}
	endFail = ending{store.StatusFailed, store.OutcomeFailed,
		func(now string) string { return "reason = $3::text, expires_at = " + now + " + $4::bigint * " + us }, "$3::text"}
	endRelease = ending{store.StatusReleased, store.OutcomeReleased,
		func(string) string { return "reason = $3::text" }, "$3::text"}
	endAbandon = ending{store.StatusInProgress, store.OutcomeAbandoned,
		func(string) string { return "reason = $3::text" }, "$3::text"}
)

// finishSQL ends the attempt holding fence $2 of key $1 (store.ApplyFinish):
// one UPDATE conditioned on the fence, the status and the expiry, that
// also records the outcome in the attempt's journal entry. It updates no
// row when the attempt no longer holds the key; lateSQL then annotates
// the stale attempt's entry.
//
// Under READ COMMITTED an UPDATE that finds the row locked by a concurrent
// writer waits for it and re-checks its WHERE on the new version: a
// takeover that commits first makes the stale holder's UPDATE match
// nothing.
//
// An implicit journal stays implicit: the row's new status, times and
// reason say the entry's outcome. An abandoned attempt's (still
// in_progress) do not, so abandon writes the journal out.
func finishSQL(table, now string, e ending, implicit bool) string {
	patch := func(j string) string {
		return patchFenceEntry(j, "$2::bigint", func(x string) string {
			return fmt.Sprintf("(%s - 'r') || jsonb_build_object('e', %s, 'l', %s, 'x', '%s') || %s",
				x, now, now, e.outcome, reasonPatch(e.reason))
		})
	}
	journal := keepImplicit("t", implicit, patch)
	if e.status == store.StatusInProgress {
		journal = patch(implicitJournalSQL("t"))
	}
	return `UPDATE ` + table + ` AS t SET
	status = '` + string(e.status) + `', lease_until = ` + now + `, updated_at = ` + now + `, ` + e.set(now) + `,
	journal = ` + journal + `
WHERE t.key = $1 AND t.fence = $2 AND t.status = 'in_progress' AND ` + live(now)
}

// lateSQL annotates the journal entry of a stale attempt (fence $2 of key
// $1: not ended, not yet annotated) with the time it tried to finish or
// heartbeat after losing the key (transition.annotateLate). It runs only
// after a finishing statement or a heartbeat was refused.
func lateSQL(table, now string) string {
	match := func(e string) string {
		return fmt.Sprintf("%[1]s -> 'f' = to_jsonb($2::bigint) AND NOT %[1]s ? 'e' AND NOT %[1]s ? 'lf'", e)
	}
	return `UPDATE ` + table + ` AS t SET journal = ` + patchEntry("t.journal", "min", match, func(x string) string {
		return x + " || jsonb_build_object('lf', " + now + ")"
	}) + `
WHERE t.key = $1 AND ` + live(now) + `
	AND (t.fence <> $2 OR t.status <> 'in_progress')
	AND jsonb_typeof(t.journal) = 'array'
	AND EXISTS (SELECT 1 FROM jsonb_array_elements(t.journal) AS j(e) WHERE ` + match("j.e") + `)`
}

// completeBatchSQL completes many attempts (distinct keys): $1 keys, $2
// fences, $3 results, $4 retentions (µs). It returns the keys completed.
// The second UPDATE annotates the stale attempts among them (their rows are
// not the first's, so no row is written twice).
//
// The keys come sorted by their UTF-8 bytes (completeRound sorts them as
// Go compares strings). The first UPDATE finds its rows by key = ANY (by
// primary key whatever the statistics say) and reads each row's inputs
// from the arrays at the key's position: a binary search (width_bucket)
// of the row's key, as UTF-8 bytes, among the keys as UTF-8 bytes (k.keys:
// the database's own encoding may order them otherwise), checked to hold
// the row's key. A join with the arrays' unnest instead took most of the
// statement's time: the planner, expecting few rows, compared every row
// found with every input row (18 - 31 ms for a batch of 256, against
// 3 - 5 ms this way). The second UPDATE runs only when the first did not
// complete every key (a one-time filter), so the usual batch reads each
// row once.
func completeBatchSQL(table, now string, implicit bool) string {
	match := func(e string) string {
		return fmt.Sprintf("%[1]s -> 'f' = to_jsonb(r.fence) AND NOT %[1]s ? 'e' AND NOT %[1]s ? 'lf'", e)
	}
	at := func(array string) string { return "(" + array + ")[width_bucket(convert_to(t.key, 'UTF8'), k.keys)]" }
	fence := at("$2::bigint[]")
	return `WITH c AS (SELECT ` + now + ` AS now),
k AS MATERIALIZED (SELECT array_agg(convert_to(u.key, 'UTF8') ORDER BY u.o) AS keys FROM unnest($1::text[]) WITH ORDINALITY AS u(key, o)),
r AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::bigint[]) AS u(key, fence, result, ret)),
fin AS (
	UPDATE ` + table + ` AS t SET
		status = 'completed', lease_until = c.now, updated_at = c.now,
		result = ` + at("$3::bytea[]") + `, expires_at = c.now + ` + at("$4::bigint[]") + ` * ` + us + `,
		journal = ` + keepImplicit("t", implicit, func(j string) string {
		return patchFenceEntry(j, fence, func(x string) string {
			return fmt.Sprintf("(%s - 'r') || jsonb_build_object('e', c.now, 'l', c.now, 'x', '%s')", x, store.OutcomeCompleted)
		})
	}) + `
	FROM c, k
	WHERE t.key = ANY ($1::text[]) AND ` + at("$1::text[]") + ` = t.key AND t.fence = ` + fence + ` AND t.status = 'in_progress' AND ` + live("c.now") + `
	RETURNING t.key
),
late AS (
	UPDATE ` + table + ` AS t SET journal = ` + patchEntry("t.journal", "min", match, func(x string) string {
		return x + " || jsonb_build_object('lf', c.now)"
	}) + `
	FROM r, c
	WHERE (SELECT count(*) FROM fin) < cardinality($1::text[])
		AND t.key = ANY ($1::text[]) AND t.key = r.key AND NOT EXISTS (SELECT 1 FROM fin WHERE fin.key = r.key)
		AND ` + live("c.now") + `
		AND (t.fence <> r.fence OR t.status <> 'in_progress')
		AND jsonb_typeof(t.journal) = 'array'
		AND EXISTS (SELECT 1 FROM jsonb_array_elements(t.journal) AS j(e) WHERE ` + match("j.e") + `)
	RETURNING 1
)
SELECT key FROM fin`
}

// extendSQL renews the lease of fence $2 of key $1 to now + $3 µs
// (store.ApplyExtend) and returns the new LeaseUntil; no row when the
// attempt no longer holds the key (lateSQL then annotates its entry: a
// refused heartbeat proves the attempt was still running).
func extendSQL(table, now string, implicit bool) string {
	until := now + " + $3::bigint * " + us
	return `UPDATE ` + table + ` AS t SET
	lease_until = ` + until + `,
	expires_at = greatest(t.expires_at, ` + until + `),
	updated_at = ` + now + `,
	journal = ` + keepImplicit("t", implicit, func(j string) string {
		return patchFenceEntry(j, "$2::bigint", func(x string) string {
			return x + " || jsonb_build_object('l', " + until + ")"
		})
	}) + `
WHERE t.key = $1 AND t.fence = $2 AND t.status = 'in_progress' AND ` + live(now) + `
RETURNING t.lease_until`
}

// resolveSQL applies an operator's decision (store.ApplyResolve): $1 key,
// $2 fence (0: any), $3 done, $4 result, $5 reason, $6 retention (µs), $7
// by, $8 in progress only (store.Resolution.InProgress: the status must be
// in_progress, whatever the lease). It returns the record; no row means
// absent, expired, another fence or not in progress (the caller tells
// which with the exists statement).
func resolveSQL(table, now string) string {
	outcome := `CASE WHEN $3::boolean THEN '` + store.OutcomeResolvedDone + `' ELSE '` + store.OutcomeResolvedNotDone + `' END`
	// A decision is never implicit: the journal is written out.
	j := implicitJournalSQL("t")
	openEntry := `(SELECT coalesce(j.e ->> 'x', '') = '' FROM jsonb_array_elements(` + j + `) WITH ORDINALITY AS j(e, o)
			WHERE j.e -> 'f' = to_jsonb(t.fence) ORDER BY j.o DESC LIMIT 1)`
	return `WITH c AS (SELECT ` + now + ` AS now)
UPDATE ` + table + ` AS t SET
	fence = t.fence + 1,
	updated_at = c.now,
	lease_until = c.now,
	reason = $5::text,
	status = CASE WHEN $3::boolean THEN 'completed' ELSE 'released' END,
	result = CASE WHEN $3::boolean THEN $4::bytea END,
	expires_at = CASE WHEN $3::boolean THEN c.now + $6::bigint * ` + us + ` ELSE t.expires_at END,
	journal = CASE
		-- The attempt of the current fence has no outcome yet: this decides it.
		WHEN jsonb_typeof(` + j + `) = 'array' AND ` + openEntry + ` IS TRUE
		THEN ` + patchFenceEntry(j, "t.fence", func(x string) string {
		return fmt.Sprintf(`(%[1]s - 'r' - 'rb') || jsonb_build_object('e', c.now, 'x', %[2]s) || %[3]s ||
				CASE WHEN $7::text <> '' THEN jsonb_build_object('rb', $7::text) ELSE '{}'::jsonb END ||
				CASE WHEN (%[1]s ->> 'l')::timestamptz > c.now THEN jsonb_build_object('l', c.now) ELSE '{}'::jsonb END`,
			x, outcome, reasonPatch("$5::text"))
	}) + `
		-- Otherwise the decision gets an entry of its own.
		ELSE ` + trimJournal(`CASE WHEN jsonb_typeof(`+j+`) = 'array' THEN `+j+` ELSE '[]'::jsonb END ||
			jsonb_strip_nulls(jsonb_build_object('a', t.attempt, 'f', t.fence + 1, 'o', nullif($7::text, ''),
				's', c.now, 'l', c.now, 'e', c.now, 'x', `+outcome+`, 'r', nullif($5::text, ''),
				'rb', nullif($7::text, ''), 'd', true))`) + `
	END
FROM c
WHERE t.key = $1 AND ` + live("c.now") + ` AND ($2::bigint = 0 OR t.fence = $2::bigint)
	AND (NOT $8::boolean OR t.status = 'in_progress')
RETURNING ` + cols("t")
}

// queries are a store's statements, built once from its table name and
// clock.
type queries struct {
	now, claim, claimBatch, claimNew                          string
	complete, fail, release, abandon, late, extend            string
	completeBatch                                             string
	get, exists, list, listStatus, listStuck, listStuckStatus string
	resolve, delete, sweep                                    string
}

func newQueries(table, clockTable string, implicit bool) queries {
	now := "statement_timestamp()"
	if clockTable != "" {
		now = "(statement_timestamp() + (SELECT off FROM " + clockTable + "))"
	}
	list := func(where string) string {
		return "SELECT " + cols("t") + " FROM " + table + " AS t\nWHERE " + live(now) + " AND t.key > $1" +
			where + "\nORDER BY t.key LIMIT $2"
	}
	stuck := " AND t.status = 'in_progress' AND t.lease_until <= " + now
	return queries{
		now:             "SELECT " + now,
		claim:           claimSQL(table, now, implicit),
		claimBatch:      claimBatchSQL(table, now, implicit),
		claimNew:        claimNewSQL(table, now, implicit),
		complete:        finishSQL(table, now, endComplete, implicit),
		fail:            finishSQL(table, now, endFail, implicit),
		release:         finishSQL(table, now, endRelease, implicit),
		abandon:         finishSQL(table, now, endAbandon, implicit),
		late:            lateSQL(table, now),
		extend:          extendSQL(table, now, implicit),
		completeBatch:   completeBatchSQL(table, now, implicit),
		get:             "SELECT " + cols("t") + " FROM " + table + " AS t\nWHERE t.key = $1 AND " + live(now),
		exists:          "SELECT EXISTS (SELECT 1 FROM " + table + " AS t WHERE t.key = $1 AND " + live(now) + ")",
		list:            list(""),
		listStatus:      list(" AND t.status = $3"),
		listStuck:       list(stuck),
		listStuckStatus: list(stuck + " AND t.status = $3"),
		resolve:         resolveSQL(table, now),
		delete:          "DELETE FROM " + table + " AS t WHERE t.key = $1 AND " + live(now),
		// Bounded batches: lock at most $1 expired rows, oldest first (an
		// index range scan on expires_at that stops at the first live
		// row: the clock must be an index condition here, not a join with
		// a CTE), skipping rows another sweeper or a claim holds, and
		// delete them by ctid (a TID scan, no second index lookup).
		sweep: "DELETE FROM " + table + " AS t\nWHERE t.ctid = ANY (ARRAY(\n\tSELECT s.ctid FROM " + table + " AS s WHERE s.expires_at <= " + now +
			"\n\tORDER BY s.expires_at LIMIT $1 FOR UPDATE SKIP LOCKED))\nAND t.expires_at <= " + now,
	}
}

// micros converts d to whole microseconds, the resolution of the server's
// clock (rounded up, so a positive duration never becomes zero). It does
// not overflow: the longest durations (math.MaxInt64, "forever") stay the
// longest.
func micros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	us := int64(d / time.Microsecond)
	if d%time.Microsecond != 0 {
		us++
	}
	return us
}
