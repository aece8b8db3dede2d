SELECT nextval('bench_river.bseq')*100 AS b \gset
BEGIN;
INSERT INTO bench_river.river_job (id, state, args, kind, queue, max_attempts, priority, scheduled_at) SELECT g, 'available', '{}'::jsonb, 'noop', 'default', 25, 1, now() FROM generate_series(:b, :b+99) g;
COMMIT;
BEGIN;
UPDATE bench_river.river_job SET state = 'running', attempt = attempt + 1, attempted_at = now(), attempted_by = array_append(attempted_by, 'w') WHERE id = ANY (ARRAY(SELECT id FROM bench_river.river_job WHERE state = 'available' AND queue = 'default' AND id BETWEEN :b AND :b+99 ORDER BY priority, scheduled_at, id LIMIT 100 FOR UPDATE SKIP LOCKED));
COMMIT;
BEGIN;
UPDATE bench_river.river_job SET state = 'completed', finalized_at = now() WHERE id BETWEEN :b AND :b+99;
COMMIT;
