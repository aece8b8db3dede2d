package sqlitestore

import (
	"log/slog"
	"time"
)

// Defaults for the options of [Open].
const (
	// DefaultMaxBatch is how many operations the writer commits together at
	// most unless [WithMaxBatch] says otherwise: enough for everything a
	// queue.Consumer of 512 handlers has queued at once (each handler's
	// claim, completion and ack), so that they share one commit; 256 made
	// such a Consumer on sqlqueue about 5% slower end to end, at about 5%
	// more CPU a message (docs/benchmarks.md, session 9).
	DefaultMaxBatch = 1024
	// DefaultBusyTimeout is how long a write waits for another connection
	// or process to release the database's write lock unless
	// [WithBusyTimeout] says otherwise.
	DefaultBusyTimeout = 10 * time.Second
)

// Synchronous is SQLite's synchronous setting for the write connections: how
// often SQLite waits for the disk. See [WithSynchronous].
type Synchronous string

const (
	// SyncFull (the default) syncs the write-ahead log on every commit: an
	// operation acknowledged to its caller survives a power loss or an
	// operating system crash.
	SyncFull Synchronous = "FULL"
	// SyncNormal syncs only at checkpoints. A process crash loses nothing,
	// but a power loss or an operating system crash can lose the last
	// commits, each of which may hold many acknowledged claims and
	// completions: a completed key may come back as absent (its effect
	// then runs again), a claimed key as claimable.
	SyncNormal Synchronous = "NORMAL"
)

// Option configures a [Store]; see [Open].
type Option func(*config)

type config struct {
	clock       func() time.Time
	sync        Synchronous
	maxBatch    int
	busyTimeout time.Duration
	logger      *slog.Logger
	readConns   int
	implicit    bool // WithImplicitJournal
	migrate     bool // WithMigrate
}

func defaultConfig() config {
	return config{
		clock:       time.Now,
		sync:        SyncFull,
		maxBatch:    DefaultMaxBatch,
		busyTimeout: DefaultBusyTimeout,
		logger:      slog.New(slog.DiscardHandler),
		readConns:   4,
		implicit:    true,
		migrate:     true,
	}
}

// WithClock sets the store's clock, which decides every lease, retention and
// timestamp. The default is [time.Now]. Tests pass a fake clock so that
// leases and retention lapse without sleeping. Processes that share a
// database file must agree on the time: they all use their own clock.
func WithClock(now func() time.Time) Option {
	return func(c *config) {
		if now != nil {
			c.clock = now
		}
	}
}

// WithSynchronous sets how the write connections sync to disk. The default,
// [SyncFull], makes every acknowledged claim and completion survive a power
// loss; [SyncNormal] is faster on slow disks and loses the last commits on a
// power loss (never on a process crash).
func WithSynchronous(mode Synchronous) Option {
	return func(c *config) { c.sync = mode }
}

// WithMaxBatch sets how many queued operations the writer runs in one
// transaction, and so under one sync, at most. The default is
// [DefaultMaxBatch] (1024); n < 1 means 1, which commits every operation on
// its own.
func WithMaxBatch(n int) Option {
	return func(c *config) { c.maxBatch = max(n, 1) }
}

// WithBusyTimeout sets how long a write waits for the database's write lock
// while another connection or process holds it, before it fails with
// SQLITE_BUSY. It is also the wait of a read that finds the database locked
// (which in WAL mode happens only around recovery). The default is
// [DefaultBusyTimeout] (10 s).
func WithBusyTimeout(d time.Duration) Option {
	return func(c *config) { c.busyTimeout = max(d, 0) }
}

// WithLogger sets where the store logs the few things it logs: migrations it
// applies and write transactions that fail. The default discards them.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithReadConns sets how many connections serve reads (Get, List) at once.
// The default is 4; n < 1 means 1.
func WithReadConns(n int) Option {
	return func(c *config) { c.readConns = max(n, 1) }
}

// WithImplicitJournal says whether a key's first attempt keeps its
// journal implicit (default true): the journal column stays empty while
// the journal is the one entry the row's own columns say, which is what
// nearly every key ever has, so the store writes and reads no JSON for it
// and the row is less than half the size. Every build from schema version
// 2 on reads both forms.
//
// Builds of this package from before schema version 2 (which added the
// column correlation) refuse to open the file once it is migrated, but a
// process of such a build that opened it before reads an implicit journal
// as a corrupt record. While such a process still runs on the file, open
// the new build with WithImplicitJournal(false): it then writes every
// journal out in full, which both builds read. Turning it off does not
// rewrite the rows that are already implicit, so set it before the first
// new process writes.
func WithImplicitJournal(on bool) Option {
	return func(c *config) { c.implicit = on }
}

// WithMigrate says whether [Open] prepares the database file (default
// true): it creates the file if it does not exist, switches it to WAL
// mode, and creates the tables or applies the migrations this version of
// the package knows that the file has not seen. With false Open changes
// nothing in the file, nor its journal mode: it refuses, with an error
// wrapping [ErrNotMigrated], a file that does not exist, that holds no
// idem store (no table idem_records, as in another program's database),
// or whose store is at an older schema version than this build's (a
// migration would make it unreadable to the older builds still using it).
// A schema newer than this build's is refused either way. Use it for
// tools that look at a store the workers own, such as the idem command's
// inspection and repair commands.
func WithMigrate(migrate bool) Option {
	return func(c *config) { c.migrate = migrate }
}
