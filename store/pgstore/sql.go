package pgstore

import (
	"fmt"
	"strconv"
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
//     jsonb_path_query_array; its entries keep the wire names of
//     store.JournalEntry (store.WireFence and its kin), so records decode
//     with store.UnmarshalJournal. The SQL below names a member {Field},
//     after the JournalEntry field, and newQueries puts in the quoted wire
//     name (wireNames): the names are spelled once, in package store. The
//     journal is NULL (implicit) while it is the one entry the row's
//     columns say: a key's first attempt (see implicitJournalSQL). The
//     statements on the hot path keep it NULL; the others write it out
//     before they change it.
//   - A new row's fence is store.FirstFence of the clock with no floor:
//     the clock in microseconds since 1970 (firstFenceSQL). Every later
//     claim or resolution of the row adds one.
//   - An attempt holds the key while its row is in_progress with the
//     attempt's fence and attempt id and has not expired (heldSQL); every
//     statement that ends or extends an attempt is conditioned on that.

// recordColumns are the columns of a record, in the order rawRecord.dest
// reads them.
var recordColumns = []string{"key", "status", "policy", "fence", "attempt", "owner", "fingerprint", "result",
	"reason", "lease_until", "expires_at", "created_at", "updated_at", "journal", "correlation", "attempt_id"}

// wireNames puts the journal's wire names into the store's SQL: {Field}
// becomes the SQL string literal of the member name of
// store.JournalEntry's Field (store.WireAttempt and its kin).
var wireNames = func() *strings.Replacer {
	var pairs []string
	for field, name := range map[string]string{
		"Attempt": store.WireAttempt, "Fence": store.WireFence, "AttemptID": store.WireAttemptID,
		"Owner": store.WireOwner, "Correlation": store.WireCorrelation, "Started": store.WireStarted,
		"LeaseUntil": store.WireLeaseUntil, "Ended": store.WireEnded, "Outcome": store.WireOutcome,
		"Reason": store.WireReason, "Takeover": store.WireTakeover, "AfterExpiry": store.WireAfterExpiry,
		"Policy": store.WirePolicy, "LateFinish": store.WireLateFinish, "ResolvedBy": store.WireResolvedBy,
		"Decision": store.WireDecision,
	} {
		pairs = append(pairs, "{"+field+"}", "'"+strings.ReplaceAll(name, "'", "''")+"'")
	}
	return strings.NewReplacer(pairs...)
}()

// firstFenceSQL is store.FirstFence(now, 0) in SQL: the clock now in
// microseconds since 1970 (UnixMicro), at least 1. extract returns an
// exact numeric from PostgreSQL 14 on; before, a double whose rounding
// error stays under half a microsecond, which the cast to bigint rounds
// away.
func firstFenceSQL(now string) string {
	return "greatest((extract(epoch from " + now + ") * 1000000)::bigint, 1)"
}

// heldSQL is the condition "the attempt (fence, id) holds the row t at
// now" (store.ApplyFinish): in_progress with that fence and attempt id,
// and not expired.
func heldSQL(t, fence, id, now string) string {
	return t + ".fence = " + fence + " AND " + t + ".attempt_id = " + id + " AND " + t + ".status = 'in_progress' AND " + live(now)
}

// lateEntrySQL is the condition "the journal entry e is the open entry of
// the attempt (fence, id)" (store.ApplyFinish's lateEntry): its fence and
// attempt id, not ended, not yet marked late.
func lateEntrySQL(e, fence, id string) string {
	return fmt.Sprintf("%[1]s -> {Fence} = to_jsonb(%[2]s) AND %[1]s -> {AttemptID} = to_jsonb(%[3]s) AND NOT %[1]s ? {Ended} AND NOT %[1]s ? {LateFinish}",
		e, fence, id)
}

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
// attempt t.attempt with fence t.fence, attempt id, owner and correlation id t's,
// started at t.created_at with t's policy and lease, and once t is no
// longer in_progress, t's status as its outcome, ended at t.updated_at,
// with t's reason unless it completed.
func implicitJournalSQL(t string) string {
	return fmt.Sprintf(`coalesce(%[1]s.journal, jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
		{Attempt}, %[1]s.attempt, {Fence}, %[1]s.fence, {AttemptID}, nullif(%[1]s.attempt_id, ''),
		{Owner}, nullif(%[1]s.owner, ''), {Correlation}, nullif(%[1]s.correlation, ''),
		{Started}, %[1]s.created_at, {LeaseUntil}, %[1]s.lease_until, {Policy}, %[1]s.policy,
		{Outcome}, CASE WHEN %[1]s.status <> 'in_progress' THEN %[1]s.status END,
		{Ended}, CASE WHEN %[1]s.status <> 'in_progress' THEN %[1]s.updated_at END,
		{Reason}, CASE WHEN %[1]s.status IN ('failed', 'released') THEN nullif(%[1]s.reason, '') END))))`, t)
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
	return fmt.Sprintf(`CASE WHEN %[1]s -> -1 -> {Fence} = to_jsonb(%[2]s) THEN jsonb_set(%[1]s, '{-1}', %[3]s) ELSE %[4]s END`,
		j, f, patch("("+j+" -> -1)"),
		patchEntry(j, "max", func(e string) string { return fmt.Sprintf("%s -> {Fence} = to_jsonb(%s)", e, f) }, patch))
}

// reasonPatch is the reason member of a journal entry: reason, or nothing.
func reasonPatch(reason string) string {
	return fmt.Sprintf(`CASE WHEN %[1]s <> '' THEN jsonb_build_object({Reason}, %[1]s) ELSE '{}'::jsonb END`, reason)
}

// claimIn names the inputs of a claim statement: SQL expressions for one
// request's fields.
type claimIn struct {
	key, id, owner, corr, policy, lease, ret, fp string
	take                                         string // in the ON CONFLICT ... WHERE
}

// newRow is the row a claim inserts for a new key; now is the clock and
// fence its firstFenceSQL (a statement of many rows computes it once). Its
// journal is implicit (NULL: the attempt's one entry is in its columns),
// or that entry written out.
func newRow(in claimIn, now, fence string, implicit bool) string {
	journal := "NULL"
	if !implicit {
		journal = `jsonb_build_array(jsonb_strip_nulls(jsonb_build_object({Attempt}, 1, {Fence}, ` + fence + `,
			{AttemptID}, nullif(` + in.id + `, ''), {Owner}, nullif(` + in.owner + `, ''), {Correlation}, nullif(` + in.corr + `, ''),
			{Started}, ` + now + `, {LeaseUntil}, ` + now + ` + ` + in.lease + ` * ` + us + `, {Policy}, ` + in.policy + `)))`
	}
	return in.key + `, 'in_progress', ` + in.policy + `, ` + fence + `, 1, ` + in.owner + `, ` + in.fp + `, NULL, '',
		` + now + ` + ` + in.lease + ` * ` + us + `, ` + now + ` + greatest(` + in.lease + `, ` + in.ret + `) * ` + us + `, ` + now + `, ` + now + `,
		` + journal + `, ` + in.corr + `, ` + in.id
}

// onConflict is the claim's ON CONFLICT clause: when the existing row t is
// claimable at now (excluded.created_at, the clock), it becomes the new
// attempt's (its attempt id), continuing its fence and attempt numbers, reason and journal
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
		attempt_id = excluded.attempt_id,
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
					AND `+j+` -> -1 -> {Fence} = to_jsonb(t.fence)
					AND jsonb_typeof(`+j+` -> -1) = 'object'
					AND coalesce(`+j+` -> -1 ->> {Outcome}, '') = ''
				THEN jsonb_set(`+j+`, ARRAY['-1', {Outcome}], '"`+string(store.OutcomeLapsed)+`"')
				ELSE `+j+`
			END || (jsonb_strip_nulls(jsonb_build_object({AttemptID}, nullif(excluded.attempt_id, ''),
					{Owner}, nullif(excluded.owner, ''), {Correlation}, nullif(excluded.correlation, ''),
					{Started}, `+now+`, {LeaseUntil}, excluded.lease_until, {Policy}, excluded.policy)) ||
				jsonb_build_object({Attempt}, t.attempt + 1, {Fence}, t.fence + 1) ||
				CASE
					WHEN t.expires_at <= `+now+` THEN jsonb_build_object({AfterExpiry}, true)
					WHEN t.status = 'in_progress' THEN jsonb_build_object({Takeover}, true)
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
// policy, $5 lease (µs), $6 retention (µs), $7 fingerprint, $8 take lapsed,
// $9 attempt id.
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
		lease: "$5::bigint", ret: "$6::bigint", fp: "$7::text", take: "$8::boolean", id: "$9::text"}
	return `WITH ins AS (
	INSERT INTO ` + table + ` AS t (` + strings.Join(recordColumns, ", ") + `)
	SELECT ` + newRow(in, now, firstFenceSQL(now), implicit) + `
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
	in := claimIn{key: "r.key", id: "r.id", owner: "r.owner", corr: "r.corr", policy: "r.policy",
		lease: "r.lease", ret: "r.ret", fp: "r.fp", take: "(SELECT r.take FROM r WHERE r.key = t.key)"}
	return `WITH c AS (SELECT ` + now + ` AS now, ` + firstFenceSQL(now) + ` AS fence),
r AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::text[], $8::boolean[], $9::text[])
	AS u(key, owner, corr, policy, lease, ret, fp, take, id)),
ins AS (
	INSERT INTO ` + table + ` AS t (` + strings.Join(recordColumns, ", ") + `)
	SELECT ` + newRow(in, "c.now", "c.fence", implicit) + `
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
// ($1 .. $7 as in claimBatchSQL, $8 the attempt ids), in key order, and does nothing at all for
// a key that has one, whatever its state: no check, no lock, no write (a
// batch of keys that all exist writes nothing and flushes no commit). It
// returns the keys it inserted and their row's fence and times; claimBatchSQL then
// claims the others (an expired, released or lapsed row is claimable, a
// completed one is a duplicate). A key being inserted by a concurrent
// transaction is waited for, as by any INSERT, and then left to
// claimBatchSQL if that transaction committed.
func claimNewSQL(table, now string, implicit bool) string {
	in := claimIn{key: "r.key", id: "r.id", owner: "r.owner", corr: "r.corr", policy: "r.policy",
		lease: "r.lease", ret: "r.ret", fp: "r.fp"}
	return `WITH c AS (SELECT ` + now + ` AS now, ` + firstFenceSQL(now) + ` AS fence)
INSERT INTO ` + table + ` AS t (` + strings.Join(recordColumns, ", ") + `)
SELECT ` + newRow(in, "c.now", "c.fence", implicit) + `
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::text[], $8::text[])
	AS r(key, owner, corr, policy, lease, ret, fp, id), c
ORDER BY r.key COLLATE "C"
ON CONFLICT (key) DO NOTHING
RETURNING t.key, t.fence, t.lease_until, t.expires_at, t.created_at`
}

// ending is how finishSQL ends an attempt.
type ending struct {
	status  store.Status
	outcome store.Outcome
	set     func(now string) string // more assignments, with $4 (result or reason) and $5 (retention, µs)
	reason  string                  // the journal entry's reason
	// written: the row's columns cannot say the ended entry, so the
	// journal is written out even when it was implicit.
	written bool
}

var (
	endComplete = ending{status: store.StatusCompleted, outcome: store.OutcomeCompleted,
		set: func(now string) string { return "result = $4::bytea, expires_at = " + now + " + $5::bigint * " + us }, reason: "''"}
	// endCompleteReason is a completion with a reason ($6), which the
	// record does not keep and the attempt's entry does
	// (store.ApplyFinish): an entry the columns cannot say. The Ledger
	// never sends one; the usual completion keeps its statement.
	endCompleteReason = ending{status: store.StatusCompleted, outcome: store.OutcomeCompleted,
		set: endComplete.set, reason: "$6::text", written: true}
	endFail = ending{status: store.StatusFailed, outcome: store.OutcomeFailed,
		set: func(now string) string { return "reason = $4::text, expires_at = " + now + " + $5::bigint * " + us }, reason: "$4::text"}
	endRelease = ending{status: store.StatusReleased, outcome: store.OutcomeReleased,
		set: func(string) string { return "reason = $4::text" }, reason: "$4::text"}
	// An abandoned attempt gives up the record's attempt id, so that it
	// cannot end twice; its entry keeps it. The row stays in_progress,
	// which the columns cannot tell from a running attempt.
	endAbandon = ending{status: store.StatusInProgress, outcome: store.OutcomeAbandoned,
		set: func(string) string { return "reason = $4::text, attempt_id = ''" }, reason: "$4::text", written: true}
)

// finishSQL ends the attempt that holds key $1 with fence $2 and attempt
// id $3 (store.ApplyFinish): one UPDATE conditioned on heldSQL, that also
// records the outcome in the attempt's journal entry. It updates no row
// when the attempt no longer holds the key; lateSQL then annotates the
// stale attempt's entry.
//
// Under READ COMMITTED an UPDATE that finds the row locked by a concurrent
// writer waits for it and re-checks its WHERE on the new version: a
// takeover that commits first makes the stale holder's UPDATE match
// nothing, and so does a concurrent finish of the same attempt (an
// abandon clears the attempt id; any other ending leaves the row not
// in_progress), so an attempt ends once.
//
// An implicit journal stays implicit when the row's new status, times and
// reason say the entry's outcome; otherwise (e.written) the journal is
// written out.
func finishSQL(table, now string, e ending, implicit bool) string {
	patch := func(j string) string {
		return patchFenceEntry(j, "$2::bigint", func(x string) string {
			return fmt.Sprintf("(%s - {Reason}) || jsonb_build_object({Ended}, %s, {LeaseUntil}, %s, {Outcome}, '%s') || %s",
				x, now, now, e.outcome, reasonPatch(e.reason))
		})
	}
	journal := keepImplicit("t", implicit, patch)
	if e.written {
		journal = patch(implicitJournalSQL("t"))
	}
	return `UPDATE ` + table + ` AS t SET
	status = '` + string(e.status) + `', lease_until = ` + now + `, updated_at = ` + now + `, ` + e.set(now) + `,
	journal = ` + journal + `
WHERE t.key = $1 AND ` + heldSQL("t", "$2::bigint", "$3::text", now)
}

// lateSQL annotates the journal entry of a stale attempt (fence $2 and
// attempt id $3 of key $1: not ended, not yet annotated) with the time it
// tried to finish or heartbeat after losing the key
// (store.ApplyFinish's annotateLate). It runs only after a finishing
// statement or a heartbeat was refused, and never for an ending whose
// reason says the attempt did not run (store.IsNotRun): the caller
// decides.
func lateSQL(table, now string) string {
	match := func(e string) string { return lateEntrySQL(e, "$2::bigint", "$3::text") }
	return `UPDATE ` + table + ` AS t SET journal = ` + patchEntry("t.journal", "min", match, func(x string) string {
		return x + " || jsonb_build_object({LateFinish}, " + now + ")"
	}) + `
WHERE t.key = $1 AND ` + live(now) + `
	AND NOT (t.fence = $2::bigint AND t.attempt_id = $3::text AND t.status = 'in_progress')
	AND jsonb_typeof(t.journal) = 'array'
	AND EXISTS (SELECT 1 FROM jsonb_array_elements(t.journal) AS j(e) WHERE ` + match("j.e") + `)`
}

// completeBatchSQL is the completions of FinishBatch: it completes many
// attempts (distinct keys, no reason): $1 keys, $2 fences, $3 attempt ids,
// $4 results, $5 retentions (µs). It returns the keys completed.
// The second UPDATE annotates the stale attempts among them (their rows are
// not the first's, so no row is written twice).
//
// The keys come sorted by their UTF-8 bytes (finishRound sorts them as
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
	match := func(e string) string { return lateEntrySQL(e, "r.fence", "r.id") }
	at := func(array string) string { return "(" + array + ")[width_bucket(convert_to(t.key, 'UTF8'), k.keys)]" }
	fence := at("$2::bigint[]")
	return `WITH c AS (SELECT ` + now + ` AS now),
k AS MATERIALIZED (SELECT array_agg(convert_to(u.key, 'UTF8') ORDER BY u.o) AS keys FROM unnest($1::text[]) WITH ORDINALITY AS u(key, o)),
r AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[]) AS u(key, fence, id)),
fin AS (
	UPDATE ` + table + ` AS t SET
		status = 'completed', lease_until = c.now, updated_at = c.now,
		result = ` + at("$4::bytea[]") + `, expires_at = c.now + ` + at("$5::bigint[]") + ` * ` + us + `,
		journal = ` + keepImplicit("t", implicit, func(j string) string {
		return patchFenceEntry(j, fence, func(x string) string {
			return fmt.Sprintf("(%s - {Reason}) || jsonb_build_object({Ended}, c.now, {LeaseUntil}, c.now, {Outcome}, '%s')", x, store.OutcomeCompleted)
		})
	}) + `
	FROM c, k
	WHERE t.key = ANY ($1::text[]) AND ` + at("$1::text[]") + ` = t.key AND ` + heldSQL("t", fence, at("$3::text[]"), "c.now") + `
	RETURNING t.key
),
late AS (
	UPDATE ` + table + ` AS t SET journal = ` + patchEntry("t.journal", "min", match, func(x string) string {
		return x + " || jsonb_build_object({LateFinish}, c.now)"
	}) + `
	FROM r, c
	WHERE (SELECT count(*) FROM fin) < cardinality($1::text[])
		AND t.key = ANY ($1::text[]) AND t.key = r.key AND NOT EXISTS (SELECT 1 FROM fin WHERE fin.key = r.key)
		AND ` + live("c.now") + `
		AND NOT (t.fence = r.fence AND t.attempt_id = r.id AND t.status = 'in_progress')
		AND jsonb_typeof(t.journal) = 'array'
		AND EXISTS (SELECT 1 FROM jsonb_array_elements(t.journal) AS j(e) WHERE ` + match("j.e") + `)
	RETURNING 1
)
SELECT key FROM fin`
}

// extendSQL renews the lease of the attempt with fence $2 and attempt id
// $3 of key $1 to now + $4 µs (store.ApplyExtend) and returns the new
// LeaseUntil; no row when the attempt no longer holds the key (lateSQL
// then annotates its entry: a refused heartbeat proves the attempt was
// still running).
func extendSQL(table, now string, implicit bool) string {
	until := now + " + $4::bigint * " + us
	return `UPDATE ` + table + ` AS t SET
	lease_until = ` + until + `,
	expires_at = greatest(t.expires_at, ` + until + `),
	updated_at = ` + now + `,
	journal = ` + keepImplicit("t", implicit, func(j string) string {
		return patchFenceEntry(j, "$2::bigint", func(x string) string {
			return x + " || jsonb_build_object({LeaseUntil}, " + until + ")"
		})
	}) + `
WHERE t.key = $1 AND ` + heldSQL("t", "$2::bigint", "$3::text", now) + `
RETURNING t.lease_until`
}

// resolveSQL applies an operator's decision (store.ApplyResolve): $1 key,
// $2 done, $3 result, $4 reason, $5 retention (µs), $6 by, and the
// conditions of store.ResolveRequest: $7 fence (0: any), $8 attempt id
// ("": any; else the row is in_progress with it), $9 in progress only,
// $10 lapsed only (in_progress and the lease passed). It returns the
// record; no row means absent, expired, or a condition failed (the caller
// tells which with the exists statement).
func resolveSQL(table, now string) string {
	outcome := `CASE WHEN $2::boolean THEN '` + string(store.OutcomeResolvedDone) + `' ELSE '` + string(store.OutcomeResolvedNotDone) + `' END`
	// A decision is never implicit: the journal is written out.
	j := implicitJournalSQL("t")
	openEntry := `(SELECT coalesce(j.e ->> {Outcome}, '') = '' FROM jsonb_array_elements(` + j + `) WITH ORDINALITY AS j(e, o)
			WHERE j.e -> {Fence} = to_jsonb(t.fence) ORDER BY j.o DESC LIMIT 1)`
	return `WITH c AS (SELECT ` + now + ` AS now)
UPDATE ` + table + ` AS t SET
	fence = t.fence + 1,
	updated_at = c.now,
	lease_until = c.now,
	reason = $4::text,
	status = CASE WHEN $2::boolean THEN 'completed' ELSE 'released' END,
	result = CASE WHEN $2::boolean THEN $3::bytea END,
	expires_at = CASE WHEN $2::boolean THEN c.now + $5::bigint * ` + us + ` ELSE t.expires_at END,
	journal = CASE
		-- The attempt of the current fence has no outcome yet: this decides it.
		WHEN jsonb_typeof(` + j + `) = 'array' AND ` + openEntry + ` IS TRUE
		THEN ` + patchFenceEntry(j, "t.fence", func(x string) string {
		return fmt.Sprintf(`(%[1]s - {Reason} - {ResolvedBy}) || jsonb_build_object({Ended}, c.now, {Outcome}, %[2]s) || %[3]s ||
				CASE WHEN $6::text <> '' THEN jsonb_build_object({ResolvedBy}, $6::text) ELSE '{}'::jsonb END ||
				CASE WHEN (%[1]s ->> {LeaseUntil})::timestamptz > c.now THEN jsonb_build_object({LeaseUntil}, c.now) ELSE '{}'::jsonb END`,
			x, outcome, reasonPatch("$4::text"))
	}) + `
		-- Otherwise the decision gets an entry of its own.
		ELSE ` + trimJournal(`CASE WHEN jsonb_typeof(`+j+`) = 'array' THEN `+j+` ELSE '[]'::jsonb END ||
			jsonb_strip_nulls(jsonb_build_object({Attempt}, t.attempt, {Fence}, t.fence + 1, {Owner}, nullif($6::text, ''),
				{Started}, c.now, {LeaseUntil}, c.now, {Ended}, c.now, {Outcome}, `+outcome+`, {Reason}, nullif($4::text, ''),
				{ResolvedBy}, nullif($6::text, ''), {Decision}, true))`) + `
	END
FROM c
WHERE t.key = $1 AND ` + live("c.now") + `
	AND ($7::bigint = 0 OR t.fence = $7::bigint)
	AND ($8::text = '' OR (t.status = 'in_progress' AND t.attempt_id = $8::text))
	AND (NOT $9::boolean OR t.status = 'in_progress')
	AND (NOT $10::boolean OR (t.status = 'in_progress' AND t.lease_until <= c.now))
RETURNING ` + cols("t")
}

// queries are a store's statements, built once from its table name and
// clock.
type queries struct {
	now, claim, claimBatch, claimNew                 string
	complete, completeReason, fail, release, abandon string
	late, extend, completeBatch                      string
	get, exists, listStuck                           string
	resolve, delete, sweep                           string
	// listFrom begins every List statement ($1 the cursor, $2 the limit),
	// and clock is the store's clock in SQL: see listSQL.
	listFrom, clock string
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
	w := wireNames.Replace
	return queries{
		now:            "SELECT " + now,
		claim:          w(claimSQL(table, now, implicit)),
		claimBatch:     w(claimBatchSQL(table, now, implicit)),
		claimNew:       w(claimNewSQL(table, now, implicit)),
		complete:       w(finishSQL(table, now, endComplete, implicit)),
		completeReason: w(finishSQL(table, now, endCompleteReason, implicit)),
		fail:           w(finishSQL(table, now, endFail, implicit)),
		release:        w(finishSQL(table, now, endRelease, implicit)),
		abandon:        w(finishSQL(table, now, endAbandon, implicit)),
		late:           w(lateSQL(table, now)),
		extend:         w(extendSQL(table, now, implicit)),
		completeBatch:  w(completeBatchSQL(table, now, implicit)),
		get:            "SELECT " + cols("t") + " FROM " + table + " AS t\nWHERE t.key = $1 AND " + live(now),
		exists:         "SELECT EXISTS (SELECT 1 FROM " + table + " AS t WHERE t.key = $1 AND " + live(now) + ")",
		listStuck:      list(stuck),
		listFrom:       "SELECT " + cols("t") + " FROM " + table + " AS t\nWHERE " + live(now) + " AND t.key > $1",
		clock:          now,
		resolve:        w(resolveSQL(table, now)),
		delete:         "DELETE FROM " + table + " AS t WHERE t.key = $1 AND " + live(now),
		// Bounded batches: lock at most $1 expired rows, oldest first (an
		// index range scan on expires_at that stops at the first live
		// row: the clock must be an index condition here, not a join with
		// a CTE), skipping rows another sweeper or a claim holds, and
		// delete them by ctid (a TID scan, no second index lookup).
		sweep: "DELETE FROM " + table + " AS t\nWHERE t.ctid = ANY (ARRAY(\n\tSELECT s.ctid FROM " + table + " AS s WHERE s.expires_at <= " + now +
			"\n\tORDER BY s.expires_at LIMIT $1 FOR UPDATE SKIP LOCKED))\nAND t.expires_at <= " + now,
	}
}

// listSQL is the statement of [Store.List] for lq (checked, its Prefix
// valid text) and its arguments: $1 the cursor, $2 the limit, then those
// of the filters lq sets. Statuses are literals, so that the planner can
// use the partial index of in_progress rows; Prefix is a key range, which
// the primary key (or that index) reads as a range. The filters lq may
// set make a few dozen distinct statements, each prepared once per
// connection.
func (q *queries) listSQL(lq store.ListQuery) (string, []any) {
	var b strings.Builder
	b.WriteString(q.listFrom)
	args := []any{lq.After, lq.PageSize()}
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if lq.Status != "" {
		b.WriteString(" AND t.status = '" + string(lq.Status) + "'")
	}
	if lq.Stuck || lq.Indeterminate {
		b.WriteString(" AND t.status = 'in_progress' AND t.lease_until <= " + q.clock)
	}
	if lq.Indeterminate {
		b.WriteString(" AND t.policy = '" + store.AtMostOnce.String() + "'")
	}
	if lq.Prefix != "" {
		if lq.Prefix > lq.After {
			b.WriteString(" AND t.key >= " + arg(lq.Prefix))
		}
		if end := store.PrefixEnd(lq.Prefix); end != "" {
			b.WriteString(" AND t.key < " + arg(end))
		}
	}
	// updated_at is in whole microseconds, and pgx sends a time cut to its
	// microsecond: before t is before t's microsecond rounded up.
	if !lq.UpdatedAfter.IsZero() {
		b.WriteString(" AND t.updated_at > " + arg(lq.UpdatedAfter))
	}
	if !lq.UpdatedBefore.IsZero() {
		before := lq.UpdatedBefore.Truncate(time.Microsecond)
		if before.Before(lq.UpdatedBefore) {
			before = before.Add(time.Microsecond)
		}
		b.WriteString(" AND t.updated_at < " + arg(before))
	}
	b.WriteString("\nORDER BY t.key LIMIT $2")
	return b.String(), args
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
