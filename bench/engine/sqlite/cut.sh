#!/bin/bash
# cut.sh [rounds] [inflight] [batches]: what the receive-update cut gives once the
# receive still skips the messages that are taken. run.sh's rows 4 drop the
# receive's update and nothing else, so its receive takes the same messages
# again; here a receive runs while the previous `inflight` batches (default
# 1, 500 messages each) are still being handled, as the consumer's are, and
# must pass them:
#
#   rows 5  idem today: the receive's update hides them (visible_at moves
#           past now, out of the receive's range);
#   rows 4  no receive update and no skipping (run.sh's rows 4): a floor no
#           receiver can use, as it hands the same messages out again;
#   rows 4m no receive update; the claim's record names its message
#           (a message_id column under a partial index of in_progress
#           records, which the completion leaves), and the receive skips
#           the messages whose record is in progress under a live lease:
#           the cheapest mark of a taken message that every receiver (a
#           plain Receive, another process, an older build aside) can read
#           in SQL, as the key of a message is the consumer's Go function.
#
# `batches` (default 40) batches of 500 messages through idem's tables
# (made from the migrations), WAL, synchronous=FULL, one commit for each
# step, the order of the variants alternated. Each line gives the rate and
# the shell's CPU time a message (user and system), which a loaded machine
# disturbs less than the rate.
#
#   bench/engine/sqlite/cut.sh [rounds] [inflight] [batches]
set -eu
rounds=${1:-5}
inflight=${2:-1}
batches=${3:-40}
n=$((batches * 500))
dir=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$dir/../../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
grep -hv '^--' "$root"/store/sqlitestore/migrations/00[123]_*.sql "$root"/queue/sqlqueue/migrations/sqlite/001_queue.sql > "$work/schema.sql"
cp "$work/schema.sql" "$work/schema4m.sql"
cat >> "$work/schema4m.sql" <<'SQL'
ALTER TABLE idem_records ADD COLUMN message_id INTEGER;
CREATE INDEX idem_records_message ON idem_records (message_id) WHERE message_id IS NOT NULL AND status = 'in_progress';
SQL

# gen VARIANT BATCHES
gen() {
	local v=$1 nb=$2 b lo hi
	echo "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
	for b in $(seq 0 $((nb - 1 + inflight))); do
		lo=$((b * 500 + 1)); hi=$((b * 500 + 500))
		if [ "$b" -lt "$nb" ]; then
			echo "BEGIN; WITH RECURSIVE g(i) AS (SELECT $lo UNION ALL SELECT i+1 FROM g WHERE i < $hi) INSERT INTO idem_queue_messages (id, queue, body, visible_at, published) SELECT i, 'q', x'00', 1, 1 FROM g; COMMIT;"
			echo "BEGIN;"
			case $v in
			5)
				echo "UPDATE idem_queue_messages SET visible_at = 2000000000000000 + id, receive_count = receive_count + 1, receipt = random(), first_received = coalesce(first_received, 5) WHERE id IN (SELECT id FROM idem_queue_messages WHERE queue = 'q' AND visible_at <= 10 ORDER BY visible_at, id LIMIT 500);"
				echo "WITH RECURSIVE g(i) AS (SELECT $lo UNION ALL SELECT i+1 FROM g WHERE i < $hi) INSERT INTO idem_records (key, status, policy, fence, attempt, lease_until, expires_at, created_at, updated_at, version) SELECT 'k' || i, 'in_progress', 'alo', 1, 1, 9, 99999, 1, 1, 1 FROM g;"
				;;
			4)
				echo "SELECT count(*) FROM (SELECT id FROM idem_queue_messages WHERE queue = 'q' AND visible_at <= 10 ORDER BY visible_at, id LIMIT 500);"
				echo "WITH RECURSIVE g(i) AS (SELECT $lo UNION ALL SELECT i+1 FROM g WHERE i < $hi) INSERT INTO idem_records (key, status, policy, fence, attempt, lease_until, expires_at, created_at, updated_at, version) SELECT 'k' || i, 'in_progress', 'alo', 1, 1, 9, 99999, 1, 1, 1 FROM g;"
				;;
			4m)
				echo "SELECT count(*), min(id), max(id) FROM (SELECT m.id FROM idem_queue_messages m WHERE m.queue = 'q' AND m.visible_at <= 10 AND m.id NOT IN (SELECT r.message_id FROM idem_records r INDEXED BY idem_records_message WHERE r.message_id IS NOT NULL AND r.status = 'in_progress' AND r.lease_until > 5) ORDER BY m.visible_at, m.id LIMIT 500);"
				echo "WITH RECURSIVE g(i) AS (SELECT $lo UNION ALL SELECT i+1 FROM g WHERE i < $hi) INSERT INTO idem_records (key, status, policy, fence, attempt, lease_until, expires_at, created_at, updated_at, version, message_id) SELECT 'k' || i, 'in_progress', 'alo', 1, 1, 9, 99999, 1, 1, 1, i FROM g;"
				;;
			esac
			echo "COMMIT;"
		fi
		# The batch received `inflight` batches ago is done: completion and ack.
		local d=$((b - inflight))
		if [ "$d" -ge 0 ]; then
			lo=$((d * 500 + 1)); hi=$((d * 500 + 500))
			echo "BEGIN; DELETE FROM idem_queue_messages WHERE id BETWEEN $lo AND $hi;"
			echo "WITH RECURSIVE g(i) AS (SELECT $lo UNION ALL SELECT i+1 FROM g WHERE i < $hi) UPDATE idem_records SET status = 'done', result = x'00', updated_at = 2, lease_until = NULL, version = version + 1 WHERE key IN (SELECT 'k' || i FROM g);"
			echo "COMMIT;"
		fi
	done
}

for v in 5 4 4m; do gen "$v" "$batches" > "$work/v$v.sql"; done
for r in $(seq 1 "$rounds"); do
	order="5 4 4m"
	if [ $((r % 2)) = 0 ]; then order="4m 4 5"; fi
	for v in $order; do
		rm -f "$work"/db.sqlite*
		schema=schema.sql
		if [ "$v" = 4m ]; then schema=schema4m.sql; fi
		sqlite3 "$work/db.sqlite" < "$work/$schema" > /dev/null
		load=$(cut -d' ' -f1 /proc/loadavg)
		s=$(date +%s.%N)
		cpu=$( { TIMEFORMAT='%U %S'; time sqlite3 "$work/db.sqlite" < "$work/v$v.sql" > "$work/out$v"; } 2>&1 )
		e=$(date +%s.%N)
		done=$(sqlite3 "$work/db.sqlite" "SELECT $n - count(*) FROM idem_queue_messages")
		printf 'round %d rows %-2s inflight %d load %-6s done %d msgs/s %.0f cpu-us/msg %.1f\n' "$r" "$v" "$inflight" "$load" "$done" \
			"$(echo "$n / ($e - $s)" | bc -l)" "$(echo "($(echo "$cpu" | tr ' ' '+')) * 1000000 / $n" | bc -l)"
	done
done
if [ -n "${CUT_CHECK:-}" ]; then cat "$work/out4m"; fi
