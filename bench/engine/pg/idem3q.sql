SELECT nextval('bench_idem.bseq')*100 AS b \gset
BEGIN;
INSERT INTO bench_idem.idem_queue_messages (id, queue, body, visible_at, published) SELECT g, 'q', '\x00'::bytea, now(), now() FROM generate_series(:b, :b+99) g;
COMMIT;
BEGIN;
UPDATE bench_idem.idem_queue_messages m SET visible_at = now() + interval '30s', receive_count = m.receive_count + 1, receipt = (random()*4e18)::bigint, first_received = coalesce(m.first_received, now()) WHERE m.id = ANY (ARRAY(SELECT id FROM bench_idem.idem_queue_messages WHERE queue = 'q' AND id BETWEEN :b AND :b+99 AND visible_at <= now() ORDER BY visible_at, id LIMIT 100 FOR UPDATE SKIP LOCKED));
COMMIT;
BEGIN;
DELETE FROM bench_idem.idem_queue_messages WHERE id BETWEEN :b AND :b+99;
COMMIT;
