package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// writer is the group commit: one goroutine that owns one connection, takes
// the operations queued by the store's callers (up to MaxBatch at a time),
// runs them in one IMMEDIATE transaction and answers each caller once the
// COMMIT (and its sync) is done. Callers that arrive while a batch commits
// queue up and share the next one, so the number of syncs per operation
// falls as concurrency grows.
type writer struct {
	s     *Store
	conn  *sql.Conn
	rw    *driverRW // set inside conn.Raw; used only by the loop
	queue chan *op

	closing chan struct{} // closed by close: stop taking batches
	done    chan struct{} // closed when the loop has returned
	exited  chan struct{} // closed when the connection is closed

	batch []*op
}

// op is one queued operation.
type op struct {
	ctx context.Context
	run func(w rw, now time.Time) error
	// atomic: run writes more than once and must be undone as a whole when
	// it fails (ClaimBatch).
	atomic bool
	err    error
	done   chan struct{}
}

// newWriter takes a connection from s.db for the writer and starts the
// loop on it.
func newWriter(ctx context.Context, s *Store) (*writer, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	w := &writer{
		s:       s,
		conn:    conn,
		queue:   make(chan *op, s.cfg.maxBatch),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
		exited:  make(chan struct{}),
		batch:   make([]*op, 0, s.cfg.maxBatch),
	}
	ready := make(chan error, 1)
	go func() {
		defer close(w.exited)
		started := false
		err := conn.Raw(func(dc any) error {
			rw, err := newDriverRW(dc)
			if err != nil {
				return err
			}
			w.rw = rw
			started = true
			ready <- nil
			w.loop()
			rw.close()
			return nil
		})
		if !started {
			ready <- err
			close(w.done)
		}
		conn.Close()
	}()
	if err := <-ready; err != nil {
		<-w.exited
		return nil, err
	}
	return w, nil
}

// do queues run and waits for its answer. If ctx ends first, do returns
// ctx's error; the operation may or may not have been committed.
func (w *writer) do(ctx context.Context, atomic bool, run func(w rw, now time.Time) error) error {
	if w.s.closed.Load() {
		return errClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	o := &op{ctx: ctx, run: run, atomic: atomic, done: make(chan struct{})}
	select {
	case w.queue <- o:
	case <-w.closing:
		return errClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
		return ctx.Err()
	case <-w.done:
		// The loop returned; it answered o unless o slipped into the queue
		// after the loop's last look.
		select {
		case <-o.done:
			return o.err
		default:
			return errClosed
		}
	}
}

func (o *op) finish(err error) {
	o.err = err
	close(o.done)
}

func (w *writer) loop() {
	defer close(w.done)
	for {
		select {
		case o := <-w.queue:
			w.batch = append(w.batch[:0], o)
		case <-w.closing:
			for {
				select {
				case o := <-w.queue:
					o.finish(errClosed)
				default:
					return
				}
			}
		}
	fill:
		for len(w.batch) < cap(w.batch) {
			select {
			case o := <-w.queue:
				w.batch = append(w.batch, o)
			default:
				break fill
			}
		}
		w.runBatch(w.batch)
		clear(w.batch)
	}
}

// close stops the loop and closes the writer's connection.
func (w *writer) close() error {
	close(w.closing)
	<-w.exited
	return nil
}

func (w *writer) begin() error {
	err := w.rw.begin()
	if err != nil && w.rw.rollback() == nil {
		// A transaction was left open (by a failed COMMIT or ROLLBACK) and
		// is ended now: try once more.
		err = w.rw.begin()
	}
	return err
}

// runBatch runs batch in one transaction and answers every operation. An
// operation whose outcome is an error (ErrLeaseLost, a corrupt record) is
// answered with it and does not disturb the others. A failed statement may
// have damaged the transaction, so the writer rolls back, answers that
// operation with the error and runs the others again in a new transaction.
// If the COMMIT fails, every operation of the batch gets the error: none is
// reported done unless it is durable.
func (w *writer) runBatch(batch []*op) {
	s := w.s
	for len(batch) > 0 {
		live := batch[:0]
		for _, o := range batch {
			if err := o.ctx.Err(); err != nil {
				o.finish(err) // the caller gave up before it ran
				continue
			}
			live = append(live, o)
		}
		batch = live
		if len(batch) == 0 {
			return
		}
		unlock := s.lockWrites(bg)
		err := w.begin()
		if err != nil {
			unlock()
			err = fmt.Errorf("sqlitestore: begin: %w", err)
			s.cfg.logger.Error("sqlitestore: write transaction failed to begin", "err", err, "ops", len(batch))
			for _, o := range batch {
				o.finish(err)
			}
			return
		}
		w.rw.wrote = false
		failed := -1
		for i, o := range batch {
			err := o.run(w.rw, s.now())
			o.err = err
			if err != nil && (o.atomic || isStmtError(err)) {
				failed = i
				break
			}
		}
		if failed >= 0 {
			w.rw.rollback()
			unlock()
			s.stats.rollbacks.Add(1)
			o := batch[failed]
			s.cfg.logger.Warn("sqlitestore: operation failed, batch rolled back and retried", "err", o.err, "ops", len(batch)-1)
			o.finish(o.err)
			batch = append(batch[:failed], batch[failed+1:]...)
			continue
		}
		err = w.rw.commit()
		if err != nil {
			w.rw.rollback()
		}
		unlock()
		if err != nil {
			err = fmt.Errorf("sqlitestore: commit: %w", err)
			s.cfg.logger.Error("sqlitestore: write transaction failed to commit", "err", err, "ops", len(batch))
			for _, o := range batch {
				o.finish(err)
			}
			return
		}
		s.stats.batches.Add(1)
		s.stats.batchedOps.Add(int64(len(batch)))
		if w.rw.wrote {
			s.stats.commits.Add(1)
			if s.cfg.sync == SyncFull {
				s.stats.syncs.Add(1) // the COMMIT synced the log
			}
		}
		for _, o := range batch {
			o.finish(o.err)
		}
		return
	}
}
