package pgstore

// DefaultTable is the name of the record table unless [WithTable] says
// otherwise.
const DefaultTable = "idem_records"

// Option configures a [Store]; see [Open] and [New].
type Option func(*config)

type config struct {
	schema   string // "" for the connection's search_path
	table    string
	migrate  bool
	implicit bool // WithImplicitJournal
	// clockTable, when set, names a one-row table (off interval) whose
	// offset is added to the server's clock in every statement. Tests only:
	// it lets the conformance suite advance time without sleeping.
	clockTable string
}

func defaultConfig() config {
	return config{table: DefaultTable, migrate: true, implicit: true}
}

// WithSchema puts the record table in schema. By default the table is
// created and looked up in the first schema of the connection's
// search_path (usually public). With migrations on, the schema is created
// if it does not exist.
func WithSchema(schema string) Option {
	return func(c *config) { c.schema = schema }
}

// WithTable names the record table (default [DefaultTable]). Several
// stores can share a database and a schema under different table names;
// each table has its own migrations table, named after it with the suffix
// "_migrations".
func WithTable(table string) Option {
	return func(c *config) {
		if table != "" {
			c.table = table
		}
	}
}

// WithMigrate says whether [Open] and [New] bring the table up to date
// (default true): they create the schema, the table, its indexes and its
// migrations table, and apply the migrations this version of the package
// knows that the database has not seen, under a transaction-scoped
// advisory lock so that processes opening the store at the same time are
// safe. With false they do not touch the database at all: the pool
// connects on first use, and a call on a missing table fails with an
// error naming it (use this when migrations are run by a deployment step
// with [Store.Migrate], or with a user that may not create tables).
func WithMigrate(migrate bool) Option {
	return func(c *config) { c.migrate = migrate }
}

// WithImplicitJournal says whether a key's first attempt keeps its
// journal implicit (default true): the journal column stays NULL while the
// journal is the one entry the row's own columns say, which is what nearly
// every key ever has, so a claim builds and writes no jsonb (see the
// package doc). Every build from schema version 3 on reads both forms.
//
// Builds of this package from before schema version 3 (which added the
// column correlation) read an implicit journal as a corrupt record, and a
// claim of theirs over such a row loses the attempt's entry. While
// processes of such a build still use the table (a rolling upgrade), open
// the new build with WithImplicitJournal(false): it then writes every
// journal out in full, which both builds read. Turn it back on once no
// older process remains. Turning it off does not rewrite the rows that
// are already implicit (each is written out when next changed), so set it
// before the first new process writes.
func WithImplicitJournal(on bool) Option {
	return func(c *config) { c.implicit = on }
}

// withClockTable adds the interval in the one-row table name (a qualified,
// quoted identifier) to the server's clock in every statement. For tests.
func withClockTable(name string) Option {
	return func(c *config) { c.clockTable = name }
}
