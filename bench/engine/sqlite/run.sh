#!/bin/bash
# The engine's bound on idem's row writes on SQLite, from the sqlite3
# shell (C SQLite; idem and River run modernc's translation of it, which
# is slower): 20,000 messages in batches of 500 through idem's tables
# (schema.sql, made from the migrations), WAL, synchronous=FULL, one
# commit for each step of a batch: rows 5 is idem's pattern (publish
# insert, receive update, claim insert, completion update, ack delete),
# rows 4 the same without the receive update, rows 3 the queue's own
# writes with no ledger row (publish insert, receive update, ack delete).
#
#   bench/engine/sqlite/run.sh [rounds]
set -eu
rounds=${1:-5}
dir=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$dir/../../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
grep -hv '^--' "$root"/store/sqlitestore/migrations/00[123]_*.sql "$root"/queue/sqlqueue/migrations/sqlite/001_queue.sql > "$work/schema.sql"
"$dir/gen.sh" 5 40 > "$work/v5.sql"
"$dir/gen.sh" 4 40 > "$work/v4.sql"
"$dir/gen.sh" 3 40 > "$work/v3.sql"
for r in $(seq 1 "$rounds"); do
	order="5 4 3"
	if [ $((r % 2)) = 0 ]; then order="3 4 5"; fi
	for v in $order; do
		rm -f "$work"/db.sqlite*
		sqlite3 "$work/db.sqlite" < "$work/schema.sql" > /dev/null
		load=$(cut -d' ' -f1 /proc/loadavg)
		s=$(date +%s.%N)
		sqlite3 "$work/db.sqlite" < "$work/v$v.sql" > /dev/null
		e=$(date +%s.%N)
		done=$(sqlite3 "$work/db.sqlite" "SELECT 20000 - count(*) FROM idem_queue_messages")
		printf 'round %d rows %d load %-6s done %d msgs/s %.0f\n' "$r" "$v" "$load" "$done" "$(echo "20000 / ($e - $s)" | bc -l)"
	done
done
