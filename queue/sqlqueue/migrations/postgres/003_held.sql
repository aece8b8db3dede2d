-- Held messages: a message of a FIFO group that is not its group's head
-- (the group's lowest id) keeps its visibility time in held_visible_at
-- and has visible_at at 2200-01-01, so the receive's range on (queue,
-- visible_at, id) never reaches it, however many wait behind a group
-- whose head is in flight. The triggers keep it so after every commit:
-- an insert holds the new message if its group has a lower id, else holds
-- the group's later messages (a redriven message keeps its old, lower
-- id); a delete releases the group's new lowest id. A message in flight
-- is never held (its visible_at is its receipt's deadline).
--
-- The insert's trigger is deferred: it runs when the publishing
-- transaction commits, so a transaction that stays open (a PublishTx)
-- holds nothing up. Both triggers first take a transaction-scoped
-- advisory lock on the (schema, queue, group), held from then to the
-- commit (microseconds), so the writers of one group take turns: each
-- statement of a trigger (plpgsql under READ COMMITTED takes a new
-- snapshot per statement) sees what the other committed, and a delete
-- never misses a message published behind the message it deletes. Under
-- REPEATABLE READ or SERIALIZABLE the snapshot is the transaction's: an
-- insert locks the lower message it saw (FOR KEY SHARE), which fails with
-- a serialization error if that message has been deleted since; a
-- delete, which could miss a message published behind it, fails.
ALTER TABLE {{messages}} ADD COLUMN held_visible_at timestamptz;

UPDATE {{messages}} m SET held_visible_at = m.visible_at, visible_at = '2200-01-01 00:00:00+00'
WHERE m.group_id IS NOT NULL AND m.receipt IS NULL AND EXISTS (
	SELECT 1 FROM {{messages}} e WHERE e.queue = m.queue AND e.group_id = m.group_id AND e.id < m.id);

CREATE FUNCTION {{hold}}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	lower_id bigint;
BEGIN
	PERFORM pg_advisory_xact_lock(hashtextextended(NEW.group_id, hashtextextended(NEW.queue, hashtextextended(TG_TABLE_SCHEMA, 0))));
	SELECT e.id INTO lower_id FROM {{messages}} e
	WHERE e.queue = NEW.queue AND e.group_id = NEW.group_id AND e.id < NEW.id
	ORDER BY e.id LIMIT 1;
	IF lower_id IS NOT NULL THEN
		IF current_setting('transaction_isolation') <> 'read committed' THEN
			-- The snapshot may still show a message deleted since: lock it
			-- (a serialization error if it is gone), so that its delete
			-- waits for this transaction and then releases NEW.
			PERFORM 1 FROM {{messages}} e WHERE e.id = lower_id FOR KEY SHARE;
		END IF;
		UPDATE {{messages}} SET held_visible_at = visible_at, visible_at = '2200-01-01 00:00:00+00'
		WHERE id = NEW.id;
	ELSE
		UPDATE {{messages}} SET held_visible_at = visible_at, visible_at = '2200-01-01 00:00:00+00'
		WHERE queue = NEW.queue AND group_id = NEW.group_id AND id > NEW.id
		  AND held_visible_at IS NULL AND receipt IS NULL;
	END IF;
	RETURN NULL;
END
$$;

CREATE FUNCTION {{release}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		RAISE EXCEPTION 'sqlqueue: a message of FIFO group % of queue % deleted under % isolation: the queue''s writes need READ COMMITTED',
			OLD.group_id, OLD.queue, current_setting('transaction_isolation')
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	PERFORM pg_advisory_xact_lock(hashtextextended(OLD.group_id, hashtextextended(OLD.queue, hashtextextended(TG_TABLE_SCHEMA, 0))));
	UPDATE {{messages}} SET visible_at = held_visible_at, held_visible_at = NULL
	WHERE id = (
		SELECT min(id) FROM {{messages}}
		WHERE queue = OLD.queue AND group_id = OLD.group_id)
	  AND held_visible_at IS NOT NULL;
	RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER idem_queue_messages_hold AFTER INSERT ON {{messages}}
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.group_id IS NOT NULL) EXECUTE FUNCTION {{hold}}();
CREATE TRIGGER idem_queue_messages_release AFTER DELETE ON {{messages}}
	FOR EACH ROW WHEN (OLD.group_id IS NOT NULL) EXECUTE FUNCTION {{release}}();
