package sqlqueue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtext"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/internal/reason"
	"github.com/idemkit/idem/store"
)

// Defaults for the options of a queue.
const (
	// DefaultVisibility is how long a received message stays invisible to
	// other receivers unless [WithVisibility] says otherwise. A
	// queue.Consumer without queue.WithHandlerTimeout gives its handler a
	// sixth of it (5 s), so the defaults agree and nothing warns.
	DefaultVisibility = 30 * time.Second
	// DefaultDedupWindow is how long a publish's dedup id is remembered
	// unless [WithDedupWindow] says otherwise: the ledger's default
	// retention, so that a publisher retrying for as long as the ledger
	// remembers its keys is deduplicated all along. (SQS fixes its window
	// at 5 minutes.)
	DefaultDedupWindow = idem.DefaultRetention
	// DefaultPollInterval is the longest a waiting Receive goes without
	// looking at the database, unless [WithPollInterval] says otherwise.
	DefaultPollInterval = time.Second
)

var (
	// ErrReceiptExpired is returned by a Delivery's Ack, Retry, Extend or
	// DeadLetter when the message is no longer this delivery's: its
	// visibility timeout lapsed and another receiver got it (or will), or
	// it was settled meanwhile. The call changed nothing.
	ErrReceiptExpired = errors.New("sqlqueue: the delivery's receipt expired (the message was handed back or out again, or settled)")
	// ErrBadName is returned for an empty queue name, one longer than 200
	// bytes, or one that is not UTF-8 or holds a NUL byte.
	ErrBadName = errors.New("sqlqueue: a queue name must be 1 to 200 bytes of UTF-8 without NUL")
	// ErrBadMessage is returned by Publish for a message the queue cannot
	// take (a negative delay or one over 100 years; a group id, dedup id or
	// attribute that is not UTF-8 or holds a NUL byte, which PostgreSQL
	// cannot store and JSON would change; a nil transaction for
	// PublishTx); nothing is published. A nil or empty body is fine, and a
	// body may hold any bytes.
	ErrBadMessage = queue.Refusal("sqlqueue: bad message")
	// ErrClosed is returned by calls on a closed [SQLite] or [Postgres],
	// and on a [SQLite] whose [WithGroupCommit] store is closed (it wraps
	// [idem.ErrClosed]).
	ErrClosed = fmt.Errorf("sqlqueue: %w", idem.ErrClosed)
	// ErrNoTables is wrapped by the error of a call on a database whose
	// queue tables do not exist, or are older than the build needs
	// (opened with WithMigrate(false) before the migrations ran).
	ErrNoTables = errors.New("sqlqueue: the queue tables do not exist")
	// ErrIsolation is wrapped by the error of [NewPostgres] on a pool
	// whose transactions default to an isolation level other than READ
	// COMMITTED.
	ErrIsolation = errors.New("sqlqueue: the queue's statements need READ COMMITTED")
	// ErrBadID is wrapped by the error of RedriveMessage when the id is
	// not one a queue hands out (a positive decimal number).
	ErrBadID = errors.New("sqlqueue: not a message id")
)

// Option configures a [SQLite] or [Postgres] handle: what all its queues
// share. See [QueueOption] for a queue's own settings.
type Option func(*config)

type config struct {
	clock   func() time.Time
	logger  *slog.Logger
	poll    time.Duration
	schema  string
	migrate bool
	queue   queueConfig // the default for every queue
	// writeLock, when set, is taken around each write transaction of the
	// SQLite writer (see WithWriteLock).
	writeLock func(ctx context.Context) (unlock func())
	// groupCommit, when set, runs the SQLite handle's writes (see
	// WithGroupCommit).
	groupCommit GroupCommitter
	// ledger, when set, is the ledger store in the handle's database
	// that its queues claim keys on (see WithLedger).
	ledger store.Store
}

func defaultConfig() config {
	return config{
		clock:   time.Now,
		logger:  slog.New(slog.DiscardHandler),
		poll:    DefaultPollInterval,
		migrate: true,
		queue:   queueConfig{visibility: DefaultVisibility, dedupWindow: DefaultDedupWindow},
	}
}

// WithClock sets the clock of a [SQLite] handle (default [time.Now]):
// visibility timeouts, delays and the dedup window run on it. Tests pass a
// fake clock to let them lapse without sleeping. Processes that share a
// file must agree on the time. [Postgres] ignores it: it uses the server's
// clock.
func WithClock(now func() time.Time) Option {
	return func(c *config) {
		if now != nil {
			c.clock = now
		}
	}
}

// WithLogger sets where the handle logs (default: nowhere): failures of
// its background work (the LISTEN connection, the group-commit writer).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithPollInterval sets the longest a Receive that found nothing waits
// before it looks again (default [DefaultPollInterval], 1 s). A publish
// through the same handle (SQLite) or any publish or settle that frees a
// message (PostgreSQL, by NOTIFY) wakes it at once; a delayed message or
// a lapsed visibility timeout is found when it falls due, if the handle
// knows when (PostgreSQL asks the database; SQLite backs off from 5 ms to
// the interval). d < 1 ms means 1 ms.
func WithPollInterval(d time.Duration) Option {
	return func(c *config) { c.poll = max(d, time.Millisecond) }
}

// WithSchema puts the queue tables of a [Postgres] handle in schema (by
// default: the first schema of the connection's search_path). With
// migrations on, the schema is created if it does not exist. [SQLite]
// ignores it.
func WithSchema(schema string) Option {
	return func(c *config) { c.schema = schema }
}

// WithMigrate says whether [NewSQLite] and [NewPostgres] create and update
// the queue tables (default true). With false they leave the database as
// it is, and calls on missing tables fail with an error wrapping
// [ErrNoTables].
func WithMigrate(migrate bool) Option {
	return func(c *config) { c.migrate = migrate }
}

// WithGroupCommit makes a [SQLite] handle write through gc instead of a
// writer of its own: every write (publish, receive, ack, retry, extend,
// dead-letter, redrive, sweep) is a unit of work of gc's write
// transactions. Pass the sqlitestore.Store whose DB() the handle is made
// on: the queue's writes then share the ledger's commits, and so their
// syncs of the write-ahead log, instead of taking turns at SQLite's write
// lock with transactions of their own (a Consumer's claim, completion and
// ack of a message can commit under one sync). It supersedes
// [WithWriteLock], which it makes pointless. With it the handle keeps no
// connection of its own; gc must outlive the handle (close the handle
// first). The handle's calls must not be made from inside one of gc's
// units of work (inside idem.DoTx's function on the store, say: use
// PublishTx with its transaction there), as they would wait for the writer
// that runs them. [Postgres] ignores it.
func WithGroupCommit(gc GroupCommitter) Option {
	return func(c *config) { c.groupCommit = gc }
}

// WithWriteLock gives a [SQLite] handle a process-local turn at the
// database's write lock, taken around each of its write transactions:
// pass a sqlitestore.Store's LockWrites when the queue shares the store's
// file, so that the queue's writer and the store's hand SQLite's lock over
// at once instead of polling for it in SQLite's busy handler (which sleeps
// up to 100 ms between tries: under load, most of the time). lock must
// return an unlock function; it may return without the turn (then unlock
// does nothing). [WithGroupCommit] is better when the store can be
// given: the two writers then share commits instead of taking turns. A
// handle with WithGroupCommit ignores it. [Postgres] ignores it.
func WithWriteLock(lock func(ctx context.Context) (unlock func())) Option {
	return func(c *config) { c.writeLock = lock }
}

// WithDefaults sets the [QueueOption]s every queue of the handle starts
// from; the options given to Queue apply after them.
func WithDefaults(opts ...QueueOption) Option {
	return func(c *config) {
		for _, o := range opts {
			o(&c.queue)
		}
	}
}

// QueueOption configures one queue; see [SQLite.Queue] and
// [Postgres.Queue].
type QueueOption func(*queueConfig)

type queueConfig struct {
	visibility   time.Duration
	dedupWindow  time.Duration
	contentDedup bool
}

// WithVisibility sets the queue's visibility timeout (default
// [DefaultVisibility], 30 s): how long a received message is hidden from
// other receivers before it is handed out again, unless the delivery
// extends it, acks it, retries it or dead-letters it first. d < 1 ms means
// 1 ms, more than 100 years means 100 years. Each handle has its own setting for
// the queue: the timeout is the receiver's, as with SQS's ReceiveMessage
// VisibilityTimeout. A queue.Consumer's default handler timeout is a sixth
// of it, at most 30 s (3 minutes gives a handler 30 s).
func WithVisibility(d time.Duration) QueueOption {
	return func(c *queueConfig) { c.visibility = min(max(d, time.Millisecond), maxHide) }
}

// WithDedupWindow sets how long a publish's dedup id is remembered
// (default [DefaultDedupWindow], the ledger's default retention of 7
// days). A publish with the same id inside the window is dropped and
// answered with the first message's id and Duplicate set, whether or not
// that message is still in the queue. d <= 0 turns publish-side dedup off:
// every publish is new, and DedupID is only carried to the receiver.
func WithDedupWindow(d time.Duration) QueueOption {
	return func(c *queueConfig) { c.dedupWindow = max(d, 0) }
}

// WithContentDedup makes a publish without a DedupID use the SHA-256 of
// its body (hex) as its dedup id, as SQS's ContentBasedDeduplication does
// (attributes, group and delay do not count). Default off. It does nothing
// when the dedup window is off.
func WithContentDedup(on bool) QueueOption {
	return func(c *queueConfig) { c.contentDedup = on }
}

// checkName checks a queue name.
func checkName(name string) error {
	if name == "" || len(name) > 200 || !pgtext.Valid(name) {
		return fmt.Errorf("%w: %q", ErrBadName, name)
	}
	return nil
}

// Stats describe one queue at one moment.
type Stats struct {
	Queue string `json:"queue"`
	// Ready counts messages that can be received now (a message of a FIFO
	// group behind an earlier one counts, although it waits its turn).
	Ready int64 `json:"ready"`
	// InFlight counts messages received and not yet settled, whose
	// visibility timeout has not lapsed.
	InFlight int64 `json:"in_flight"`
	// Delayed counts messages not yet visible because of a publish delay
	// or a Retry delay.
	Delayed int64 `json:"delayed"`
	// DeadLettered counts messages in the dead-letter table.
	DeadLettered int64 `json:"dead_lettered"`
	// OldestAge is the age of the oldest message in the queue (0 when the
	// queue is empty; dead letters do not count).
	OldestAge time.Duration `json:"oldest_age_ns"`
}

// DeadLetter is a message in the dead-letter table.
type DeadLetter struct {
	Message queue.Message
	Reason  string
	At      time.Time // when it was dead-lettered
}

// dedupFor returns the dedup id a publish of m uses ("" for none).
func (c queueConfig) dedupFor(m queue.Outgoing) string {
	if c.dedupWindow <= 0 {
		return ""
	}
	if m.DedupID != "" {
		return m.DedupID
	}
	if c.contentDedup {
		sum := sha256.Sum256(m.Body)
		return hex.EncodeToString(sum[:])
	}
	return ""
}

func checkOutgoing(m queue.Outgoing) error {
	if m.Delay < 0 {
		return fmt.Errorf("%w: negative delay %v", ErrBadMessage, m.Delay)
	}
	if m.Delay > maxHide {
		return fmt.Errorf("%w: delay %v beyond the 100 years a message can wait", ErrBadMessage, m.Delay)
	}
	if !pgtext.Valid(m.GroupID) {
		return fmt.Errorf("%w: group id %q is not UTF-8 without NUL bytes", ErrBadMessage, m.GroupID)
	}
	if !pgtext.Valid(m.DedupID) {
		return fmt.Errorf("%w: dedup id %q is not UTF-8 without NUL bytes", ErrBadMessage, m.DedupID)
	}
	for k, v := range m.Attributes {
		if !pgtext.Valid(k) || !pgtext.Valid(v) {
			return fmt.Errorf("%w: attribute %q = %q is not UTF-8 without NUL bytes", ErrBadMessage, k, v)
		}
	}
	return nil
}

// publishedInOrder sets out to the ids of a multi-row insert of len(out)
// messages whose ids grow in the messages' order, as RETURNING gave them
// back (in an order of its own).
func publishedInOrder(ids []int64, out []queue.Published) error {
	if len(ids) != len(out) {
		return fmt.Errorf("inserted %d messages, got %d ids back", len(out), len(ids))
	}
	slices.Sort(ids)
	for i, id := range ids {
		out[i] = queue.Published{ID: formatID(id)}
	}
	return nil
}

// encodeAttrs encodes attributes as a JSON object; nil for none.
func encodeAttrs(a map[string]string) ([]byte, error) {
	if len(a) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("%w: attributes: %v", ErrBadMessage, err)
	}
	return b, nil
}

// corruptRow is a received message whose stored attributes cannot be
// read (a row written from outside the queue's API).
type corruptRow struct {
	d   *delivery
	err error
}

// deadLetterCorrupt moves the corrupt messages a receive took to the dead
// letters, with the reason, instead of failing the receive (which would
// fail every later one: the queue would be stuck behind one row). A
// message it cannot move comes back when its visibility lapses.
func deadLetterCorrupt(log *slog.Logger, queueName string, rows []corruptRow,
	deadLetter func(context.Context, *delivery, string) error) {
	for _, r := range rows {
		why := storedReason("undecodable: " + r.err.Error())
		if err := deadLetter(context.Background(), r.d, why); err != nil {
			log.Error("sqlqueue: dead-lettering a message whose attributes cannot be read; it comes back after the visibility timeout",
				"queue", queueName, "message_id", formatID(r.d.id), "reason", why, "err", err)
			continue
		}
		log.Warn("sqlqueue: dead-lettered a message whose attributes cannot be read",
			"queue", queueName, "message_id", formatID(r.d.id), "reason", why)
	}
}

// storedReason is the dead-letter reason a queue keeps of why: its first
// reason.MaxLen bytes, storable in PostgreSQL text (see DeadLetter).
func storedReason(why string) string { return pgtext.Storable(reason.Bound(why)) }

func decodeAttrs(b []byte) (map[string]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var a map[string]string
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("sqlqueue: corrupt attributes: %w", err)
	}
	return a, nil
}

func formatID(id int64) string { return strconv.FormatInt(id, 10) }

// parseMessageID reads an id formatID wrote.
func parseMessageID(id string) (int64, error) {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%w: %q", ErrBadID, id)
	}
	return n, nil
}

// settler settles deliveries in one database.
type settler interface {
	ack(ctx context.Context, d *delivery) error
	retry(ctx context.Context, d *delivery, delay time.Duration) error
	extend(ctx context.Context, d *delivery, dur time.Duration) error
	deadLetter(ctx context.Context, d *delivery, reason string) error
}

// delivery is a received message: its row id and the receipt its receive
// wrote. Every settle is conditional on the receipt, so a delivery whose
// visibility lapsed and whose message was received again cannot touch the
// other receiver's copy.
type delivery struct {
	s       settler
	msg     queue.Message
	id      int64
	receipt int64

	mu      sync.Mutex
	settled bool
	// completed: the fused path's completion deleted the message in its
	// commit (see WithLedger); Ack only reports it.
	completed bool
}

func (d *delivery) Message() queue.Message { return d.msg }

// settle runs f once: a second settle (after one that succeeded or found
// the receipt expired) returns ErrSettled. A settle that failed otherwise
// (a database error) may be tried again.
func (d *delivery) settle(f func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled {
		return fmt.Errorf("sqlqueue: message %d: %w", d.id, queue.ErrSettled)
	}
	err := f()
	if err == nil || errors.Is(err, ErrReceiptExpired) {
		d.settled = true
	}
	return err
}

// Ack deletes the message if it is still this delivery's; otherwise it
// returns an error wrapping [ErrReceiptExpired] and changes nothing.
func (d *delivery) Ack(ctx context.Context) error {
	return d.settle(func() error {
		if d.completed {
			return nil
		}
		return d.s.ack(ctx, d)
	})
}

// Retry makes the message visible again delay from now (0: at once), if
// it is still this delivery's.
func (d *delivery) Retry(ctx context.Context, delay time.Duration) error {
	return d.settle(func() error { return d.s.retry(ctx, d, min(max(delay, 0), maxHide)) })
}

// DeadLetter moves the message to the dead-letter table with reason, in
// one transaction, if it is still this delivery's. It keeps the reason's
// first 4,096 bytes, with U+FFFD for bytes that are not UTF-8 and for
// NULs: a reason is often an error's text quoting the message, and
// PostgreSQL would refuse it, so the message could never be dead-lettered.
func (d *delivery) DeadLetter(ctx context.Context, why string) error {
	why = storedReason(why)
	return d.settle(func() error { return d.s.deadLetter(ctx, d, why) })
}

// Extend hides the message for dur from now (dur < 1 ms means 1 ms, more
// than 100 years means 100 years), if it is still this delivery's.
func (d *delivery) Extend(ctx context.Context, dur time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled {
		return fmt.Errorf("sqlqueue: message %d: %w", d.id, queue.ErrSettled)
	}
	return d.s.extend(ctx, d, min(max(dur, time.Millisecond), maxHide))
}

// maxHide bounds a visibility timeout, an Extend and a Retry's delay, and
// a publish refuses a longer delay: 100 years. A message must stay before
// the year 2200, where the held messages behind FIFO group heads wait,
// and SQLite keeps times as microseconds in an int64.
const maxHide = 100 * 365 * 24 * time.Hour

// redriveChunk is the most dead letters one step of Redrive moves (a
// statement on PostgreSQL, a transaction on SQLite).
const redriveChunk = 1000

// redrive moves up to limit dead letters (limit < 1: all of them) in steps
// of at most redriveChunk, calling move with each step's size until it
// moves fewer. It returns how many were moved, and move's error with what
// was moved before it.
func redrive(limit int, move func(n int) (int, error)) (int, error) {
	total := 0
	for limit < 1 || total < limit {
		n := redriveChunk
		if limit >= 1 {
			n = min(n, limit-total)
		}
		moved, err := move(n)
		if err != nil {
			return total, err
		}
		total += moved
		if moved < n {
			break
		}
	}
	return total, nil
}

func expired(id int64) error {
	return fmt.Errorf("sqlqueue: message %d: %w", id, ErrReceiptExpired)
}

// waker wakes waiting receivers: Wait returns a channel that is closed by
// the next Wake.
type waker struct {
	mu sync.Mutex
	ch chan struct{}
}

func (w *waker) wait() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

func (w *waker) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}

// wakers keep one waker per queue name.
type wakers struct {
	mu sync.Mutex
	m  map[string]*waker
}

func (ws *wakers) get(name string) *waker {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.m == nil {
		ws.m = map[string]*waker{}
	}
	w := ws.m[name]
	if w == nil {
		w = &waker{}
		ws.m[name] = w
	}
	return w
}

// sleep waits for d, a wake-up or ctx, whichever comes first.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wakeName wakes the receivers of one queue.
func (ws *wakers) wakeName(name string) {
	ws.mu.Lock()
	w := ws.m[name]
	ws.mu.Unlock()
	if w != nil {
		w.wake()
	}
}

// wakeAll wakes every receiver.
func (ws *wakers) wakeAll() {
	ws.mu.Lock()
	all := make([]*waker, 0, len(ws.m))
	for _, w := range ws.m {
		all = append(all, w)
	}
	ws.mu.Unlock()
	for _, w := range all {
		w.wake()
	}
}
