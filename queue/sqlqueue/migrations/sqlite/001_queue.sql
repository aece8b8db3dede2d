-- Messages of every queue. Times are unix microseconds on the clock of
-- the process that wrote them. receipt is set by each receive and cleared
-- by Retry: a settle must name the current one.
CREATE TABLE idem_queue_messages (
	id             INTEGER PRIMARY KEY AUTOINCREMENT,
	queue          TEXT    NOT NULL,
	body           BLOB    NOT NULL,
	attributes     TEXT,
	group_id       TEXT,
	dedup_id       TEXT,
	visible_at     INTEGER NOT NULL,
	receive_count  INTEGER NOT NULL DEFAULT 0,
	receipt        INTEGER,
	first_received INTEGER,
	published      INTEGER NOT NULL
);
CREATE INDEX idem_queue_messages_visible ON idem_queue_messages (queue, visible_at, id);
CREATE INDEX idem_queue_messages_group ON idem_queue_messages (queue, group_id, id) WHERE group_id IS NOT NULL;

CREATE TABLE idem_queue_dead (
	id             INTEGER PRIMARY KEY,
	queue          TEXT    NOT NULL,
	body           BLOB    NOT NULL,
	attributes     TEXT,
	group_id       TEXT,
	dedup_id       TEXT,
	receive_count  INTEGER NOT NULL,
	first_received INTEGER,
	published      INTEGER NOT NULL,
	reason         TEXT    NOT NULL,
	dead_at        INTEGER NOT NULL
);
CREATE INDEX idem_queue_dead_queue ON idem_queue_dead (queue, id);

CREATE TABLE idem_queue_dedup (
	queue      TEXT    NOT NULL,
	dedup_id   TEXT    NOT NULL,
	message_id INTEGER NOT NULL,
	expires_at INTEGER NOT NULL,
	PRIMARY KEY (queue, dedup_id)
) WITHOUT ROWID;
CREATE INDEX idem_queue_dedup_expires ON idem_queue_dedup (expires_at);
