// Command idem inspects and repairs the records of an idem store, explains
// what happened to a key, serves the ledger over HTTP (idem serve), and runs
// the receipts demo.
//
// Usage:
//
//	idem [--store URL] COMMAND [flags] [arguments]
//
// The store is named by --store (before or after the command), else by the
// IDEM_STORE environment variable, else sqlite:idem.db:
//
//	sqlite:PATH, sqlite://PATH   the SQLite database file PATH
//	postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=...&idem_schema=S&idem_table=T
//	postgresql://...             the PostgreSQL table S.T (default: idem_records
//	                             in the first schema of the search_path); other
//	                             parameters are pgx's
//	redis://USER:PASSWORD@HOST:PORT/DB?idem_prefix=P
//	rediss://...                 the keys under prefix P (default idem:) in a
//	                             Redis database, over TLS for rediss:; other
//	                             parameters are go-redis's
//	dynamodb://TABLE?region=R&endpoint=URL
//	                             the DynamoDB table TABLE; credentials from the
//	                             AWS SDK's chain; endpoint for an emulator such
//	                             as dynalite
//	mem:                         an empty in-memory store, for trying things
//
// Commands that read or repair records (all but serve, demo and version) never create a store that does not
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
//	serve                the ledger over HTTP for workers in any language:
//	                     POST /v1/claim, /v1/complete, /v1/release, /v1/fail,
//	                     /v1/abandon, /v1/extend; GET /v1/records/KEY,
//	                     /v1/records/KEY/story (explain --json), /v1/records
//	                     (ls's filters, cursor pages),
//	                     /healthz, /readyz, /metrics (Prometheus; off with
//	                     --metrics=false), and the operations console's web
//	                     pages under /console/ (off with --console=false;
//	                     docs/console.md). Claims are decided as the Go Ledger decides
//	                     them (store.ClaimResult.Answer). --listen ADDR (default
//	                     127.0.0.1:7070; loopback only without --token-file),
//	                     --token-file PATH (Authorization: Bearer), --max-body
//	                     BYTES (default 1 MiB), --hash-keys. It opens the store
//	                     as a worker does (creating it if missing). Stops on
//	                     SIGINT/SIGTERM with exit 0 (a second signal cuts
//	                     calls under way; handlers still in the store are
//	                     waited for, 15s at most, before it is closed).
//	demo                 the receipts worker with redeliveries, two consumers
//	                     and a crash between send and record, on
//	                     ./idem-demo.db, which it keeps (each run deletes the
//	                     previous one first), or on --store (creating a
//	                     PostgreSQL table if missing); then explain of the
//	                     key sent twice, and the ls --stuck, explain and
//	                     resolve commands for the key it leaves
//	                     indeterminate.
//	chaos                each policy's guarantee on a real pipeline: a
//	                     producer publishing every key 1-5 times, worker
//	                     processes (this binary again) running a
//	                     queue.Consumer, seeded kills before the effect,
//	                     between effect and completion and before the ack,
//	                     freezes past the lease, a visibility shorter than
//	                     the handler, store and broker connection faults;
//	                     on the embedded default (a temporary SQLite file)
//	                     or --store postgres://, redis:// or dynamodb://,
//	                     with --queue postgres://, nats://, amqp:// or
//	                     sqs:// as the broker; a table per policy and
//	                     fault kind, --json FILE, --report DIR (PNG, HTML);
//	                     exit 1 when a guarantee broke.
//	vet [PACKAGES]       static checks of Go packages (default ./...) for
//	                     keys that cannot recognise a repeat (nondetkey,
//	                     deliveryid, bodyhash) and handlers that swallow
//	                     failures (swallowed, partialbatch); prints
//	                     file:line:col: message [check] and exits 1 on
//	                     findings; --json, --tests=false, --CHECK=false;
//	                     //idem:allow CHECK reason silences a finding. Run
//	                     by go vet -vettool=$(command -v idem) too. Never
//	                     opens the store. See docs/vet.md.
//	version              the module version and the VCS revision this binary
//	                     was built from: "idem v0.3.1 (go1.26.0)", or
//	                     "idem (devel) (go1.26.0, rev abc1234, modified)"
//	                     from a checkout; --json. Never opens the store.
//	completion bash|zsh  a shell completion script: commands, queue's
//	                     subcommands and each command's flags, made from
//	                     this binary's commands; source <(idem completion
//	                     bash). Never opens the store.
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
// Backends list names each backend built in, its schemes and its URL forms;
// the help, the --store flag, the list above and docs/cli.md are made from
// it (a test keeps the last two current), so a new backend is one more
// entry there.
//
// # Why the standard library's flag package
//
// The commands and their flags are parsed with package flag and the
// command table in commands.go, not with a framework such as spf13/cobra,
// alecthomas/kong or urfave/cli. What a framework would add for a user is
// mostly shell completion, and that is a static script made from the same
// table (idem completion, tested by running it in bash and zsh). What it
// would cost: one more module (kong) to three (cobra brings spf13/pflag,
// and mousetrap on Windows) in a binary that users install with go
// install, and a change of behaviour that scripts rely on: pflag, cobra's
// parser, reads -json as the short flags -j -s -o -n (an error here),
// where flag takes one dash or two alike; flags after the KEY, --store
// before or after the command, the exit codes (2 for usage, 3 not found,
// 4 lease live) and the help made from storeurl's backends (which a test
// keeps in step with this doc and docs/cli.md) would all be rebuilt on
// its terms, with the command tests' expected outputs. Revisit if the
// commands grow subcommands of subcommands or need completion of keys.
//
// # idem serve
//
// The HTTP API answers JSON; every error is application/problem+json (RFC
// 9457) whose "type" is
// "https://github.com/idemkit/idem/blob/main/docs/problems.md#serve-"
// followed by the kind, the section of docs/problems.md that documents
// it. Claim outcomes (busy, indeterminate, failed, mismatch) and
// lease-lost carry "outcome" and the record's numbers as extension
// members; other problems (bad input, auth, store errors) carry no
// "outcome":
//
//	status  kind / outcome        when
//	200     acquired, takeover    claim: run the operation (fence, attempt, attempt_id, lease_until)
//	200     done                  claim: completed with the same (or no) fingerprint; result in base64 ("" if empty)
//	409     busy                  claim: another attempt's lease runs; Retry-After, retry_after (s)
//	409     indeterminate         claim: an at_most_once attempt lapsed; resolve it (idem resolve)
//	409     failed                claim: failed permanently; reason. Final: no Retry-After
//	422     mismatch              claim: the key was used with another fingerprint
//	200     completed, released,  complete, release, fail, abandon, extend of the attempt
//	        failed, abandoned,    the fence and attempt_id name (a retried complete,
//	        extended              release or fail already recorded answers 200 again,
//	                              "repeated": true)
//	409     lease-lost            the attempt no longer holds the key; nothing recorded by
//	                              this call; record_status and record_fence say what
//	                              the key holds now (absent when it has no record)
//	400     invalid-body, invalid-key, invalid-fence, invalid-attempt, invalid-duration,
//	        invalid-policy, invalid-reason, invalid-query (GET /v1/records)
//	401     unauthorized          --token-file given and the bearer token is missing or wrong
//	403     cross-origin          an Origin header, or Sec-Fetch-Site not none/same-origin
//	403     host-not-allowed      no --token-file and a Host that is not a loopback name
//	415     unsupported-media-type  a POST body not sent as application/json
//	404     not-found             GET /v1/records/KEY of a key without a record; an unknown path
//	405     method-not-allowed
//	413     body-too-large        over --max-body
//	500     record-corrupt        the key's record cannot be decoded (idem delete)
//	503     store-unavailable     the store did not answer: nothing is known; Retry-After
//
// "failed" is 409, not 422: the request is well formed and was not reused;
// the key's state conflicts with running it, for good. Clients dispatch on
// "outcome", and a 409 without Retry-After is final.
//
// A claim whose client leaves before the answer is undone, and so is a
// claim the store took but whose answer was lost (503: the retry finds
// the key free). One answered but never read (the connection broke after
// the answer) holds the key as a crashed worker would: busy until its
// lease lapses, then a takeover (at_least_once) or indeterminate
// (at_most_once). Keep claim leases short and extend them.
//
// A claim's "attempt_id" (opaque, made by the server for the claim) and
// fence name the attempt for good; complete, release, fail, abandon and
// extend must send both (400 invalid-attempt without attempt_id). The
// store writes only while that attempt holds the key, in the same
// conditional write: a late writer of an attempt taken over, resolved or
// ended, or of a record deleted since (fences never repeat for a key), is
// 409 lease-lost. A retry of complete, release or fail whose first try was
// recorded is recognised by the attempt's journal entry and answered
// "repeated": true. An attempt is abandoned once: of two abandons, one is
// 200 and the other 409 lease-lost.
//
// Request bodies are one JSON object in valid UTF-8 without an unpaired
// UTF-16 surrogate escape (a lone \uD800-\uDFFF decodes as U+FFFD, so two
// keys would be one), each field named exactly (case-sensitive) and once,
// sent as Content-Type:
// application/json. A web page cannot drive the server: requests with an
// Origin header or a cross-site Sec-Fetch-Site are refused, and without
// --token-file the Host must be localhost, 127.0.0.0/8 or [::1] (DNS
// rebinding). The Authorization scheme is case-insensitive. GET /healthz
// and GET /readyz read a key that is never claimed: 200 when the store
// answers a read within 5s, else 503. GET /metrics is the Prometheus
// exposition of the claims served, counted by package otelidem's
// instruments (idem_operations_total by outcome, idem_takeovers_total,
// idem_busy_total, idem_indeterminate_total, ...; docs/observability.md)
// and of the Go runtime and process; --metrics=false turns it off (404).
// With --token-file, /healthz, /readyz and /metrics need the token too.
//
// GET /console/ is the operations console (docs/console.md): web pages of
// the store's records, a key's story and its journal, and the sqlqueue
// queues of its database, with resolve, release, delete and redrive, each
// a POST behind a confirmation, with a CSRF token (an HMAC under a
// per-process secret) and the CLI's checks. Its pages accept their own
// origin only (Origin, Sec-Fetch-Site), need the token with --token-file,
// and under --hash-keys hold no raw key. --console=false turns it off.
//
// The fingerprint is the request itself as a string; the server stores its
// sha256 as idem.Fingerprint does, so Go and HTTP workers of one operation
// agree. Durations are Go durations, or days ("7d"): positive, at most
// 3650d. A claim's lease, like extend's, defaults to 30s and is at least
// 1s. A retention defaults to 7d and must be at least 1h and, for a claim,
// at least the lease plus 1h, so an attempt's lease ends at least 1h
// before its record may be swept. extend keeps the
// same rule, by the store's clock: a lease that would end less than 1h
// before the record's retention is 400 invalid-duration (the stores would
// push the record's expiry out to the lease's end, so after a crash an
// at_most_once key would be claimed afresh instead of answered
// indeterminate); claim long work with a retention longer than the work
// plus 1h. complete
// and fail do not remember the claim's retention: without "retention"
// they keep the record 7d (give them the claim's). The
// owner defaults to "http:" and the client's IP. X-Request-Id (printable
// ASCII, at most 128 bytes) is echoed, or made, and is the claim's
// correlation id in the journal and in the log line every call writes.
package main
