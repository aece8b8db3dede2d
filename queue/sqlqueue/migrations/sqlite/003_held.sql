-- Held messages: a message of a FIFO group that is not its group's head
-- (the group's lowest id) keeps its visibility time in held_visible_at
-- and has visible_at at 2200-01-01 (7258118400000000 µs), so the
-- receive's range on (queue, visible_at, id) never reaches it, however
-- many wait behind a group whose head is in flight. The triggers keep it
-- so after every write: an insert holds the new message if its group has
-- a lower id, else holds the group's later messages (a redriven message
-- keeps its old, lower id); a delete releases the group's new lowest id.
-- A message in flight is never held (its visible_at is its receipt's
-- deadline): a redrive behind it leaves it unheld, and the receive's
-- lower-id check holds it back.
ALTER TABLE idem_queue_messages ADD COLUMN held_visible_at INTEGER;

UPDATE idem_queue_messages SET held_visible_at = visible_at, visible_at = 7258118400000000
WHERE group_id IS NOT NULL AND receipt IS NULL AND held_visible_at IS NULL AND EXISTS (
	SELECT 1 FROM idem_queue_messages e
	WHERE e.queue = idem_queue_messages.queue AND e.group_id = idem_queue_messages.group_id AND e.id < idem_queue_messages.id);

CREATE TRIGGER idem_queue_messages_hold AFTER INSERT ON idem_queue_messages
WHEN NEW.group_id IS NOT NULL
BEGIN
	UPDATE idem_queue_messages SET held_visible_at = visible_at, visible_at = 7258118400000000
	WHERE id = NEW.id AND EXISTS (
		SELECT 1 FROM idem_queue_messages e
		WHERE e.queue = NEW.queue AND e.group_id = NEW.group_id AND e.id < NEW.id);
	UPDATE idem_queue_messages SET held_visible_at = visible_at, visible_at = 7258118400000000
	WHERE queue = NEW.queue AND group_id = NEW.group_id AND id > NEW.id
	  AND held_visible_at IS NULL AND receipt IS NULL;
END;

CREATE TRIGGER idem_queue_messages_release AFTER DELETE ON idem_queue_messages
WHEN OLD.group_id IS NOT NULL
BEGIN
	UPDATE idem_queue_messages SET visible_at = held_visible_at, held_visible_at = NULL
	WHERE id = (
		SELECT MIN(id) FROM idem_queue_messages
		WHERE queue = OLD.queue AND group_id = OLD.group_id)
	  AND held_visible_at IS NOT NULL;
END;
