package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/jackc/pgx/v5"
)

// The outbox-relay-kill fault: the producer writes every message into a
// transactional outbox (a sqlqueue queue in the database that holds the
// run's queue: the store's SQLite file or PostgreSQL schema, or the
// queue's SQLite file beside Redis) with outbox.PublishTx, and relay
// processes (this binary again, with chaosRelayEnv) run outbox.Relay from
// the outbox to the run's queue. For a key scheduled outbox-relay-kill the
// relay SIGKILLs itself after the target confirmed the publish and before
// the outbox ack; another relay publishes the message again with the same
// dedup id.
//
// The relays publish a key with an even number to the run's queue as it
// is (sqlqueue's publish-side dedup drops the second copy) and a key with
// an odd number through a handle with that dedup off (as RabbitMQ or SQS
// standard would take it): the second copy is delivered, and the
// consumer's ledger must absorb it. The schedule picks the killed keys of
// both kinds in turn.

// chaosRelayEnv, when set, makes the idem binary a relay of `idem chaos`:
// its value is the relay's chaosRelayCfg as JSON.
const chaosRelayEnv = "IDEM_CHAOS_RELAY"

// chaosOutboxName is the outbox queue's name, beside the run's queue.
const chaosOutboxName = "chaos-outbox"

// chaosRelays is how many relay processes are alive at once.
const chaosRelays = 2

// chaosRelayCfg is what a relay process is told by the harness.
type chaosRelayCfg struct {
	Dir        string        `json:"dir"`
	Backend    chaosTarget   `json:"backend"`
	Visibility time.Duration `json:"visibility"` // the outbox's, and the target's
}

// chaosOutboxReport is the outbox's figures in a policy's report.
type chaosOutboxReport struct {
	// Written counts the messages the producer wrote into the outbox.
	Written       int `json:"written"`
	RelaysStarted int `json:"relays_started"`
	// RelayKills counts the relays killed between a confirmed publish
	// and its outbox ack.
	RelayKills int `json:"relay_kills"`
	// Republished counts the publishes of those messages by the relays
	// that got them back; DedupedByTarget of them the target dropped as
	// duplicates of the first, Delivered it took as new (the consumer's
	// ledger absorbed them).
	Republished     int `json:"republished"`
	DedupedByTarget int `json:"republishes_deduplicated_by_target"`
	Delivered       int `json:"republishes_delivered"`
	DeadLetters     int `json:"dead_letters"`
}

// outboxOf returns the outbox side of be: its queue's, when the queue is
// sqlqueue (in the store's database, or in a SQLite file beside Redis or
// DynamoDB); other brokers have none.
func outboxOf(be chaosBackend) (chaosOutboxBackend, bool) {
	var x any = be
	if p, ok := be.(*chaosPair); ok {
		x = p.q
	}
	if h, ok := x.(interface{ outbox() chaosOutboxBackend }); ok {
		return h.outbox(), true
	}
	return nil, false
}

// chaosOutboxBackend is what a backend offers the outbox fault.
type chaosOutboxBackend interface {
	// WriteOutbox writes m into the outbox for key in a transaction of
	// its own, committed before it returns.
	WriteOutbox(ctx context.Context, key idem.OperationKey, m queue.Outgoing) (queue.Published, error)
	// Outbox opens the outbox for receiving, with visibility vis.
	Outbox(vis time.Duration) (queue.Source, error)
	// PublisherNoDedup opens the run's queue for publishing with its
	// publish-side dedup off.
	PublisherNoDedup(vis time.Duration) (queue.Publisher, error)
	// OutboxPending counts the outbox's unsettled messages, and its dead
	// letters.
	OutboxPending(ctx context.Context) (pending, dead int64, err error)
}

// sqlOutbox is the outbox side of a sqlqueue queue (chaosOutboxBackend):
// a queue of its own beside the run's, in the same database, written in
// a transaction on that database. Q is the handle's queue type, Tx its
// transaction's.
type sqlOutbox[Q sqlOutboxQueue[Tx], Tx any] struct {
	open  func(name string, opts ...sqlqueue.QueueOption) (Q, error)          // the handle's Queue
	inTx  func(ctx context.Context, fn func(context.Context, Tx) error) error // runs fn in a transaction, committed if fn succeeds; fn gets the transaction's context
	queue string                                                              // the run's queue
}

// sqlOutboxQueue is what sqlOutbox uses of a sqlqueue queue.
type sqlOutboxQueue[Tx any] interface {
	queue.Source
	queue.Publisher
	queue.TxPublisher[Tx]
	Stats(ctx context.Context) (sqlqueue.Stats, error)
}

func (o sqlOutbox[Q, Tx]) WriteOutbox(ctx context.Context, key idem.OperationKey, m queue.Outgoing) (queue.Published, error) {
	ob, err := o.open(chaosOutboxName)
	if err != nil {
		return queue.Published{}, err
	}
	var out queue.Published
	err = o.inTx(ctx, func(ctx context.Context, tx Tx) error {
		out, err = outbox.PublishTx(ctx, ob, tx, key, m)
		return err
	})
	return out, err
}

func (o sqlOutbox[Q, Tx]) Outbox(vis time.Duration) (queue.Source, error) {
	return o.open(chaosOutboxName, sqlqueue.WithVisibility(vis))
}

func (o sqlOutbox[Q, Tx]) PublisherNoDedup(vis time.Duration) (queue.Publisher, error) {
	return o.open(o.queue, sqlqueue.WithVisibility(vis), sqlqueue.WithDedupWindow(0))
}

func (o sqlOutbox[Q, Tx]) OutboxPending(ctx context.Context) (int64, int64, error) {
	q, err := o.open(chaosOutboxName)
	if err != nil {
		return 0, 0, err
	}
	st, err := q.Stats(ctx)
	return st.Ready + st.InFlight + st.Delayed, st.DeadLettered, err
}

// embedded's outbox shares the store's file, and writes as a user's code
// would: in the store's own writer (sqlitestore.Store.WriteTx), whose
// transaction it shares with the claims and completions of its batch.
func (e *embedded) outbox() chaosOutboxBackend {
	return sqlOutbox[*sqlqueue.SQLiteQueue, *sql.Tx]{open: e.h.Queue, queue: e.t.Queue,
		inTx: func(ctx context.Context, fn func(context.Context, *sql.Tx) error) error {
			return e.s.WriteTx(ctx, fn) // fn gets the writer's context, as WriteTx asks
		}}
}

// sqlQueueFile's outbox is in the queue's file, apart from the store's:
// its writes are transactions of their own there.
func (r *sqlQueueFile) outbox() chaosOutboxBackend {
	return sqlOutbox[*sqlqueue.SQLiteQueue, *sql.Tx]{open: r.h.Queue, queue: r.t.Queue,
		inTx: func(ctx context.Context, fn func(context.Context, *sql.Tx) error) error {
			tx, err := r.qdb.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if err := fn(ctx, tx); err != nil {
				return err
			}
			return tx.Commit()
		}}
}

func (p *postgres) outbox() chaosOutboxBackend {
	return sqlOutbox[*sqlqueue.PostgresQueue, pgx.Tx]{open: p.h.Queue, queue: p.t.Queue,
		inTx: func(ctx context.Context, fn func(context.Context, pgx.Tx) error) error {
			// The store's pool: its connections' search path is the run's schema.
			return pgx.BeginFunc(ctx, p.s.Pool(), func(tx pgx.Tx) error { return fn(ctx, tx) })
		}}
}

// chaosOutboxState is the harness's side of the outbox fault.
type chaosOutboxState struct {
	relays  chaosProcs
	written int
}

// publish sends the producer's message m for key: into the outbox when
// the outbox-relay-kill fault is on, else straight to the queue.
func (r *chaosScenario) publish(ctx context.Context, be chaosBackend, pub queue.Publisher, m queue.Outgoing) (queue.Published, error) {
	if !r.has(faultRelayKill) {
		return pub.Publish(ctx, m)
	}
	ob, ok := outboxOf(be)
	if !ok {
		return queue.Published{}, fmt.Errorf("the %s target has no outbox", r.target.Kind)
	}
	// The operation key of an outbox message is its dedup id, one per
	// copy: the copies of a key are separate messages, as without the
	// outbox; the consumer keys its ledger by the body.
	p, err := ob.WriteOutbox(ctx, idem.RawKey(m.DedupID), m)
	if err == nil && !p.Duplicate {
		r.mu.Lock()
		r.ob.written++
		r.mu.Unlock()
	}
	return p, err
}

// pending counts the unsettled messages of the run's queue and, with the
// outbox fault, of the outbox; dead counts the queue's dead letters.
func (r *chaosScenario) pending(ctx context.Context, be chaosBackend) (pending, dead int64, err error) {
	pending, dead, err = be.Pending(ctx)
	if err != nil || !r.has(faultRelayKill) {
		return pending, dead, err
	}
	ob, ok := outboxOf(be)
	if !ok {
		return 0, 0, fmt.Errorf("the %s target has no outbox", r.target.Kind)
	}
	n, _, err := ob.OutboxPending(ctx)
	return pending + n, dead, err
}

// startRelays starts the relay processes, when the outbox fault is on.
func (r *chaosScenario) startRelays() error {
	if !r.has(faultRelayKill) {
		return nil
	}
	cb, _ := json.Marshal(chaosRelayCfg{Dir: r.dir, Backend: r.target, Visibility: r.o.visibility})
	r.mu.Lock()
	r.ob.relays = newChaosProcs("relay", "relay pid", chaosRelayEnv+"="+string(cb))
	r.mu.Unlock()
	for range chaosRelays {
		if err := r.startProc(&r.ob.relays); err != nil {
			return err
		}
	}
	return nil
}

// checkOutbox fills pr.Outbox from the relays' logs: the kills, and what
// the target answered to each later publish of a killed relay's message.
// Every such message must have been published again (it stayed in the
// outbox, unacked), and none dead-lettered in the outbox.
func (r *chaosScenario) checkOutbox(ctx context.Context, be chaosBackend, pr *chaosPolicyReport) error {
	if !r.has(faultRelayKill) {
		return nil
	}
	r.mu.Lock()
	rep := &chaosOutboxReport{Written: r.ob.written, RelaysStarted: r.ob.relays.started}
	r.mu.Unlock()
	pr.Outbox = rep
	killedBy := map[string]int{} // dedup id → the killed relay's pid
	if err := scanLines(filepath.Join(r.dir, "kills"), func(f []string) {
		if len(f) == 6 && f[0] == faultRelayKill {
			pid, _ := strconv.Atoi(f[2])
			killedBy[f[5]] = pid
			rep.RelayKills++
		}
	}); err != nil {
		return err
	}
	// The lines are in time order: a publish counts as a re-publish once
	// the killed relay's own publish is behind (a relay that died with
	// another's kill may have published the message before it).
	again := map[string]int{}
	killerDone := map[string]bool{}
	if err := scanLines(filepath.Join(r.dir, "relay-publishes"), func(f []string) {
		if len(f) != 3 {
			return
		}
		killer, ok := killedBy[f[0]]
		if !ok {
			return
		}
		if pid, _ := strconv.Atoi(f[1]); pid == killer {
			killerDone[f[0]] = true
			return
		}
		if !killerDone[f[0]] {
			return
		}
		again[f[0]]++
		rep.Republished++
		if f[2] == "true" {
			rep.DedupedByTarget++
		} else {
			rep.Delivered++
		}
	}); err != nil {
		return err
	}
	for id := range killedBy {
		if again[id] == 0 {
			pr.violate("outbox message %s: its relay was killed after the publish, before the ack, and no relay published it again", id)
		}
	}
	ob, ok := outboxOf(be)
	if !ok {
		return fmt.Errorf("the %s target has no outbox", r.target.Kind)
	}
	_, dead, err := ob.OutboxPending(ctx)
	if err != nil {
		return err
	}
	rep.DeadLetters = int(dead)
	if dead > 0 {
		pr.violate("%d messages dead-lettered in the outbox", dead)
	}
	return nil
}

// scheduleRelayKills assigns outbox-relay-kill to n keys not taken,
// alternating an even key (its re-publish deduplicated by the target)
// and an odd one (delivered, absorbed by the ledger).
func (r *chaosScenario) scheduleRelayKills(n int) {
	for tries := 0; n > 0 && tries < 20*r.o.keys; tries++ {
		i := r.rng.IntN(r.o.keys)
		k := chaosKey(i)
		if _, taken := r.sched[k]; taken || (r.o.keys > 1 && i%2 != n%2) {
			continue
		}
		r.sched[k] = faultRelayKill
		n--
	}
}

// chaosKeyOdd reports whether key names an odd key number.
func chaosKeyOdd(key string) bool {
	n, err := strconv.Atoi(strings.TrimPrefix(key, "chaos:"))
	return err == nil && n%2 == 1
}

// chaosRelayMain runs a relay until SIGTERM and returns its exit code.
func chaosRelayMain(raw string) int { return chaosChildMain(raw, "relay", chaosRelay) }

func chaosRelay(ctx context.Context, cfg chaosRelayCfg) error {
	w := &chaosWorkerState{cfg: chaosWorkerCfg{Dir: cfg.Dir}, pid: os.Getpid()}
	log, be, err := w.open(ctx, &cfg.Backend, "relay.log")
	if err != nil {
		return err
	}
	defer be.Close()
	pubs, err := openAppend(cfg.Dir, "relay-publishes")
	if err != nil {
		return err
	}
	ob, ok := outboxOf(be)
	if !ok {
		return fmt.Errorf("the %s target has no outbox", cfg.Backend.Kind)
	}
	src, err := ob.Outbox(cfg.Visibility)
	if err != nil {
		return err
	}
	dedup, err := be.Publisher(ctx, cfg.Visibility)
	if err != nil {
		return err
	}
	plain, err := ob.PublisherNoDedup(cfg.Visibility)
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(&wrappedSource{Source: src, wrap: func(d queue.Delivery) queue.Delivery { return &chaosRelayDelivery{Delivery: d, w: w} }},
		&chaosRelayTarget{dedup: dedup, plain: plain, w: w, log: pubs},
		outbox.WithPublishTimeout(min(cfg.Visibility, 2*time.Second)),
		outbox.WithBackoff(20*time.Millisecond, 500*time.Millisecond),
		outbox.WithShutdownTimeout(2*time.Second), outbox.WithLogger(log))
	if err != nil {
		return err
	}
	return relay.Run(ctx)
}

// chaosRelayDelivery is a delivery of the outbox whose ack, for a key
// scheduled outbox-relay-kill, kills the relay first (once per key).
type chaosRelayDelivery struct {
	queue.Delivery
	w *chaosWorkerState
}

// Ack is called by the relay only once the target confirmed the publish:
// the kill lands between the two. It is logged first ("kind key pid -
// 0 dedup-id"), so that the harness attributes the publishes that follow.
func (d *chaosRelayDelivery) Ack(ctx context.Context) error {
	m := d.Message()
	if key := string(m.Body); d.w.sched[key] == faultRelayKill {
		// One kill at a time: a relay acks several messages at once, and
		// a second scheduled key must not take its marker (fired) and die
		// with the first kill unlogged; it waits here instead, dies
		// before its marker, and its kill fires on the next relay.
		chaosRelayKillMu.Lock()
		if d.w.once(faultRelayKill, key) {
			_ = appendLine(d.w.kills, "%s %s %d - 0 %s", faultRelayKill, key, d.w.pid, m.DedupID)
			_ = syscall.Kill(d.w.pid, syscall.SIGKILL)
			select {} // the signal is on its way
		}
		chaosRelayKillMu.Unlock()
	}
	return d.Delivery.Ack(ctx)
}

// chaosRelayKillMu is held by the relay's kill from its marker to its end.
var chaosRelayKillMu sync.Mutex

// chaosRelayTarget is the relay's target: the run's queue, with its
// publish-side dedup for even keys and without it for odd ones. It logs
// every confirmed publish of a key scheduled outbox-relay-kill ("dedup-id
// pid duplicate"), before the relay acks it.
type chaosRelayTarget struct {
	dedup, plain queue.Publisher
	w            *chaosWorkerState
	log          *os.File // O_APPEND: one write a line
}

func (t *chaosRelayTarget) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	key := string(m.Body)
	to := t.dedup
	if chaosKeyOdd(key) {
		to = t.plain
	}
	p, err := to.Publish(ctx, m)
	if err == nil && t.w.sched[key] == faultRelayKill {
		_ = appendLine(t.log, "%s %d %t", m.DedupID, t.w.pid, p.Duplicate)
	}
	return p, err
}

// writeChaosFaultFigures prints, after the tables, the outbox's and the
// store restarts' figures of the policies that ran those faults.
func writeChaosFaultFigures(w io.Writer, rep *chaosReport) error {
	var ob, rs []*chaosPolicyReport
	for _, p := range rep.Policies {
		if p.Outbox != nil {
			ob = append(ob, p)
		}
		if p.Restart != nil {
			rs = append(rs, p)
		}
	}
	if len(ob) > 0 {
		fmt.Fprintln(w)
		tw := newTable(w)
		fmt.Fprintln(tw, "POLICY\tOUTBOX WRITTEN\tRELAYS STARTED\tRELAY KILLS\tRE-PUBLISHED\tDEDUPLICATED BY QUEUE\tDELIVERED (LEDGER ABSORBED)\tOUTBOX DEAD LETTERS")
		for _, p := range ob {
			o := p.Outbox
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", p.Policy, o.Written, o.RelaysStarted, o.RelayKills, o.Republished, o.DedupedByTarget, o.Delivered, o.DeadLetters)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(rs) > 0 {
		fmt.Fprintln(w)
		tw := newTable(w)
		fmt.Fprintln(tw, "POLICY\tSTORE RESTARTS\tLONGEST\tFAILED")
		for _, p := range rs {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\n", p.Policy, p.Restart.Restarts, p.Restart.Longest, p.Restart.Failed)
		}
		return tw.Flush()
	}
	return nil
}
