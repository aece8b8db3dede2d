-- Messages of every queue. receipt is set by each receive and cleared by
-- Retry: a settle must name the current one.
CREATE TABLE {{messages}} (
	id             bigserial   PRIMARY KEY,
	queue          text        NOT NULL,
	body           bytea       NOT NULL,
	attributes     jsonb,
	group_id       text,
	dedup_id       text,
	visible_at     timestamptz NOT NULL,
	receive_count  integer     NOT NULL DEFAULT 0,
	receipt        bigint,
	first_received timestamptz,
	published      timestamptz NOT NULL
);
CREATE INDEX {{messages_visible}} ON {{messages}} (queue, visible_at, id);
CREATE INDEX {{messages_group}} ON {{messages}} (queue, group_id, id) WHERE group_id IS NOT NULL;

CREATE TABLE {{dead}} (
	id             bigint PRIMARY KEY,
	queue          text        NOT NULL,
	body           bytea       NOT NULL,
	attributes     jsonb,
	group_id       text,
	dedup_id       text,
	receive_count  integer     NOT NULL,
	first_received timestamptz,
	published      timestamptz NOT NULL,
	reason         text        NOT NULL,
	dead_at        timestamptz NOT NULL
);
CREATE INDEX {{dead_queue}} ON {{dead}} (queue, id);

CREATE TABLE {{dedup}} (
	queue      text        NOT NULL,
	dedup_id   text        NOT NULL,
	message_id bigint      NOT NULL,
	expires_at timestamptz NOT NULL,
	PRIMARY KEY (queue, dedup_id)
);
CREATE INDEX {{dedup_expires}} ON {{dedup}} (expires_at);
