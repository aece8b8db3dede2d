-- 001: the record table (one row per key) and the indexes behind List and
-- Sweep. Times are unix microseconds (NULL for a zero time); journal is the
-- JSON of []idem.JournalEntry, oldest first; version grows with every write
-- of the row (from a random start), for compare-and-set writes.
CREATE TABLE idem_records (
	key         TEXT    NOT NULL PRIMARY KEY,
	status      TEXT    NOT NULL,
	policy      TEXT    NOT NULL,
	fence       INTEGER NOT NULL,
	attempt     INTEGER NOT NULL,
	owner       TEXT    NOT NULL DEFAULT '',
	fingerprint TEXT    NOT NULL DEFAULT '',
	result      BLOB,
	reason      TEXT    NOT NULL DEFAULT '',
	lease_until INTEGER,
	expires_at  INTEGER NOT NULL,
	created_at  INTEGER,
	updated_at  INTEGER,
	journal     TEXT    NOT NULL DEFAULT '[]',
	version     INTEGER NOT NULL
) WITHOUT ROWID;

-- List(Status) and List(Stuck). Records are mostly completed, so List of
-- completed records (or of any status) walks the primary key; the other
-- statuses have small partial indexes, which cost a claim and its
-- completion one entry in one small index instead of a place in an index
-- of every record. (Queries name the status as a literal, so that SQLite
-- can use them.)
CREATE INDEX idem_records_in_progress ON idem_records (key) WHERE status = 'in_progress';
CREATE INDEX idem_records_failed ON idem_records (key) WHERE status = 'failed';
CREATE INDEX idem_records_released ON idem_records (key) WHERE status = 'released';

-- Sweep: expires_at <= now.
CREATE INDEX idem_records_expires_at ON idem_records (expires_at);

-- Every change of a row changes its version, also an UPDATE from outside
-- the store (an operator's fix, a tool) that does not bump it itself: the
-- store's compare-and-set writes must never overwrite a row they did not
-- read.
CREATE TRIGGER idem_records_version AFTER UPDATE ON idem_records
WHEN NEW.version = OLD.version
BEGIN
	UPDATE idem_records SET version = OLD.version + 1 WHERE key = NEW.key;
END;
