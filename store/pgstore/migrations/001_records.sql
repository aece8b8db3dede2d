-- 001: the record table, one row per key, and the indexes behind Sweep and
-- List(Stuck). Placeholders in braces are replaced by quoted identifiers
-- derived from the table name (see migrate.go).
--
-- key is COLLATE "C": keys are compared and ordered byte by byte, as Go
-- compares strings, whatever the database's collation (List pages in key
-- order; a linguistic collation could also merge keys that differ).
--
-- status and policy are plain text without CHECK constraints: the store
-- validates them on every read and reports a damaged row as corrupt
-- instead of reading it as absent.
--
-- journal is the JSON of []idem.JournalEntry (the json field names of
-- idem.JournalEntry), oldest first, at most idem.MaxJournal entries.
CREATE TABLE {{table}} (
	key         text COLLATE "C" NOT NULL,
	status      text        NOT NULL,
	policy      text        NOT NULL,
	fence       bigint      NOT NULL,
	attempt     integer     NOT NULL,
	owner       text        NOT NULL DEFAULT '',
	fingerprint text        NOT NULL DEFAULT '',
	result      bytea,
	reason      text        NOT NULL DEFAULT '',
	lease_until timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL,
	created_at  timestamptz NOT NULL,
	updated_at  timestamptz NOT NULL,
	journal     jsonb       NOT NULL DEFAULT '[]',
	CONSTRAINT {{pkey}} PRIMARY KEY (key)
) WITH (
	-- Every key is inserted, updated at least once and deleted by Sweep:
	-- the table churns at a steady rate, so vacuum it after 2% of its rows
	-- are dead rather than the default 20% (see the package doc).
	autovacuum_vacuum_scale_factor = 0.02,
	autovacuum_analyze_scale_factor = 0.02
);

-- Sweep: expires_at <= now, oldest first, in bounded batches.
CREATE INDEX {{expires_idx}} ON {{table}} (expires_at);

-- List(Stuck) and List(Status in_progress), in key order: only the rows of
-- running and lapsed attempts, a small fraction of a large table.
CREATE INDEX {{in_progress_idx}} ON {{table}} (key) WHERE status = 'in_progress';
