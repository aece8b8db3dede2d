-- 004: the highest fence of any record deleted from idem_records (Delete,
-- Sweep, or a DELETE from outside the store), in one row. A new record's
-- first fence is above it as well as the clock's microseconds
-- (store.FirstFence), so a key deleted and claimed again never repeats a
-- fence, even when the clock has not moved or went back since. The insert
-- of a new record is conditional on it, in the same write transaction that
-- SQLite serializes across processes, so the floor is exact.
CREATE TABLE idem_fence_floor (
	id    INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
	floor INTEGER NOT NULL
);
INSERT INTO idem_fence_floor (id, floor) VALUES (1, 0);

CREATE TRIGGER idem_records_fence_floor AFTER DELETE ON idem_records
WHEN OLD.fence > (SELECT floor FROM idem_fence_floor WHERE id = 1)
BEGIN
	UPDATE idem_fence_floor SET floor = OLD.fence WHERE id = 1;
END;
