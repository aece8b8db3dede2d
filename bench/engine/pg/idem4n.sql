SELECT nextval('bench_idem.bseq')*100 AS b \gset
BEGIN;
INSERT INTO bench_idem.idem_queue_messages (id, queue, body, visible_at, published) SELECT g, 'q', '\x00'::bytea, now(), now() FROM generate_series(:b, :b+99) g;
COMMIT;
BEGIN;
SELECT id FROM bench_idem.idem_queue_messages WHERE queue = 'q' AND id BETWEEN :b AND :b+99 AND visible_at <= now() ORDER BY visible_at, id LIMIT 100;
INSERT INTO bench_idem.e2e_1 (key, status, policy, fence, attempt, lease_until, expires_at, created_at, updated_at) SELECT 'k' || g, 'in_progress', 'alo', 1, 1, now() + interval '30s', now() + interval '1 day', now(), now() FROM generate_series(:b, :b+99) g;
COMMIT;
BEGIN;
DELETE FROM bench_idem.idem_queue_messages WHERE id BETWEEN :b AND :b+99;
UPDATE bench_idem.e2e_1 SET status = 'done', result = '\x00', updated_at = now(), lease_until = now() WHERE key IN (SELECT 'k' || g FROM generate_series(:b, :b+99) g);
COMMIT;
