package pgstore

import (
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// The store's SQL. Every call is one statement; the state machine of
// internal/transition is written here in SQL, over the columns of one row:
//
//   - c, the first CTE of every statement, reads the clock once:
//     statement_timestamp() (plus a test offset, see withClockTable). It is
//     now() for a statement of its own and the statement's start inside a
//     transaction (InTx), so the completion at the end of a long fn gets its
//     own time. The clock is evaluated once, so every time a statement
//     writes is the same instant.
//   - Durations are passed as microseconds (bigint) and multiplied by
//     interval '1 microsecond'.
//   - The journal is jsonb, manipulated with jsonb_set, || and
//     jsonb_path_query_array; its entries keep the json field names of
//     idem.JournalEntry, so records decode with encoding/json.

// recordColumns are the columns of a record, in the order scanRecord reads
// them.
var recordColumns = []string{"key", "status", "policy", "fence", "attempt", "owner", "fingerprint", "result",
	"reason", "lease_until", "expires_at", "created_at", "updated_at", "journal"}

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

// trimJournal keeps the newest idem.MaxJournal entries of the array j.
func trimJournal(j string) string {
	return fmt.Sprintf("jsonb_path_query_array(%s, '$[last - %d to last]')", j, idem.MaxJournal-1)
}

// claimable is the claim condition on the row t at now (transition.Claim):
// expired (absent), or released, or in_progress with a lapsed lease that
// may be taken over (at_least_once, or take and at_most_once). A row whose
// status, policy or journal is damaged is not claimable unless it expired.
func claimable(t, now, take string) string {
	return fmt.Sprintf(`(%[1]s.expires_at <= %[2]s OR (jsonb_typeof(%[1]s.journal) = 'array' AND (
		%[1]s.status = 'released' OR (%[1]s.status = 'in_progress' AND %[1]s.lease_until <= %[2]s AND (
			%[1]s.policy = 'at_least_once' OR (%[1]s.policy = 'at_most_once' AND %[3]s))))))`, t, now, take)
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
// the usual case (a fast path without unnesting the array), else found by
// patchEntry.
func patchFenceEntry(j, f string, patch func(e string) string) string {
	return fmt.Sprintf(`CASE WHEN %[1]s -> -1 -> 'f' = to_jsonb(%[2]s) THEN jsonb_set(%[1]s, '{-1}', %[3]s) ELSE %[4]s END`,
		j, f, patch("("+j+" -> -1)"),
		patchEntry(j, "max", func(e string) string { return fmt.Sprintf("%s -> 'f' = to_jsonb(%s)", e, f) }, patch))
}

// reasonPatch is the "r" member of a journal entry: reason, or nothing.
func reasonPatch(reason string) string {
	return fmt.Sprintf(`CASE WHEN %[1]s <> '' THEN jsonb_build_object('r', %[1]s) ELSE '{}'::jsonb END`, reason)
}

// claimInputScalar is the claim's input for one request: $1 key, $2 owner,
// $3 correlation, $4 policy, $5 lease (µs), $6 retention (µs), $7
// fingerprint, $8 take lapsed.
const claimInputScalar = `SELECT $1::text AS key, $2::text AS owner, $3::text AS corr, $4::text AS policy,
		$5::bigint AS lease, $6::bigint AS ret, $7::text AS fp, $8::boolean AS take`

// claimInputBatch is the claim's input for many requests (distinct keys),
// the same parameters as arrays.
const claimInputBatch = `SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[],
		$5::bigint[], $6::bigint[], $7::text[], $8::boolean[]) AS u(key, owner, corr, policy, lease, ret, fp, take)`

// claimSQL is the claim: one INSERT ... ON CONFLICT (key) DO UPDATE ...
// WHERE <claimable> RETURNING for the requests of input (distinct keys),
// plus, for the keys it did not acquire, the rows as the statement's
// snapshot found them. Each result row is a record, acquired, claimable
// (for a row not acquired: whether the snapshot's row was claimable, which
// means it changed under the statement and the claim must run again), and
// the statement's clock.
//
// Concurrency (READ COMMITTED): the INSERT either inserts the key or, on a
// conflict, locks the row's latest committed version, waiting for a
// concurrent writer of the key to finish, and evaluates the WHERE on that
// version; the DO UPDATE reads t.* from it. So an acquired claim is always
// decided on the latest row, never on a stale one. When the WHERE is false,
// nothing is written and RETURNING gives nothing; the fallback SELECT then
// reads the row from the statement's snapshot, which is older than the
// version the WHERE saw if another transaction committed the key in
// between. That version was not claimable; the snapshot's may have been
// (or absent). The caller detects exactly that case from the claimable
// column (or a missing row) and runs the claim again, with a new snapshot.
// Any other snapshot row is a true answer as of the statement's start
// (for example "busy" for a holder that completed a moment later).
func claimSQL(table, now, input string) string {
	return `WITH c AS (SELECT ` + now + ` AS now),
r AS (` + input + `),
ins AS (
	INSERT INTO ` + table + ` AS t (` + strings.Join(recordColumns, ", ") + `)
	SELECT r.key, 'in_progress', r.policy, 1, 1, r.owner, r.fp, NULL, '',
		c.now + r.lease * ` + us + `, c.now + greatest(r.lease, r.ret) * ` + us + `, c.now, c.now,
		jsonb_build_array(jsonb_strip_nulls(jsonb_build_object('a', 1, 'f', 1,
			'o', nullif(r.owner, ''), 'c', nullif(r.corr, ''), 's', c.now, 'l', c.now + r.lease * ` + us + `,
			'p', r.policy)))
	FROM r, c
	ORDER BY r.key COLLATE "C"
	ON CONFLICT (key) DO UPDATE SET
		status = 'in_progress',
		policy = excluded.policy,
		fence = t.fence + 1,
		attempt = t.attempt + 1,
		owner = excluded.owner,
		fingerprint = excluded.fingerprint,
		result = NULL,
		lease_until = excluded.lease_until,
		expires_at = excluded.expires_at,
		created_at = CASE WHEN t.expires_at <= excluded.created_at THEN excluded.created_at ELSE t.created_at END,
		updated_at = excluded.updated_at,
		journal = ` + trimJournal(`
			CASE
				WHEN jsonb_typeof(t.journal) <> 'array' THEN '[]'::jsonb
				-- A takeover marks the lapsed attempt's entry.
				WHEN t.status = 'in_progress' AND t.expires_at > excluded.created_at
					AND t.journal -> -1 -> 'f' = to_jsonb(t.fence)
					AND jsonb_typeof(t.journal -> -1) = 'object'
					AND coalesce(t.journal -> -1 ->> 'x', '') = ''
				THEN jsonb_set(t.journal, '{-1,x}', '"`+idem.OutcomeLapsed+`"')
				ELSE t.journal
			END || ((excluded.journal -> 0) || jsonb_build_object('a', t.attempt + 1, 'f', t.fence + 1) ||
				CASE
					WHEN t.expires_at <= excluded.created_at THEN '{"ae": true}'::jsonb
					WHEN t.status = 'in_progress' THEN '{"t": true}'::jsonb
					ELSE '{}'::jsonb
				END)`) + `
	WHERE ` + claimable("t", "excluded.created_at", "(SELECT r.take FROM r WHERE r.key = t.key)") + `
	RETURNING ` + cols("t") + `
)
SELECT ` + cols("ins") + `, true, false, c.now FROM ins, c
UNION ALL
SELECT ` + cols("t") + `, false, ` + claimable("t", "c.now", "r.take") + `, c.now
FROM ` + table + ` AS t JOIN r ON r.key = t.key CROSS JOIN c
WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.key = t.key)`
}

// ending is how finishSQL ends an attempt.
type ending struct {
	status  idem.Status
	outcome string
	set     string // more assignments, with $3 (result or reason) and $4 (retention, µs)
	reason  string // the journal entry's reason
}

var (
	endComplete = ending{idem.StatusCompleted, idem.OutcomeCompleted,
		"result = $3::bytea, expires_at = c.now + $4::bigint * " + us, "''"}
	endFail = ending{idem.StatusFailed, idem.OutcomeFailed,
		"reason = $3::text, expires_at = c.now + $4::bigint * " + us, "$3::text"}
	endRelease = ending{idem.StatusReleased, idem.OutcomeReleased, "reason = $3::text", "$3::text"}
	endAbandon = ending{idem.StatusInProgress, idem.OutcomeAbandoned, "reason = $3::text", "$3::text"}
)

// finishSQL ends the attempt holding fence $2 of key $1 (transition.Finish):
// one UPDATE conditioned on the fence, the status and the expiry. When it
// updates nothing, the second data-modifying CTE annotates the stale
// attempt's journal entry with its late finish (transition.annotateLate),
// in the same statement. It returns whether the attempt ended.
//
// Both UPDATEs re-check their conditions on the row's latest version if a
// concurrent writer changed it (READ COMMITTED); the second runs only when
// the first updated nothing, so they never write the same row.
func finishSQL(table, now string, e ending) string {
	return `WITH c AS (SELECT ` + now + ` AS now),
fin AS (
	UPDATE ` + table + ` AS t SET
		status = '` + string(e.status) + `', lease_until = c.now, updated_at = c.now, ` + e.set + `,
		journal = ` + patchFenceEntry("t.journal", "$2::bigint", func(x string) string {
		return fmt.Sprintf("(%s - 'r') || jsonb_build_object('e', c.now, 'l', c.now, 'x', '%s') || %s",
			x, e.outcome, reasonPatch(e.reason))
	}) + `
	FROM c
	WHERE t.key = $1 AND t.fence = $2 AND t.status = 'in_progress' AND t.expires_at > c.now
	RETURNING 1
),
` + lateCTE(table, "$1", "$2::bigint", "NOT EXISTS (SELECT 1 FROM fin)") + `
SELECT EXISTS (SELECT 1 FROM fin)`
}

// lateCTE is the CTE "late" that annotates a stale attempt's entry (fence
// f of key k) with LateFinish, when cond holds.
func lateCTE(table, k, f, cond string) string {
	match := func(e string) string {
		return fmt.Sprintf("%[1]s -> 'f' = to_jsonb(%[2]s) AND NOT %[1]s ? 'e' AND NOT %[1]s ? 'lf'", e, f)
	}
	return `late AS (
	UPDATE ` + table + ` AS t SET journal = ` + patchEntry("t.journal", "min", match, func(x string) string {
		return x + " || jsonb_build_object('lf', c.now)"
	}) + `
	FROM c
	WHERE t.key = ` + k + ` AND ` + cond + ` AND t.expires_at > c.now
		AND (t.fence <> ` + f + ` OR t.status <> 'in_progress')
		AND jsonb_typeof(t.journal) = 'array'
		AND EXISTS (SELECT 1 FROM jsonb_array_elements(t.journal) AS j(e) WHERE ` + match("j.e") + `)
	RETURNING 1
)`
}

// completeBatchSQL completes many attempts (distinct keys): $1 keys, $2
// fences, $3 results, $4 retentions (µs). It returns the keys completed.
func completeBatchSQL(table, now string) string {
	return `WITH c AS (SELECT ` + now + ` AS now),
r AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::bigint[]) AS u(key, fence, result, ret)),
fin AS (
	UPDATE ` + table + ` AS t SET
		status = 'completed', lease_until = c.now, updated_at = c.now,
		result = r.result, expires_at = c.now + r.ret * ` + us + `,
		journal = ` + patchFenceEntry("t.journal", "r.fence", func(x string) string {
		return fmt.Sprintf("(%s - 'r') || jsonb_build_object('e', c.now, 'l', c.now, 'x', '%s')", x, idem.OutcomeCompleted)
	}) + `
	FROM r, c
	WHERE t.key = r.key AND t.fence = r.fence AND t.status = 'in_progress' AND t.expires_at > c.now
	RETURNING t.key
),
late AS (
	UPDATE ` + table + ` AS t SET journal = ` + patchEntry("t.journal", "min", func(e string) string {
		return fmt.Sprintf("%[1]s -> 'f' = to_jsonb(r.fence) AND NOT %[1]s ? 'e' AND NOT %[1]s ? 'lf'", e)
	}, func(x string) string { return x + " || jsonb_build_object('lf', c.now)" }) + `
	FROM r, c
	WHERE t.key = r.key AND NOT EXISTS (SELECT 1 FROM fin WHERE fin.key = r.key) AND t.expires_at > c.now
		AND (t.fence <> r.fence OR t.status <> 'in_progress')
		AND jsonb_typeof(t.journal) = 'array'
		AND EXISTS (SELECT 1 FROM jsonb_array_elements(t.journal) AS j(e)
			WHERE j.e -> 'f' = to_jsonb(r.fence) AND NOT j.e ? 'e' AND NOT j.e ? 'lf')
	RETURNING 1
)
SELECT key FROM fin`
}

// extendSQL renews the lease of fence $2 of key $1 to now + $3 µs
// (transition.Extend) and returns the new LeaseUntil, or NULL when the
// attempt no longer holds the key; then, like finishSQL, it annotates the
// stale attempt's journal entry with LateFinish: a refused heartbeat proves
// the attempt was still running.
func extendSQL(table, now string) string {
	return `WITH c AS (SELECT ` + now + ` AS now),
fin AS (
	UPDATE ` + table + ` AS t SET
		lease_until = c.now + $3::bigint * ` + us + `,
		expires_at = greatest(t.expires_at, c.now + $3::bigint * ` + us + `),
		updated_at = c.now,
		journal = ` + patchFenceEntry("t.journal", "$2::bigint", func(x string) string {
		return x + " || jsonb_build_object('l', c.now + $3::bigint * " + us + ")"
	}) + `
	FROM c
	WHERE t.key = $1 AND t.fence = $2 AND t.status = 'in_progress' AND t.expires_at > c.now
	RETURNING t.lease_until
),
` + lateCTE(table, "$1", "$2::bigint", "NOT EXISTS (SELECT 1 FROM fin)") + `
SELECT (SELECT lease_until FROM fin)`
}

// resolveSQL applies an operator's decision (transition.Resolve): $1 key,
// $2 fence (0: any), $3 done, $4 result, $5 reason, $6 retention (µs), $7
// by. It returns the record; no row means absent, expired or another
// fence (the caller tells which with existsSQL).
func resolveSQL(table, now string) string {
	outcome := `CASE WHEN $3::boolean THEN '` + idem.OutcomeResolvedDone + `' ELSE '` + idem.OutcomeResolvedNotDone + `' END`
	lastOfFence := `(SELECT coalesce(j.e ->> 'x', '') = '' FROM jsonb_array_elements(t.journal) WITH ORDINALITY AS j(e, o)
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
		WHEN jsonb_typeof(t.journal) = 'array' AND ` + lastOfFence + ` IS TRUE
		-- The attempt of the current fence has no outcome yet: this is it.
		THEN ` + patchFenceEntry("t.journal", "t.fence", func(x string) string {
		return fmt.Sprintf(`(%[1]s - 'r' - 'rb') || jsonb_build_object('e', c.now, 'x', %[2]s) || %[3]s ||
				CASE WHEN $7::text <> '' THEN jsonb_build_object('rb', $7::text) ELSE '{}'::jsonb END ||
				CASE WHEN (%[1]s ->> 'l')::timestamptz > c.now THEN jsonb_build_object('l', c.now) ELSE '{}'::jsonb END`,
			x, outcome, reasonPatch("$5::text"))
	}) + `
		ELSE ` + trimJournal(`CASE WHEN jsonb_typeof(t.journal) = 'array' THEN t.journal ELSE '[]'::jsonb END ||
			jsonb_strip_nulls(jsonb_build_object('a', t.attempt, 'f', t.fence + 1, 'o', nullif($7::text, ''),
				's', c.now, 'l', c.now, 'e', c.now, 'x', `+outcome+`, 'r', nullif($5::text, ''),
				'rb', nullif($7::text, ''), 'd', true))`) + `
	END
FROM c
WHERE t.key = $1 AND t.expires_at > c.now AND ($2::bigint = 0 OR t.fence = $2::bigint)
RETURNING ` + cols("t")
}

// queries are a store's statements, built once from its table name and
// clock.
type queries struct {
	now, claim, claimBatch                                    string
	complete, fail, release, abandon, extend, completeBatch   string
	get, exists, list, listStatus, listStuck, listStuckStatus string
	resolve, delete, sweep                                    string
}

func newQueries(table, clockTable string) queries {
	now := "statement_timestamp()"
	if clockTable != "" {
		now = "(statement_timestamp() + (SELECT off FROM " + clockTable + "))"
	}
	with := "WITH c AS (SELECT " + now + " AS now)\n"
	list := func(where string) string {
		return with + "SELECT " + cols("t") + " FROM " + table + " AS t, c\nWHERE t.expires_at > c.now AND t.key > $1" +
			where + "\nORDER BY t.key LIMIT $2"
	}
	const stuck = " AND t.status = 'in_progress' AND t.lease_until <= c.now"
	return queries{
		now:             with + "SELECT c.now FROM c",
		claim:           claimSQL(table, now, claimInputScalar),
		claimBatch:      claimSQL(table, now, claimInputBatch),
		complete:        finishSQL(table, now, endComplete),
		fail:            finishSQL(table, now, endFail),
		release:         finishSQL(table, now, endRelease),
		abandon:         finishSQL(table, now, endAbandon),
		extend:          extendSQL(table, now),
		completeBatch:   completeBatchSQL(table, now),
		get:             with + "SELECT " + cols("t") + " FROM " + table + " AS t, c\nWHERE t.key = $1 AND t.expires_at > c.now",
		exists:          with + "SELECT EXISTS (SELECT 1 FROM " + table + " AS t, c WHERE t.key = $1 AND t.expires_at > c.now)",
		list:            list(""),
		listStatus:      list(" AND t.status = $3"),
		listStuck:       list(stuck),
		listStuckStatus: list(stuck + " AND t.status = $3"),
		resolve:         resolveSQL(table, now),
		delete:          with + "DELETE FROM " + table + " AS t USING c WHERE t.key = $1 AND t.expires_at > c.now",
		// Bounded batches: lock at most $1 expired rows, oldest first,
		// skipping rows another sweeper (or a claim) holds, and delete them
		// by ctid (a TID scan, no second index lookup).
		sweep: with + "DELETE FROM " + table + " AS t USING c\nWHERE t.ctid = ANY (ARRAY(\n\tSELECT s.ctid FROM " + table +
			" AS s, c WHERE s.expires_at <= c.now ORDER BY s.expires_at LIMIT $1 FOR UPDATE OF s SKIP LOCKED))\n" +
			"AND t.expires_at <= c.now",
	}
}

// micros converts d to whole microseconds, the resolution of the server's
// clock (rounded up, so a positive duration never becomes zero).
func micros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
