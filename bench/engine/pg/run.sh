#!/bin/bash
# The engine's bound on a message's row writes, from pgbench: idem's row
# pattern (idem5.sql: publish insert, receive update, claim insert,
# completion update and ack delete, 100 messages a transaction), the same
# with the receive taking row locks instead of the update (idem4.sql),
# with no lock at all (idem4n.sql: no receiver could work this way, it is
# the floor), the queue's own three writes with no ledger row at all
# (idem3q.sql: what a claim kept in the message's row would cost), and
# River's (river3.sql: insert, update to running, update
# to completed). The tables are the ones bench/cmd/compare makes, with
# their indexes and triggers: keep them with
#
#   compare -only e2e-pg -rounds 1 -pg-n 1000 -dbos=false -e2e-pg-db DB -keep
#
# then run this with DB's URL. It truncates bench_idem.idem_queue_messages,
# bench_idem.e2e_1 (the ledger's table) and bench_river.river_job before
# each measurement.
#
#   bench/engine/pg/run.sh 'postgres://postgres@127.0.0.1:5432/DB?sslmode=disable' [rounds] [seconds] [clients]
set -eu
url=$1 rounds=${2:-5} secs=${3:-10} clients=${4:-4}
dir=$(cd "$(dirname "$0")" && pwd)
psql -q "$url" -f "$dir/setup.sql"
for r in $(seq 1 "$rounds"); do
	if [ $((r % 2)) = 1 ]; then order="idem5 idem4 idem4n idem3q river3"; else order="river3 idem3q idem4n idem4 idem5"; fi
	for s in $order; do
		psql -q "$url" -c 'TRUNCATE bench_idem.idem_queue_messages, bench_idem.e2e_1, bench_river.river_job' \
			-c 'VACUUM ANALYZE bench_idem.idem_queue_messages, bench_idem.e2e_1, bench_river.river_job'
		load=$(cut -d' ' -f1 /proc/loadavg)
		tps=$(pgbench -n -M prepared -c "$clients" -j 2 -T "$secs" -f "$dir/$s.sql" "$url" 2>&1 | awk '/^tps/ {print $3}')
		printf 'round %d %-7s load %-6s msgs/s %.0f\n' "$r" "$s" "$load" "$(echo "$tps * 100" | bc)"
	done
done
