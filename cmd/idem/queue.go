package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/idemkit/idem/cmd/idem/internal/explain"
	"github.com/idemkit/idem/cmd/idem/internal/storeurl"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/pgstore"
	"github.com/idemkit/idem/store/sqlitestore"
)

var queueCmd = &command{
	name:     "queue",
	synopsis: "stats [--queue Q] [--json] | redrive [--queue Q] [--limit N | --id ID] [--json]",
	summary:  "the sqlqueue queues in the store's database: stats, redrive dead letters",
	help: `
Queue works on the queues queue/sqlqueue keeps in the store's database (the
same SQLite file, or the same PostgreSQL database, as the ledger):

  idem queue stats     per queue: messages ready, in flight (received, not
                       settled, visibility running), delayed (by a publish
                       delay or a Retry), dead-lettered, and the age of the
                       oldest message. --queue Q shows one queue.
  idem queue redrive   moves dead letters back into their queue, visible at
                       once, receive count reset to 0 (id, body, attributes
                       and group kept). --queue Q redrives one queue (else
                       every queue that has dead letters), --limit N at most
                       N messages per queue (0: all).

On PostgreSQL the queue tables are looked up in --schema (default: the
store URL's idem_schema parameter, else the search_path). The command never
creates the queue tables: a database without them is an error.

Run 'idem queue stats --help' or 'idem queue redrive --help' for flags.`,
	exits: queueExits,
	run:   runQueue,
}

const queueExits = `  0    ok
  1    the database failed, or has no queue tables
  2    usage error
  130  interrupted (Ctrl-C) between queues (redrive)`

var queueStatsCmd = &command{
	name:     "queue stats",
	synopsis: "[--queue Q] [--schema S] [--json]",
	help: `
Stats prints, for every queue that has messages or dead letters (or for
--queue Q), the messages ready to be received, in flight (received, not
settled, visibility running), delayed (by a publish delay or a Retry),
dead-lettered, and the age of the oldest message. Ready includes messages
of a FIFO group waiting behind an earlier one. With --json it prints one
JSON object per queue per line (oldest_age_ns in nanoseconds).`,
	exits: queueExits,
}

var queueRedriveCmd = &command{
	name:     "queue redrive",
	synopsis: "[--queue Q] [--limit N | --id ID] [--schema S] [--json]",
	help: `
Redrive moves dead letters back into their queue, oldest first, visible at
once, with their receive count reset to 0; their id, body, attributes,
group and publish time are kept. Without --queue it redrives every queue
that has dead letters. --limit N moves at most N messages per queue (0:
all). --id ID (with --queue) moves that one dead letter, whatever its
age, and is refused when the queue has no dead letter ID. It works in
transactions of up to 1,000 messages: if it fails part way, what was moved
stays moved, and the summary says how far it got.
With --json it prints one JSON object per queue per line.`,
	exits: queueExits,
}

func runQueue(ctx context.Context, a *app, args []string) error {
	if len(args) == 0 {
		return usagef("missing subcommand: stats or redrive")
	}
	switch args[0] {
	case "stats":
		a.cmd = queueStatsCmd
		return runQueueStats(ctx, a, args[1:])
	case "redrive":
		a.cmd = queueRedriveCmd
		return runQueueRedrive(ctx, a, args[1:])
	case "-h", "-help", "--help":
		fs := a.cmd.flagSet(a)
		a.cmd.printHelp(a.stdout, fs)
		return errHelpShown
	}
	return usagef("unknown subcommand %q: want stats or redrive", args[0])
}

// queueAdmin is what the queue commands need of a sqlqueue handle.
type queueAdmin struct {
	stats   func(ctx context.Context) ([]sqlqueue.Stats, error)
	redrive func(ctx context.Context, queue string, limit int) (int, error)
	// redriveMessage moves the dead letter id of queue; false: none.
	redriveMessage func(ctx context.Context, queue, id string) (bool, error)
	deadLetters    func(ctx context.Context, queue string, limit int) ([]sqlqueue.DeadLetter, error)
	close          func() error
}

// redriver is a sqlqueue queue, as the queue commands and the console use
// it.
type redriver interface {
	Redrive(ctx context.Context, limit int) (int, error)
	RedriveMessage(ctx context.Context, id string) (bool, error)
	DeadLetters(ctx context.Context, limit int) ([]sqlqueue.DeadLetter, error)
}

// queueHandle is a sqlqueue handle (*sqlqueue.SQLite or *sqlqueue.Postgres)
// whose queues are Q.
type queueHandle[Q redriver] interface {
	Stats(ctx context.Context) ([]sqlqueue.Stats, error)
	Queue(name string, opts ...sqlqueue.QueueOption) (Q, error)
	Close() error
}

// adminOf is h as a queueAdmin.
func adminOf[Q redriver](h queueHandle[Q]) *queueAdmin {
	return &queueAdmin{
		stats: h.Stats,
		redrive: func(ctx context.Context, name string, limit int) (int, error) {
			q, err := h.Queue(name)
			if err != nil {
				return 0, err
			}
			return q.Redrive(ctx, limit)
		},
		redriveMessage: func(ctx context.Context, name, id string) (bool, error) {
			q, err := h.Queue(name)
			if err != nil {
				return false, err
			}
			return q.RedriveMessage(ctx, id)
		},
		deadLetters: func(ctx context.Context, name string, limit int) ([]sqlqueue.DeadLetter, error) {
			q, err := h.Queue(name)
			if err != nil {
				return nil, err
			}
			return q.DeadLetters(ctx, limit)
		},
		close: h.Close,
	}
}

func (a *app) queueFlags(fs *flag.FlagSet) (name, schema *string) {
	name = fs.String("queue", "", "only the queue `Q`")
	schema = fs.String("schema", "", "PostgreSQL: the `schema` of the queue tables (default: the store URL's idem_schema, else the search_path)")
	return name, schema
}

// openQueues opens the sqlqueue tables of the store's database, without
// creating them.
func (a *app) openQueues(ctx context.Context, schema string) (*queueAdmin, error) {
	s, err := a.open(ctx)
	if err != nil {
		return nil, err
	}
	h, err := queuesOf(ctx, s, a.storeURL, schema)
	if errors.Is(err, errNoQueues) {
		return nil, refused("the store %q keeps no queues: sqlqueue lives in sqlite: and postgres:// databases", storeurl.Redact(a.storeURL))
	}
	return h, err
}

// errNoQueues: the store is not one whose database can hold sqlqueue's
// tables.
var errNoQueues = errors.New("the store keeps no queues")

// queuesOf opens the sqlqueue tables of s's database, without creating
// them: errNoQueues for a store other than SQLite or PostgreSQL, an error
// wrapping sqlqueue.ErrNoTables for a database without them. On
// PostgreSQL the tables are in schema, else the store URL's idem_schema,
// else the search_path.
func queuesOf(ctx context.Context, s any, storeURL, schema string) (*queueAdmin, error) {
	switch st := s.(type) {
	case *sqlitestore.Store:
		h, err := sqlqueue.NewSQLite(ctx, st.DB(), sqlqueue.WithMigrate(false), sqlqueue.WithGroupCommit(st))
		if err != nil {
			return nil, queueOpenErr(err)
		}
		return adminOf[*sqlqueue.SQLiteQueue](h), nil
	case *pgstore.Store:
		if schema == "" {
			schema = urlSchema(storeURL)
		}
		h, err := sqlqueue.NewPostgres(ctx, st.Pool(), sqlqueue.WithMigrate(false), sqlqueue.WithSchema(schema))
		if err != nil {
			return nil, queueOpenErr(err)
		}
		return adminOf[*sqlqueue.PostgresQueue](h), nil
	}
	return nil, errNoQueues
}

func queueOpenErr(err error) error {
	if errors.Is(err, sqlqueue.ErrNoTables) {
		return fmt.Errorf("no queue tables in the store's database (the workers' sqlqueue.NewSQLite or NewPostgres creates them; name their store with --store or IDEM_STORE): %w", err)
	}
	return err
}

// urlSchema returns the idem_schema parameter of a postgres URL.
func urlSchema(raw string) string {
	_, q, ok := strings.Cut(raw, "?")
	if !ok {
		return ""
	}
	v, err := url.ParseQuery(q)
	if err != nil {
		return ""
	}
	return v.Get(pgstore.ParamSchema)
}

type queueStatsJSON struct {
	sqlqueue.Stats
	OldestAge string `json:"oldest_age"`
}

func runQueueStats(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	name, schema := a.queueFlags(fs)
	asJSON := fs.Bool("json", false, "print one JSON object per queue per line")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	h, err := a.openQueues(ctx, *schema)
	if err != nil {
		return err
	}
	defer h.close()
	sts, err := h.stats(ctx)
	if err != nil {
		return err
	}
	if *name != "" {
		found := sqlqueue.Stats{Queue: *name}
		for _, st := range sts {
			if st.Queue == *name {
				found = st
			}
		}
		sts = []sqlqueue.Stats{found}
	}
	if *asJSON {
		for _, st := range sts {
			if err := writeJSON(a.stdout, queueStatsJSON{st, explain.Dur(st.OldestAge)}); err != nil {
				return err
			}
		}
		return nil
	}
	if len(sts) == 0 {
		fmt.Fprintln(a.stdout, "no queue has messages or dead letters")
		return nil
	}
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "QUEUE\tREADY\tIN FLIGHT\tDELAYED\tDEAD\tOLDEST")
	for _, st := range sts {
		oldest := "-"
		if st.OldestAge > 0 {
			oldest = explain.Dur(st.OldestAge.Round(time.Millisecond))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", st.Queue, st.Ready, st.InFlight, st.Delayed, st.DeadLettered, oldest)
	}
	return tw.Flush()
}

type redriveJSON struct {
	Queue     string `json:"queue"`
	Redriven  int    `json:"redriven"`
	Remaining int64  `json:"dead_lettered_before"`
	Error     string `json:"error,omitempty"`
}

func runQueueRedrive(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	name, schema := a.queueFlags(fs)
	limit := fs.Int("limit", 0, "move at most `N` messages per queue; 0 moves all")
	id := fs.String("id", "", "move only the dead letter with message id `ID` (needs --queue)")
	asJSON := fs.Bool("json", false, "print one JSON object per queue per line")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if *limit < 0 {
		return usagef("--limit must be 0 (all) or more, got %d", *limit)
	}
	if *id != "" && (*name == "" || *limit != 0) {
		return usagef("--id needs --queue, and no --limit")
	}
	h, err := a.openQueues(ctx, *schema)
	if err != nil {
		return err
	}
	defer h.close()
	if *id != "" {
		moved, err := h.redriveMessage(context.WithoutCancel(ctx), *name, *id)
		if errors.Is(err, sqlqueue.ErrBadID) {
			return usagef("--id %q is not a message id", *id)
		}
		if err != nil {
			return err
		}
		if !moved {
			return refused("queue %s has no dead letter %s", *name, *id)
		}
		if *asJSON {
			return writeJSON(a.stdout, redriveJSON{Queue: *name, Redriven: 1})
		}
		fmt.Fprintf(a.stdout, "queue %s: dead letter %s redriven\n", *name, *id)
		return nil
	}
	sts, err := h.stats(ctx)
	if err != nil {
		return err
	}
	var todo []sqlqueue.Stats
	for _, st := range sts {
		if st.DeadLettered > 0 && (*name == "" || st.Queue == *name) {
			todo = append(todo, st)
		}
	}
	if len(todo) == 0 {
		if *asJSON {
			if *name != "" {
				return writeJSON(a.stdout, redriveJSON{Queue: *name})
			}
			return nil
		}
		if *name != "" {
			fmt.Fprintf(a.stdout, "queue %s has no dead letters\n", *name)
		} else {
			fmt.Fprintln(a.stdout, "no queue has dead letters")
		}
		return nil
	}
	// A redrive runs to its end even when Ctrl-C arrives during it.
	bctx := context.WithoutCancel(ctx)
	for _, st := range todo {
		if ctx.Err() != nil {
			return &codeError{exitInterrupted, fmt.Errorf("interrupted before queue %s", st.Queue)}
		}
		n, err := h.redrive(bctx, st.Queue, *limit)
		out := redriveJSON{Queue: st.Queue, Redriven: n, Remaining: st.DeadLettered}
		if err != nil {
			out.Error = err.Error()
		}
		if *asJSON {
			if werr := writeJSON(a.stdout, out); werr != nil {
				return werr
			}
		} else {
			fmt.Fprintf(a.stdout, "queue %s: %d of %d dead letters redriven\n", st.Queue, n, st.DeadLettered)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
