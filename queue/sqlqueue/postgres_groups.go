package sqlqueue

import (
	"context"
	"sync"
	"time"
)

const (
	// ackFlights is how many grouped statements (acks, or the fused
	// path's completions) may be on their way at once.
	ackFlights = 2
	// ackGroup bounds the calls of one group.
	ackGroup = 512
	// ackTimeout bounds one group's statements (its calls wait for them
	// whatever their own contexts say: others share them).
	ackTimeout = 30 * time.Second
)

// pgCall is one call waiting in a pgGroups: its request, and its answer
// once done is closed.
type pgCall[R any] struct {
	req  R
	err  error
	done chan struct{}
}

// pgGroups runs calls in groups on PostgreSQL: calls made while a group is
// on its way wait for the next one, so many handlers share one statement
// and one commit (each commit waits for a WAL flush). A lone call goes at
// once. The PostgreSQL handle's acks and the fused path's completions
// (with their acks) are grouped so; run does a group's work and answers
// each of its calls (sets err, closes done).
type pgGroups[R any] struct {
	run     func(batch []*pgCall[R])
	queue   chan *pgCall[R]
	stop    chan struct{}
	stopped sync.WaitGroup
	exited  chan struct{} // closed when the loops have returned
}

// newPGGroups starts ackFlights loops that call run.
func newPGGroups[R any](run func(batch []*pgCall[R])) *pgGroups[R] {
	g := &pgGroups[R]{run: run, queue: make(chan *pgCall[R], ackGroup), stop: make(chan struct{}), exited: make(chan struct{})}
	for range ackFlights {
		g.stopped.Add(1)
		go g.loop()
	}
	return g
}

// call queues req and waits for its answer. If ctx ends first it returns
// ctx's error, and the call may still happen.
func (g *pgGroups[R]) call(ctx context.Context, req R) error {
	k := &pgCall[R]{req: req, done: make(chan struct{})}
	select {
	case g.queue <- k:
	case <-g.stop:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-k.done:
		return k.err
	case <-ctx.Done():
		return ctx.Err()
	case <-g.exited:
		select {
		case <-k.done:
			return k.err
		default:
			return ErrClosed // queued as the loops stopped
		}
	}
}

func (g *pgGroups[R]) loop() {
	defer g.stopped.Done()
	batch := make([]*pgCall[R], 0, ackGroup)
	for {
		select {
		case k := <-g.queue:
			batch = append(batch[:0], k)
		case <-g.stop:
			g.drain()
			return
		}
	more:
		for len(batch) < ackGroup {
			select {
			case k := <-g.queue:
				batch = append(batch, k)
			default:
				break more
			}
		}
		g.run(batch)
	}
}

// drain answers the calls still queued when the handle closes.
func (g *pgGroups[R]) drain() {
	for {
		select {
		case k := <-g.queue:
			k.err = ErrClosed
			close(k.done)
		default:
			return
		}
	}
}

// close stops the loops: a group a loop has taken is finished (bounded by
// ackTimeout), the others get ErrClosed.
func (g *pgGroups[R]) close() {
	close(g.stop)
	g.stopped.Wait()
	close(g.exited)
}
