package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/store"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	_ "modernc.org/sqlite" // the driver both sides use ("sqlite")
)

// publishBatch is how many messages (jobs) each side publishes (inserts)
// per call before consuming.
const publishBatch = 1000

// idemQueue is the queue the idem side publishes to and consumes from.
type idemQueue struct {
	name    string
	src     queue.Source
	publish func(ctx context.Context, ms []queue.Outgoing) error
	close   func() error
}

// e2eResult is one side's end-to-end run: n messages published, then
// consumed.
type e2eResult struct {
	n       int
	publish time.Duration
	consume time.Duration
	cpu     time.Duration // this process's CPU time over both
}

// cpuPer returns the process's CPU time per message, µs.
func (r e2eResult) cpuPer() float64 { return float64(r.cpu.Microseconds()) / float64(r.n) }

func (r e2eResult) rate() float64 { return float64(r.n) / (r.publish + r.consume).Seconds() }

func (r e2eResult) note() string {
	return fmt.Sprintf("n=%d: publish %.0f/s, consume %.0f/s", r.n,
		float64(r.n)/r.publish.Seconds(), float64(r.n)/r.consume.Seconds())
}

// countingSource counts the deliveries acked, so the run knows when the
// last message is done (acked after its effect was recorded).
type countingSource struct {
	queue.Source
	acked atomic.Int64
	done  chan struct{}
	want  int64
	once  sync.Once
}

func (s *countingSource) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	ds, err := s.Source.Receive(ctx, max)
	for i, d := range ds {
		ds[i] = &countingDelivery{Delivery: d, s: s}
	}
	return ds, err
}

// ClaimsFor and ReceiveClaimed pass sqlqueue's fused path through.
func (s *countingSource) ClaimsFor(st store.Store) bool {
	cs, ok := s.Source.(queue.ClaimingSource)
	return ok && cs.ClaimsFor(st)
}

func (s *countingSource) ReceiveClaimed(ctx context.Context, max int, claim func(queue.Message) (store.ClaimRequest, bool)) ([]queue.Delivery, []*idem.Claimed, error) {
	ds, claims, err := s.Source.(queue.ClaimingSource).ReceiveClaimed(ctx, max, claim)
	for i, d := range ds {
		ds[i] = &countingDelivery{Delivery: d, s: s}
	}
	return ds, claims, err
}

type countingDelivery struct {
	queue.Delivery
	s *countingSource
}

func (d *countingDelivery) Ack(ctx context.Context) error {
	err := d.Delivery.Ack(ctx)
	if err == nil && d.s.acked.Add(1) >= d.s.want {
		d.s.once.Do(func() { close(d.s.done) })
	}
	return err
}

// idemE2E publishes n messages to q in batches, then consumes them with a
// queue.Consumer on a ledger over store whose handler is a no-op: each
// message is claimed, run and completed in the ledger, then acked.
// coalesce is the ledger's idem.WithCoalescing (0: off).
func idemE2E(ctx context.Context, cfg *config, st store.Store, q idemQueue, n, coalesce int) (e2eResult, error) {
	res := e2eResult{n: n}
	cpu0 := cpuTime()
	start := time.Now()
	batch := make([]queue.Outgoing, 0, publishBatch)
	for i := range n {
		batch = append(batch, queue.Outgoing{Body: strconv.AppendInt(nil, int64(i), 10)})
		if len(batch) == cap(batch) || i == n-1 {
			if err := q.publish(ctx, batch); err != nil {
				return res, fmt.Errorf("publish: %w", err)
			}
			batch = batch[:0]
		}
	}
	res.publish = time.Since(start)

	src := &countingSource{Source: q.src, done: make(chan struct{}), want: int64(n)}
	var handled atomic.Int64
	// -receivers consumers share the concurrency (the first takes what
	// does not divide): each has its own receive loop, so up to that many
	// receives are in flight at once.
	ledger := idem.New(st, idem.WithLogger(cfg.log), idem.WithCoalescing(coalesce))
	k := max(1, min(cfg.receivers, cfg.consumers))
	cs := make([]*queue.Consumer, k)
	for i := range cs {
		conc := cfg.consumers / k
		if i == 0 {
			conc += cfg.consumers % k
		}
		c, err := queue.NewConsumer(src, ledger, queue.MessageIDKey("bench"),
			func(context.Context, queue.Message) ([]byte, error) {
				handled.Add(1)
				return nil, nil
			},
			queue.WithConcurrency(conc), queue.WithBatchSize(min(cfg.batch, conc)), queue.WithLogger(cfg.log),
			queue.WithHandlerTimeout(q.src.Visibility()/6))
		if err != nil {
			return res, err
		}
		cs[i] = c
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ran := make(chan error, k)
	start = time.Now()
	for _, c := range cs {
		go func() { ran <- c.Run(rctx) }()
	}
	wait := func() error {
		var first error
		for range k {
			if err := <-ran; err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	select {
	case <-src.done:
		res.consume = time.Since(start)
		res.cpu = cpuTime() - cpu0
	case err := <-ran:
		cancel()
		for range k - 1 {
			<-ran
		}
		return res, fmt.Errorf("a consumer stopped after %d of %d: %v", src.acked.Load(), n, err)
	case <-ctx.Done():
		cancel()
		wait()
		return res, ctx.Err()
	}
	cancel()
	if err := wait(); err != nil {
		return res, err
	}
	if h := handled.Load(); h != int64(n) {
		return res, fmt.Errorf("the handler ran %d times for %d messages", h, n)
	}
	return res, nil
}

// receiversNote names -receivers when it is not 1.
func receiversNote(cfg *config) string {
	if cfg.receivers <= 1 {
		return ""
	}
	return fmt.Sprintf(" in %d consumers (receive loops)", cfg.receivers)
}

// e2eArgs is the job River inserts and works in the end-to-end runs.
type e2eArgs struct {
	N int `json:"n"`
}

func (e2eArgs) Kind() string { return "idem_bench_e2e" }

// riverE2E inserts n jobs with InsertMany in batches, then starts a client
// whose worker is a no-op and waits until River reports all n completed
// (the completion written to the database).
func riverE2E[TTx any](ctx context.Context, cfg *config, driver riverdriver.Driver[TTx], schema string, n int) (e2eResult, error) {
	res := e2eResult{n: n}
	workers := river.NewWorkers()
	var worked atomic.Int64
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[e2eArgs]) error {
		worked.Add(1)
		return nil
	}))
	// The fetch settings and the default worker count are those `river
	// bench` uses.
	client, err := river.NewClient(driver, &river.Config{
		Schema:            schema,
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.riverWorkers}},
		Workers:           workers,
		Logger:            cfg.log,
	})
	if err != nil {
		return res, err
	}
	events, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: n + 1000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer unsubscribe()

	cpu0 := cpuTime()
	start := time.Now()
	params := make([]river.InsertManyParams, 0, publishBatch)
	for i := range n {
		params = append(params, river.InsertManyParams{Args: e2eArgs{N: i}})
		if len(params) == cap(params) || i == n-1 {
			if _, err := client.InsertMany(ctx, params); err != nil {
				return res, fmt.Errorf("insert: %w", err)
			}
			params = params[:0]
		}
	}
	res.publish = time.Since(start)

	start = time.Now()
	if err := client.Start(ctx); err != nil {
		return res, err
	}
	defer client.Stop(context.WithoutCancel(ctx))
	for done := 0; done < n; {
		select {
		case ev := <-events:
			if ev == nil {
				return res, fmt.Errorf("river: subscription closed after %d of %d jobs", done, n)
			}
			if ev.Kind != river.EventKindJobCompleted || ev.Job.State != rivertype.JobStateCompleted {
				return res, fmt.Errorf("river: job %d: %s (%s)", ev.Job.ID, ev.Kind, ev.Job.State)
			}
			done++
		case <-time.After(2 * time.Minute):
			return res, fmt.Errorf("river: no job completed for 2 minutes (%d of %d done)", done, n)
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	res.consume = time.Since(start)
	res.cpu = cpuTime() - cpu0
	if w := worked.Load(); w != int64(n) {
		return res, fmt.Errorf("river: the worker ran %d times for %d jobs", w, n)
	}
	return res, nil
}

// openRiverSQLite opens a new River database at path with modernc's
// driver, in WAL mode with synchronous=FULL (the durability sqlitestore
// uses), on one connection as riversqlite advises, and migrates it.
func openRiverSQLite(ctx context.Context, cfg *config, path string) (*sql.DB, error) {
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "busy_timeout(10000)")
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	m, err := rivermigrate.New(riversqlite.New(db), &rivermigrate.Config{Logger: cfg.log})
	if err != nil {
		db.Close()
		return nil, err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		db.Close()
		return nil, fmt.Errorf("river migrate: %w", err)
	}
	return db, nil
}

// totalChanges returns SQLite's count of the rows inserted, updated or
// deleted on db's connection since it was opened: db must have one
// connection (as River on SQLite has), which stays open.
func totalChanges(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, "SELECT total_changes()").Scan(&n)
	return n, err
}

// compareE2ESQLite: the embedded default (a queue and the durable ledger in
// one SQLite file) publishing then consuming cfg.e2eN messages, against
// River on SQLite (riversqlite, modernc) inserting and working
// cfg.riverLiteN jobs.
func compareE2ESQLite(ctx context.Context, cfg *config, rep *report) error {
	const comp = "e2e sqlite"
	rep.target(target{comp: comp, ratio: 15, absolute: 25000}) // issue 20
	dir, err := os.MkdirTemp("", "idem-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for round := 1; round <= cfg.rounds; round++ {
		idemSide := func() error {
			path := filepath.Join(dir, fmt.Sprintf("idem-%d.db", round))
			st, err := sqlitestore.Open(ctx, path, sqlitestore.WithLogger(cfg.log))
			if err != nil {
				return err
			}
			defer st.Close()
			q, err := newSQLiteQueue(ctx, cfg, st)
			if err != nil {
				return err
			}
			defer q.close()
			if round == 1 && q.name == memQueueName {
				rep.note("e2e sqlite: idem's queue is %s, not sqlqueue: the ledger is durable, the queue is not", q.name)
			}
			load := loadavg()
			r, err := idemE2E(ctx, cfg, st, q, cfg.e2eN, 0) // sqlitestore groups its writes itself: coalescing gains it nothing
			if err != nil {
				return fmt.Errorf("idem: %w", err)
			}
			stats := st.Stats()
			rep.add(sample{comp: comp, side: "idem", callers: cfg.consumers, round: round, rate: r.rate(), cpu: r.cpuPer(), load: load,
				what: q.name + " + sqlitestore ledger, queue.Consumer, no-op handler" + receiversNote(cfg),
				cost: fmt.Sprintf("rows n/a, %.2f commits", float64(stats.Commits)/float64(r.n)),
				note: fmt.Sprintf("%s; writer: %.1f writes a commit, %.3f syncs a message", r.note(),
					float64(stats.BatchedOps)/float64(max(stats.Batches, 1)), float64(stats.Syncs)/float64(r.n))})
			return nil
		}
		riverSide := func() error {
			db, err := openRiverSQLite(ctx, cfg, filepath.Join(dir, fmt.Sprintf("river-%d.db", round)))
			if err != nil {
				return err
			}
			defer db.Close()
			load := loadavg()
			changes0, err := totalChanges(ctx, db)
			if err != nil {
				return err
			}
			r, err := riverE2E(ctx, cfg, riversqlite.New(db), "", cfg.riverLiteN)
			if err != nil {
				return fmt.Errorf("river: %w", err)
			}
			changes1, err := totalChanges(ctx, db)
			if err != nil {
				return err
			}
			rep.add(sample{comp: comp, side: "river", callers: cfg.consumers, round: round, rate: r.rate(), cpu: r.cpuPer(), load: load,
				what: fmt.Sprintf("riversqlite (modernc), InsertMany then work, no-op worker, %d workers", cfg.riverWorkers), note: r.note(),
				cost: fmt.Sprintf("%.2f rows, commits n/a", float64(changes1-changes0)/float64(r.n))})
			return nil
		}
		if err := sides(round, idemSide, riverSide); err != nil {
			return err
		}
	}
	return nil
}

// compareE2EPG: the same on PostgreSQL: idem's queue and pgstore ledger in
// bench_idem against River (riverpgxv5) in bench_river and DBOS in
// bench_dbos, cfg.pgE2EN messages (jobs, workflows) each, in a database of
// their own (cfg.e2eDB). Each side's row writes and commits are read from
// the server's statistics around its run (see pgCounter).
func compareE2EPG(ctx context.Context, cfg *config, rep *report) error {
	const comp = "e2e pg"
	if cfg.pgURL == "" {
		return errors.New("set IDEM_TEST_POSTGRES (or -pg) to run the Postgres comparison")
	}
	rep.target(target{comp: comp, anchor: "river", ratio: 1.5}) // issue 20
	rep.target(target{comp: comp, anchor: "dbos", ratio: 20})
	ecfg := *cfg
	if cfg.e2eDB != "" {
		dbURL, err := benchDatabase(ctx, cfg.pgURL, cfg.e2eDB)
		if err != nil {
			return err
		}
		ecfg.pgURL = dbURL
		if !cfg.keep {
			defer dropBenchDatabase(context.WithoutCancel(ctx), cfg.pgURL, cfg.e2eDB)
		}
	} else {
		rep.note("e2e pg: -e2e-pg-db is empty: the commits counted are those of every client of -pg's database in the time of each side")
	}
	cfg = &ecfg
	if err := resetSchemas(ctx, cfg.pgURL, cfg.log); err != nil {
		return err
	}
	if err := dropSchema(ctx, cfg.pgURL, dbosSchema); err != nil {
		return err
	}
	if !cfg.keep {
		defer dropSchemas(context.WithoutCancel(ctx), cfg.pgURL)
		defer dropSchema(context.WithoutCancel(ctx), cfg.pgURL, dbosSchema)
	}
	if cfg.dbos {
		if err := migrateDBOS(ctx, cfg); err != nil {
			return err
		}
	}
	counter, err := newPGCounter(ctx, cfg.pgURL)
	if err != nil {
		return err
	}
	defer counter.close()
	for round := 1; round <= cfg.rounds; round++ {
		idemSide := func() error {
			var r e2eResult
			var qname, load string
			cost, err := countPG(ctx, counter, idemSchema, func() error {
				st, pool, err := idemStore(ctx, cfg, cfg.pgConns, fmt.Sprintf("e2e_%d", round))
				if err != nil {
					return err
				}
				defer pool.Close()
				defer st.Close()
				q, err := newPGQueue(ctx, cfg, pool, st, round)
				if err != nil {
					return err
				}
				defer q.close()
				qname = q.name
				load = loadavg()
				r, err = idemE2E(ctx, cfg, st, q, cfg.pgE2EN, cfg.coalesce)
				if err != nil {
					return fmt.Errorf("idem: %w", err)
				}
				return nil
			})
			if err != nil {
				return err
			}
			if round == 1 && qname == memQueueName {
				rep.note("e2e pg: idem's queue is %s, not sqlqueue: the ledger is durable, the queue is not", qname)
			}
			rep.add(sample{comp: comp, side: "idem", callers: cfg.consumers, round: round, rate: r.rate(), cpu: r.cpuPer(), load: load,
				what: fmt.Sprintf("%s + pgstore ledger, queue.Consumer, no-op handler, %d consumers", qname, cfg.consumers) + receiversNote(cfg),
				note: r.note(), cost: cost.perMessage(r.n)})
			return nil
		}
		riverSide := func() error {
			if err := truncate(ctx, cfg.pgURL, riverSchema+".river_job"); err != nil {
				return err
			}
			var r e2eResult
			var load string
			cost, err := countPG(ctx, counter, riverSchema, func() error {
				pool, err := newPool(ctx, cfg.pgURL, cfg.pgConns)
				if err != nil {
					return err
				}
				defer pool.Close()
				load = loadavg()
				r, err = riverE2E(ctx, cfg, riverpgxv5.New(pool), riverSchema, cfg.pgE2EN)
				if err != nil {
					return fmt.Errorf("river: %w", err)
				}
				return nil
			})
			if err != nil {
				return err
			}
			rep.add(sample{comp: comp, side: "river", callers: cfg.consumers, round: round, rate: r.rate(), cpu: r.cpuPer(), load: load,
				what: fmt.Sprintf("riverpgxv5, InsertMany then work, no-op worker, %d workers", cfg.riverWorkers),
				note: r.note(), cost: cost.perMessage(r.n)})
			return nil
		}
		dbosSide := func() error {
			if err := truncateDBOS(ctx, cfg); err != nil {
				return err
			}
			var r e2eResult
			var load string
			cost, err := countPG(ctx, counter, dbosSchema, func() error {
				pool, err := newPool(ctx, cfg.pgURL, cfg.pgConns)
				if err != nil {
					return err
				}
				defer pool.Close() // DBOS closes it too when it shuts down
				load = loadavg()
				r, err = dbosE2E(ctx, cfg, pool, counter, cfg.pgE2EN)
				return err
			})
			if err != nil {
				return err
			}
			rep.add(sample{comp: comp, side: "dbos", callers: cfg.consumers, round: round, rate: r.rate(), cpu: r.cpuPer(), load: load,
				what: fmt.Sprintf("DBOS queue of 1-step workflows, enqueued %d a transaction, worker concurrency %d, polling %s",
					publishBatch, cfg.dbosWorkers, cfg.dbosPoll),
				note: r.note(), cost: cost.perMessage(r.n)})
			return nil
		}
		runs := []func() error{idemSide, riverSide}
		if cfg.dbos {
			runs = append(runs, dbosSide)
		}
		if err := sides(round, runs...); err != nil {
			return err
		}
	}
	return nil
}
