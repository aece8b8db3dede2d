package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// chaosWorkerEnv, when set, makes the idem binary a worker of `idem
// chaos` instead of the command: its value is the worker's chaosWorkerCfg
// as JSON. The harness re-executes its own binary with it.
const chaosWorkerEnv = "IDEM_CHAOS_WORKER"

// chaosWorkerCfg is what a worker process is told by the harness.
type chaosWorkerCfg struct {
	Policy      string        `json:"policy"` // at_least_once, at_most_once, reconcile, transactional
	Dir         string        `json:"dir"`    // the run's directory: schedule, sink, logs
	Backend     chaosTarget   `json:"backend"`
	Lease       time.Duration `json:"lease"`
	Visibility  time.Duration `json:"visibility"`
	MaxReceives int           `json:"max_receives"`
	Handlers    int           `json:"handlers"` // messages handled at once
	// Broken makes the worker skip the shared ledger (each process keeps
	// its own in memory): the checker must then report duplicates. It
	// exists to prove that the checker can fail.
	Broken bool `json:"broken,omitempty"`
}

// Fault kinds the schedule assigns to keys (the worker acts on them) and
// the harness injects (stop, store-cut).
const (
	faultKillBeforeEffect = "kill-before-effect"
	faultKillAfterEffect  = "kill-after-effect"
	faultKillBeforeAck    = "kill-after-complete"
	faultStop             = "stop"
	faultSlow             = "short-visibility"
	faultStoreCut         = "store-cut"
	faultRelayKill        = "outbox-relay-kill" // chaos_outbox.go
	faultStoreRestart     = "store-restart"     // chaos_restart.go; only with --restart-store
)

var allChaosFaults = []string{faultKillBeforeEffect, faultKillAfterEffect, faultKillBeforeAck, faultStop, faultSlow, faultStoreCut, faultRelayKill, faultStoreRestart}

// defaultChaosFaults are the faults of a run without --faults: all but
// outbox-relay-kill, which changes the pipeline (an outbox and relays
// before the queue) and adds two writers to the database, and
// store-restart, which --restart-store turns on.
var defaultChaosFaults = allChaosFaults[:len(allChaosFaults)-2]

// chaosEffectWindow is the longest pause between an effect and the
// handler's return: the window a kill or a freeze can land in.
const chaosEffectWindow = 20 * time.Millisecond

// chaosWorkerMain runs a worker until SIGTERM and returns its exit code.
func chaosWorkerMain(raw string) int { return chaosChildMain(raw, "worker", chaosWork) }

// chaosChildMain runs one of idem chaos's child processes (what: worker,
// relay), whose JSON config is raw, until SIGTERM, and returns its exit
// code: 2 for a config it cannot read, 1 when run fails.
func chaosChildMain[C any](raw, what string, run func(context.Context, C) error) int {
	var cfg C
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "idem chaos %s: bad config: %v\n", what, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, cfg); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "idem chaos %s: %v\n", what, err)
		return 1
	}
	return 0
}

// chaosSchedule is the faults the seed assigned to keys: key → fault kind.
type chaosSchedule map[string]string

func readSchedule(dir string) (chaosSchedule, error) {
	b, err := os.ReadFile(filepath.Join(dir, "schedule.json"))
	if err != nil {
		return nil, err
	}
	var s chaosSchedule
	return s, json.Unmarshal(b, &s)
}

// appendLine appends one line to f with one write (O_APPEND: whole lines
// from several processes, and kept when the process is killed).
func appendLine(f *os.File, format string, args ...any) error {
	_, err := f.WriteString(fmt.Sprintf(format, args...) + "\n")
	return err
}

func openAppend(dir, name string) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
}

// worker is one worker process's state.
type chaosWorkerState struct {
	cfg      chaosWorkerCfg
	sched    chaosSchedule
	pid      int
	kills    *os.File // "kind key pid attempt fence"
	sink     chaosSink
	txEffect func(ctx context.Context, tx any, key, who string) error
}

// fire kills the worker at a scheduled point: once per key across all
// workers (an O_EXCL marker file), after logging the kill.
func (w *chaosWorkerState) fire(kind, key string, att idem.Attempt) {
	if !w.once(kind, key) {
		return
	}
	_ = appendLine(w.kills, "%s %s %d %s %d", kind, key, w.pid, orDash(att.ID), att.Fence)
	_ = syscall.Kill(w.pid, syscall.SIGKILL)
	select {} // the signal is on its way
}

// once reports whether key is scheduled for kind and this is the first
// time any worker asks (an O_EXCL marker file in the run's directory).
func (w *chaosWorkerState) once(kind, key string) bool {
	if w.sched[key] != kind {
		return false
	}
	f, err := os.OpenFile(filepath.Join(w.cfg.Dir, "fired", kind+"-"+key), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return false // fired already
	}
	f.Close()
	return true
}

// open is the start a worker and a relay share: it reads the schedule,
// opens the kills file and a logger into logName in w's directory, and
// opens the backend of target once it is there.
func (w *chaosWorkerState) open(ctx context.Context, target *chaosTarget, logName string) (*slog.Logger, chaosBackend, error) {
	var err error
	if w.sched, err = readSchedule(w.cfg.Dir); err != nil {
		return nil, nil, err
	}
	if w.kills, err = openAppend(w.cfg.Dir, "kills"); err != nil {
		return nil, nil, err
	}
	lf, err := openAppend(w.cfg.Dir, logName)
	if err != nil {
		return nil, nil, err
	}
	// JSON lines: the checker reads fields back (cutOffAttempts), and a
	// text line's quoted values could pass for fields.
	log := slog.New(slog.NewJSONHandler(lf, &slog.HandlerOptions{Level: slog.LevelWarn})).With("pid", w.pid)
	be, err := openChaosBackendPatiently(ctx, target, w.cfg.Dir)
	if err != nil {
		return nil, nil, err
	}
	return log, be, nil
}

func chaosWork(ctx context.Context, cfg chaosWorkerCfg) error {
	w := &chaosWorkerState{cfg: cfg, pid: os.Getpid()}
	log, be, err := w.open(ctx, &cfg.Backend, "worker.log")
	if err != nil {
		return err
	}
	defer be.Close()
	src, err := be.Source(ctx, cfg.Visibility)
	if err != nil {
		return err
	}
	markReady(cfg.Dir, w.pid)
	var s store.Store = be.Store()
	if cfg.Broken {
		s = memstore.New()
	}
	policy := idem.AtLeastOnce
	if cfg.Policy == "at_most_once" {
		policy = idem.AtMostOnce
	}
	l := idem.New(s, idem.WithOwner("chaos-"+strconv.Itoa(w.pid)), idem.WithLease(cfg.Lease),
		idem.WithPolicy(policy), idem.WithLogger(log))
	wsrc := newChaosSource(src, w)
	if cfg.Policy == "transactional" {
		return w.txLoop(ctx, wsrc, l, be)
	}
	if w.sink, err = openChaosSink(cfg.Dir, cfg.Policy == "reconcile", cfg.Backend.Sync); err != nil {
		return err
	}
	defer w.sink.Close()
	opts := []queue.Option{
		queue.WithLogger(log), queue.WithMaxReceives(cfg.MaxReceives),
		queue.WithBackoff(20*time.Millisecond, 500*time.Millisecond),
		queue.WithBusyDelay(cfg.Lease), queue.WithConcurrency(max(cfg.Handlers, 1)),
		queue.WithShutdownTimeout(2 * time.Second),
		queue.WithHandlerTimeout(cfg.Visibility),
	}
	if cfg.Policy == "reconcile" {
		opts = append(opts, queue.WithCallOptions(func(queue.Message) []idem.CallOption {
			return []idem.CallOption{idem.WithReconcile(w.sink.Reconcile)}
		}))
	}
	c, err := queue.NewConsumer(wsrc, l, func(m queue.Message) (idem.OperationKey, error) {
		return idem.RawKey(string(m.Body)), nil
	}, w.handle, opts...)
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// handle is the consumer's handler: the effect is one line in the sink.
func (w *chaosWorkerState) handle(ctx context.Context, m queue.Message) ([]byte, error) {
	key := string(m.Body)
	att, _ := idem.AttemptFromContext(ctx)
	w.fire(faultKillBeforeEffect, key, att)
	slow := w.once(faultSlow, key)
	if slow {
		// The duplicate generator: a handler that ignores its context
		// and outlives its message's visibility, which is not extended
		// for this key (chaosDelivery.Extend): another worker receives
		// the message while this handler runs, and must find the key
		// busy (the ledger extends its lease meanwhile).
		time.Sleep(w.cfg.Visibility * 3 / 2)
	}
	if err := ctx.Err(); err != nil && !slow {
		return nil, idem.NotDone(err) // the effect certainly did not happen
	}
	if err := w.sink.Write(key, att, w.pid, m.ID); err != nil {
		if errors.Is(err, errFencedOut) {
			return nil, idem.NotDone(err)
		}
		return nil, err
	}
	time.Sleep(rand.N(chaosEffectWindow))
	w.fire(faultKillAfterEffect, key, att)
	return []byte(strconv.Itoa(w.pid)), nil
}

// txLoop is the Transactional worker: a receive loop that runs idem.DoTx
// with the effect a row written in the ledger's transaction, and settles
// each message by the answer (queue.Consumer runs Ledger.Do, not DoTx).
func (w *chaosWorkerState) txLoop(ctx context.Context, src queue.Source, l *idem.Ledger, be chaosBackend) error {
	who := strconv.Itoa(w.pid)
	var wg sync.WaitGroup
	defer wg.Wait()
	n := max(w.cfg.Handlers, 1)
	sem := make(chan struct{}, n)
	for {
		// Receive only as many as there are free handlers: a message
		// received and left waiting would use up its visibility.
		sem <- struct{}{}
		free := 1
	take:
		for free < n {
			select {
			case sem <- struct{}{}:
				free++
			default:
				break take
			}
		}
		ds, err := src.Receive(ctx, free)
		for range free - len(ds) {
			<-sem
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			sleepCtx(ctx, 20*time.Millisecond)
			continue
		}
		for _, d := range ds {
			wg.Go(func() {
				defer func() { <-sem }()
				w.txOne(ctx, d, l, be, who)
			})
		}
	}
}

func (w *chaosWorkerState) txOne(ctx context.Context, d queue.Delivery, l *idem.Ledger, be chaosBackend, who string) {
	m := d.Message()
	key := string(m.Body)
	sctx := context.WithoutCancel(ctx)
	if w.once(faultSlow, key) {
		// The duplicate generator: the message's visibility runs out
		// (it is not extended) before DoTx runs, and another worker
		// receives it meanwhile.
		time.Sleep(w.cfg.Visibility * 3 / 2)
	}
	_, err := be.DoTx(ctx, l, key, func(ctx context.Context) error {
		w.fire(faultKillBeforeEffect, key, idem.Attempt{})
		return nil
	}, func(ctx context.Context) error {
		// No pause here, unlike handle's: fn runs on sqlitestore's
		// group-commit writer, where a pause would hold up every other
		// write. The scheduled kill lands in the window all the same.
		w.fire(faultKillAfterEffect, key, idem.Attempt{}) // the row is not committed: it goes with the process
		return nil
	}, who, m.ID)
	var busy *idem.InProgressError
	switch {
	case err == nil:
		_ = d.Ack(sctx)
	case errors.Is(err, idem.ErrMismatch), errors.Is(err, idem.ErrFailed):
		_ = d.DeadLetter(sctx, err.Error())
	case w.cfg.MaxReceives > 0 && m.ReceiveCount >= w.cfg.MaxReceives:
		_ = d.DeadLetter(sctx, fmt.Sprintf("received %d times: %v", m.ReceiveCount, err))
	case errors.As(err, &busy):
		_ = d.Retry(sctx, min(busy.RetryAfter, 50*time.Millisecond+rand.N(100*time.Millisecond)))
	default:
		_ = d.Retry(sctx, 20*time.Millisecond+rand.N(80*time.Millisecond))
	}
}

// wrappedSource is a source whose every delivery wrap wraps: a fault
// fired at its settle, a line logged.
type wrappedSource struct {
	queue.Source
	wrap func(queue.Delivery) queue.Delivery
}

func (s *wrappedSource) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	ds, err := s.Source.Receive(ctx, max)
	for i, d := range ds {
		ds[i] = s.wrap(d)
	}
	return ds, err
}

// chaosSource wraps the queue's source: its deliveries fire the kill
// after completion (before the ack), and are not extended for a key
// scheduled short-visibility.
type chaosSource struct{ wrappedSource }

func newChaosSource(src queue.Source, w *chaosWorkerState) *chaosSource {
	return &chaosSource{wrappedSource{Source: src, wrap: func(d queue.Delivery) queue.Delivery { return &chaosDelivery{Delivery: d, w: w} }}}
}

// ClaimsFor and ReceiveClaimed make a chaosSource a queue.ClaimingSource
// when the queue is one (the fused path: --fused), so that the consumer
// receives and claims, and completes and acks, in one commit each, as a
// user's would, with the deliveries wrapped as Receive's are.
func (s *chaosSource) ClaimsFor(st store.Store) bool {
	cs, ok := s.Source.(queue.ClaimingSource)
	return ok && cs.ClaimsFor(st)
}

func (s *chaosSource) ReceiveClaimed(ctx context.Context, max int, claim func(queue.Message) (store.ClaimRequest, bool)) ([]queue.Delivery, []*idem.Claimed, error) {
	cs, ok := s.Source.(queue.ClaimingSource)
	if !ok {
		return nil, nil, errors.New("the queue cannot claim")
	}
	ds, claims, err := cs.ReceiveClaimed(ctx, max, claim)
	for i, d := range ds {
		ds[i] = s.wrap(d)
	}
	return ds, claims, err
}

type chaosDelivery struct {
	queue.Delivery
	w *chaosWorkerState
}

func (d *chaosDelivery) key() string { return string(d.Message().Body) }

func (d *chaosDelivery) Ack(ctx context.Context) error {
	d.w.fire(faultKillBeforeAck, d.key(), idem.Attempt{})
	return d.Delivery.Ack(ctx)
}

func (d *chaosDelivery) Extend(ctx context.Context, by time.Duration) error {
	if d.w.sched[d.key()] == faultSlow {
		return nil // the duplicate generator: the visibility runs out under the handler
	}
	return d.Delivery.Extend(ctx, by)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// errFencedOut: the sink refused an effect of an attempt that a later
// attempt has superseded (Reconcile's fenced sink).
var errFencedOut = errors.New("fenced out: a later attempt owns the key")

// chaosSink is where a non-transactional effect is recorded.
type chaosSink interface {
	Write(key string, att idem.Attempt, pid int, msgID string) error
	// Reconcile is the Reconcile policy's hook: it asks the sink whether
	// the key's effect happened, and fences out the lapsed attempt.
	Reconcile(ctx context.Context, lapsed idem.Lapsed) ([]byte, bool, error)
	Close() error
}

// fileSink is an O_APPEND file: one line "key pid attempt fence message"
// per effect. It has no memory (AtLeastOnce, AtMostOnce).
type fileSink struct{ f *os.File }

func (s fileSink) Write(key string, att idem.Attempt, pid int, msgID string) error {
	return appendLine(s.f, "%s %d %s %d %s", key, pid, orDash(att.ID), att.Fence, msgID)
}

func (fileSink) Reconcile(context.Context, idem.Lapsed) ([]byte, bool, error) {
	return nil, false, errors.New("the file sink cannot answer")
}

func (s fileSink) Close() error { return s.f.Close() }

// dbSink is the world a Reconcile hook can ask: a SQLite file apart from
// the ledger (effects.db), which honours fences as a downstream system
// given the attempt's fence would: an effect of an attempt older than
// the key's newest is refused.
type dbSink struct{ db *sql.DB }

func openChaosSink(dir string, fenced bool, sync string) (chaosSink, error) {
	if !fenced {
		f, err := openAppend(dir, "effects")
		return fileSink{f}, err
	}
	db, err := openSinkDB(dir, sync)
	return dbSink{db}, err
}

// openSinkDB opens the Reconcile sink's file; sync is its synchronous
// setting, full unless "normal".
func openSinkDB(dir, sync string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", filepath.Join(dir, "effects.db")+"?_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)&_txlock=immediate&_pragma=synchronous("+sqliteSync(sync)+")")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return db, nil
}

const sinkSchema = `CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL, pid INTEGER NOT NULL, attempt TEXT NOT NULL, fence INTEGER NOT NULL, message TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS effects_key ON effects (key);
CREATE TABLE IF NOT EXISTS fences (key TEXT PRIMARY KEY, fence INTEGER NOT NULL);`

func (s dbSink) Write(key string, att idem.Attempt, pid int, msgID string) error {
	tx, err := s.db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var newest int64
	if err := tx.QueryRow(`SELECT fence FROM fences WHERE key = ?`, key).Scan(&newest); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	if att.Fence < newest {
		return errFencedOut
	}
	if _, err := tx.Exec(`INSERT INTO fences (key, fence) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET fence = excluded.fence`, key, att.Fence); err != nil {
		return err
	}
	if _, err := tx.Exec(`INSERT INTO effects (key, pid, attempt, fence, message) VALUES (?, ?, ?, ?, ?)`, key, pid, orDash(att.ID), att.Fence, msgID); err != nil {
		return err
	}
	return tx.Commit()
}

func (s dbSink) Reconcile(ctx context.Context, lapsed idem.Lapsed) ([]byte, bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, false, err
	}
	defer tx.Rollback()
	var pid int
	err = tx.QueryRowContext(ctx, `SELECT pid FROM effects WHERE key = ? LIMIT 1`, lapsed.Key).Scan(&pid)
	if err == nil {
		return []byte(strconv.Itoa(pid)), true, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, false, err
	}
	// Not done: fence the lapsed attempt out, so that it cannot do the
	// effect after this answer (a frozen worker that wakes up).
	if _, err := tx.ExecContext(ctx, `INSERT INTO fences (key, fence) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET fence = max(fence, excluded.fence)`,
		lapsed.Key, lapsed.Fence+1); err != nil {
		return nil, false, err
	}
	return nil, false, tx.Commit()
}

func (s dbSink) Close() error { return s.db.Close() }
