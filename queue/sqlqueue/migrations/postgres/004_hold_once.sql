-- 004: a transaction that publishes several messages of one FIFO group
-- whose earlier messages are gone (PublishBatch, or PublishTx called more
-- than once) fires the deferred hold trigger once per message, at commit,
-- in publish order. The first message's trigger holds the group's later
-- messages; a later message's own trigger then found a lower id and held
-- itself again, copying the visible_at it already had (the held marker)
-- into held_visible_at: the release then made it visible in 2200, and the
-- group stopped behind it. A message is held once: its own trigger leaves
-- it as it is when it is already held.
--
-- The table lock first: a publish that commits while this migration runs
-- would still run the old function (the new one takes effect at this
-- migration's commit) and hide messages the repair below did not see.
-- Publishes under way finish first; the next ones wait, then use the new
-- function.
LOCK TABLE {{messages}} IN SHARE ROW EXCLUSIVE MODE;

CREATE OR REPLACE FUNCTION {{hold}}() RETURNS trigger LANGUAGE plpgsql AS $$
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
		WHERE id = NEW.id AND held_visible_at IS NULL;
	ELSE
		UPDATE {{messages}} SET held_visible_at = visible_at, visible_at = '2200-01-01 00:00:00+00'
		WHERE queue = NEW.queue AND group_id = NEW.group_id AND id > NEW.id
		  AND held_visible_at IS NULL AND receipt IS NULL;
	END IF;
	RETURN NULL;
END
$$;

-- The messages hidden so already: held with the marker itself as their
-- visibility, or released with it (only FIFO messages are ever held, and
-- the marker is copied exactly; a message published with a delay reaching
-- 2200 is left alone). They become visible at their publish time (the
-- delay they were published with is not kept anywhere).
UPDATE {{messages}} SET held_visible_at = published
WHERE group_id IS NOT NULL AND held_visible_at = '2200-01-01 00:00:00+00';
UPDATE {{messages}} SET visible_at = published
WHERE group_id IS NOT NULL AND visible_at = '2200-01-01 00:00:00+00' AND held_visible_at IS NULL AND receipt IS NULL;
