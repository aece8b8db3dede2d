-- The in-flight messages of FIFO groups, for the receive's check that no
-- other message of a group is in flight (a redriven message keeps its id,
-- and a publish that commits late has an id lower than later publishes',
-- so either may sort before a group's message already handed out).
CREATE INDEX {{messages_group_in_flight}} ON {{messages}} (queue, group_id, visible_at)
	WHERE group_id IS NOT NULL AND receipt IS NOT NULL;
