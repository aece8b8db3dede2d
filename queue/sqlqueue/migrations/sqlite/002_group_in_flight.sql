-- The in-flight messages of FIFO groups, for the receive's check that no
-- other message of a group is in flight (a redriven message keeps its id,
-- so it may sort before a group's message already handed out).
CREATE INDEX idem_queue_messages_group_in_flight ON idem_queue_messages (queue, group_id, visible_at)
	WHERE group_id IS NOT NULL AND receipt IS NOT NULL;
