#!/bin/bash
# The engine's bound on idem's row writes on SQLite, from the sqlite3
# shell (C SQLite; idem and River run modernc's translation of it, which
# is slower): 20,000 messages in batches of 500 through idem's tables
# (schema.sql, made from the migrations), WAL, synchronous=FULL, one
# commit for each step of a batch: rows 5 is idem's pattern (publish
# insert, receive update, claim insert, completion update, ack delete),
# rows 4 the same without the receive update.
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
for r in $(seq 1 "$rounds"); do
	for v in 5 4; do
		rm -f "$work"/db.sqlite*
		sqlite3 "$work/db.sqlite" < "$work/schema.sql" > /dev/null
		load=$(cut -d' ' -f1 /proc/loadavg)
		s=$(date +%s.%N)
		sqlite3 "$work/db.sqlite" < "$work/v$v.sql" > /dev/null
		e=$(date +%s.%N)
		done=$(sqlite3 "$work/db.sqlite" "SELECT count(*) FROM idem_records WHERE status = 'done'")
		printf 'round %d rows %d load %-6s done %d msgs/s %.0f\n' "$r" "$v" "$load" "$done" "$(echo "20000 / ($e - $s)" | bc -l)"
	done
done
