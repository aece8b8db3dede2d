#!/bin/bash
# gen.sh ROWS BATCHES: the SQL of BATCHES batches of 500 messages. Variants:
# 5 idem today (publish insert, receive update, claim insert, completion update, ack delete)
# 4 the same without the receive update
# 3 the queue's own writes, no ledger row (publish insert, receive update, ack delete)
v=$1; nb=$2
echo "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
for b in $(seq 0 $((nb-1))); do
  lo=$((b*500+1)); hi=$((b*500+500))
  echo "BEGIN; WITH RECURSIVE g(i) AS (SELECT $lo UNION ALL SELECT i+1 FROM g WHERE i < $hi) INSERT INTO idem_queue_messages (id, queue, body, visible_at, published) SELECT i, 'q', x'00', 1, 1 FROM g; COMMIT;"
  echo "BEGIN;"
  if [ "$v" != 4 ]; then
    echo "UPDATE idem_queue_messages SET visible_at = 2000000000000000 + id, receive_count = receive_count + 1, receipt = random(), first_received = coalesce(first_received, 5) WHERE id IN (SELECT id FROM idem_queue_messages WHERE queue = 'q' AND visible_at <= 10 ORDER BY visible_at, id LIMIT 500);"
  else
    echo "SELECT count(*) FROM (SELECT id FROM idem_queue_messages WHERE queue = 'q' AND visible_at <= 10 ORDER BY visible_at, id LIMIT 500);"
  fi
  if [ "$v" != 3 ]; then
    echo "WITH RECURSIVE g(i) AS (SELECT $lo UNION ALL SELECT i+1 FROM g WHERE i < $hi) INSERT INTO idem_records (key, status, policy, fence, attempt, lease_until, expires_at, created_at, updated_at, version) SELECT 'k' || i, 'in_progress', 'alo', 1, 1, 9, 99999, 1, 1, 1 FROM g;"
  fi
  echo "COMMIT;"
  echo "BEGIN; DELETE FROM idem_queue_messages WHERE id BETWEEN $lo AND $hi;"
  if [ "$v" != 3 ]; then
    echo "WITH RECURSIVE g(i) AS (SELECT $lo UNION ALL SELECT i+1 FROM g WHERE i < $hi) UPDATE idem_records SET status = 'done', result = x'00', updated_at = 2, lease_until = NULL, version = version + 1 WHERE key IN (SELECT 'k' || i FROM g);"
  fi
  echo "COMMIT;"
done
