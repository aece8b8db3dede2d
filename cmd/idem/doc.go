// Command idem inspects and repairs the records of an idem store, explains
// what happened to a key, and runs the receipts demo.
//
// Usage:
//
//	idem [--store URL] COMMAND [flags] [arguments]
//
// The store is named by --store (before or after the command), else by the
// IDEM_STORE environment variable, else sqlite:idem.db:
//
//	sqlite:PATH, sqlite://PATH   the SQLite database file PATH (store/sqlitestore)
//	postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=disable&idem_schema=S&idem_table=T
//	postgresql://...             the PostgreSQL table S.T (store/pgstore; default
//	                             idem_records in the connection's search_path);
//	                             other parameters are pgx's (sslmode, pool_max_conns, ...)
//	dynamodb://TABLE?region=R&endpoint=URL
//	                             the DynamoDB table TABLE (store/dynamostore); credentials
//	                             from the AWS SDK's chain; endpoint for an emulator
//	redis://USER:PASSWORD@HOST:PORT/DB?idem_prefix=P, rediss://...
//	                             keys under prefix P in a Redis database (store/redisstore)
//	mem:                         an empty in-memory store (store/memstore), for trying things
//
// Commands that read or repair records never create a store that does not
// exist, nor migrate one: a missing SQLite file, a SQLite file without
// idem's tables or at an older schema version, or a missing PostgreSQL
// table, is an error (exit 1). Every command has --help.
//
//	inspect KEY          the record: status and derived state (lapsed, or
//	                     indeterminate under at_most_once), policy, fence,
//	                     attempt, owner, fingerprint, result preview and
//	                     size, reason, lease and retention times, journal.
//	                     --json prints it as JSON (result in base64).
//	ls                   records, one line each; --status S, --stuck (lapsed
//	                     and indeterminate keys), --limit N, --after KEY, --json
//	                     (one object per line). A corrupt record is listed as
//	                     CORRUPT and ls goes on, then exits 1.
//	release KEY          make a key claimable again; refuses a live lease
//	                     unless --force; --fence N acts only on the attempt
//	                     inspected.
//	resolve KEY --done [--result S | --result-file F] [--retention D]
//	resolve KEY --not-done
//	                     decide a key whose attempt never finished; same
//	                     refusals and --fence; --reason and --by (who
//	                     decided) are recorded in the journal.
//	delete KEY           remove a key's record: a corrupt one (ls lists it as
//	                     CORRUPT), or a key to forget; refuses a live lease,
//	                     a completed key and a corrupt record unless --force.
//	sweep                delete expired records in batches (--batch N) until
//	                     none are left; Ctrl-C stops between batches.
//	queue stats          per sqlqueue queue in the store's database: ready,
//	                     in flight, delayed, dead-lettered, oldest age;
//	                     --queue Q, --schema S (PostgreSQL), --json.
//	queue redrive        dead letters back into their queue, receive count
//	                     reset; --queue Q, --limit N, --schema S, --json.
//	explain KEY          the key's story from its journal, and the verdict of
//	                     the "two emails, one booking" decision tree; --json.
//	demo                 the receipts worker with redeliveries, two consumers
//	                     and a crash between send and record, on a temporary
//	                     SQLite store (or on --store, creating a PostgreSQL
//	                     table if missing); then explain, ls --stuck and
//	                     resolve.
//	help [COMMAND]       help.
//
// Exit codes:
//
//	0    ok
//	1    operation error: the store failed, or the command refused
//	2    usage error
//	3    key not found
//	4    refused because the key's lease is live (use --force)
//	130  interrupted (Ctrl-C)
//
// The store URL is opened in one place, cmd/idem/internal/storeurl, whose
// constructor names the scheme of each backend built in; a new backend
// (redis://) is one more scheme there.
package main
