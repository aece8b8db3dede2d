package queuetest

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/cputime"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// Ledger names a ledger store for [BenchmarkConsume].
type Ledger struct {
	Name string
	// Open returns a fresh store (cleaned up with b).
	Open func(b *testing.B) store.Store
	// Options are given to the ledger made on the store (the benchmark
	// adds a quiet logger and a 10-minute retention first).
	Options []idem.Option
}

func (lg Ledger) ledger(b *testing.B) *idem.Ledger {
	opts := append([]idem.Option{idem.WithLogger(slog.New(slog.DiscardHandler)), idem.WithRetention(10 * time.Minute)}, lg.Options...)
	return idem.New(lg.Open(b), opts...)
}

func memoryLedger(b *testing.B) store.Store {
	s := memstore.New()
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkConsume measures the consume rate of b.N messages published
// beforehand into a queue newQueue makes, at 8 and 32 concurrent handlers
// (batches of 10, a handler that does nothing): "plain", a receive-and-ack
// loop of as many workers with no Consumer and no ledger; "ledger=memory",
// a queue.Consumer with the ledger in memory (the Consumer's own cost);
// "ledger=NAME" for each of ledgers; and "ledger-alone=NAME", that ledger's
// Do of new keys without a queue (its ceiling). Each reports msgs/s, the
// benchmark process's CPU-µs a message, and those of each server of
// [servers] running on this machine (the broker's own and the ledger's
// store's). The ledger's cost a message is then ledger=NAME less plain,
// on the client and on each server; the broker's is plain's. Other work
// on the machine using the same servers counts too: measure on a quiet
// one.
func BenchmarkConsume(b *testing.B, newQueue func(*testing.B) (queue.Source, queue.Publisher), ledgers ...Ledger) {
	for _, conc := range []int{8, 32} {
		b.Run(fmt.Sprintf("c=%d", conc), func(b *testing.B) {
			b.Run("plain", func(b *testing.B) { benchConsume(b, newQueue, nil, conc) })
			for _, lg := range append([]Ledger{{Name: "memory", Open: memoryLedger}}, ledgers...) {
				b.Run("ledger="+lg.Name, func(b *testing.B) { benchConsume(b, newQueue, lg.ledger(b), conc) })
			}
			// Each ledger alone (Do of a new key with a no-op fn, conc
			// callers, no queue): the ceiling of ledger=NAME.
			for _, lg := range ledgers {
				b.Run("ledger-alone="+lg.Name, func(b *testing.B) {
					l := lg.ledger(b)
					var next atomic.Int64
					var wg sync.WaitGroup
					b.ResetTimer()
					start, cpu := time.Now(), startCPU()
					for range conc {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
								//idem:allow nondetkey each benchmark iteration is a new operation
								if _, err := l.Do(context.Background(), idem.Key("bench", strconv.FormatInt(i, 10)),
									func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
									b.Error(err)
									return
								}
							}
						}()
					}
					wg.Wait()
					b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
					cpu.report(b, b.N)
				})
			}
		})
	}
}

// ackCounter counts acks, and closes done at the target.
type ackCounter struct {
	queue.Source
	n      atomic.Int64
	target int64
	done   chan struct{}
}

func (s *ackCounter) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	ds, err := s.Source.Receive(ctx, max)
	for i, d := range ds {
		ds[i] = countedDelivery{d, s}
	}
	return ds, err
}

type countedDelivery struct {
	queue.Delivery
	s *ackCounter
}

func (d countedDelivery) Ack(ctx context.Context) error {
	err := d.Delivery.Ack(ctx)
	if err == nil && d.s.n.Add(1) == d.s.target {
		close(d.s.done)
	}
	return err
}

// benchConsume publishes b.N messages (untimed), then times consuming them:
// through a queue.Consumer with the ledger l, or, when l is nil,
// with a plain loop of conc workers that receive up to 10 and ack each.
func benchConsume(b *testing.B, newQueue func(*testing.B) (queue.Source, queue.Publisher), l *idem.Ledger, conc int) {
	n := b.N
	src, pub := newQueue(b)
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var wg sync.WaitGroup
	var pubErr atomic.Value
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				if _, err := pub.Publish(context.Background(), queue.Outgoing{Body: fmt.Appendf(nil, "order-%s-%d x", run, i)}); err != nil {
					pubErr.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := pubErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	counter := &ackCounter{Source: src, target: int64(n), done: make(chan struct{})}
	quiet := slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stopped sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu := time.Now(), startCPU()
	if l == nil {
		for range conc {
			stopped.Add(1)
			go func() {
				defer stopped.Done()
				for ctx.Err() == nil {
					ds, err := counter.Receive(ctx, 10)
					if err != nil && ctx.Err() == nil {
						// A broken broker must fail the run, not spin it.
						b.Error(err)
						cancel()
						return
					}
					for _, d := range ds {
						if err := d.Ack(context.Background()); err != nil {
							b.Error(err)
						}
					}
				}
			}()
		}
	} else {
		c, err := queue.NewConsumer(counter, l,
			func(m queue.Message) (idem.OperationKey, error) {
				id, _, _ := strings.Cut(string(m.Body), " ")
				return idem.Key("bench", id), nil
			},
			func(context.Context, queue.Message) ([]byte, error) { return nil, nil },
			queue.WithConcurrency(conc), queue.WithBatchSize(10), queue.WithHandlerTimeout(10*time.Second), queue.WithLogger(quiet))
		if err != nil {
			b.Fatal(err)
		}
		stopped.Add(1)
		go func() {
			defer stopped.Done()
			if err := c.Run(ctx); err != nil {
				b.Error(err)
			}
		}()
	}
	select {
	case <-counter.done:
	case <-ctx.Done(): // a receive failed (its error is reported)
		stopped.Wait()
		return
	case <-time.After(10 * time.Minute):
		b.Fatalf("only %d of %d messages acked after 10 minutes", counter.n.Load(), n)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cpu.report(b, n)
	cancel()
	stopped.Wait()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
}

// servers are the server processes whose CPU the consume benchmarks
// report, by command name, with the metric's prefix.
var servers = [...]struct{ comm, metric string }{
	{"redis-server", "redis"},
	{"nats-server", "nats"},
	{"beam.smp", "rabbitmq"},
}

// cpuReading is the CPU time, at a benchmark's start, of this process
// and of each server of servers found running (-1 when not found).
type cpuReading struct {
	self    time.Duration
	servers [len(servers)]time.Duration
}

func startCPU() cpuReading {
	r := cpuReading{self: cputime.Self()}
	for i, s := range servers {
		r.servers[i] = -1
		if d, ok := cputime.Of(s.comm); ok {
			r.servers[i] = d
		}
	}
	return r
}

// report reports the CPU-µs a message since r, of this process and of
// each server found at r's reading and now.
func (r cpuReading) report(b *testing.B, msgs int) {
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(msgs) }
	b.ReportMetric(per(cputime.Self()-r.self), "CPU-µs/msg")
	for i, s := range servers {
		if d, ok := cputime.Of(s.comm); ok && r.servers[i] >= 0 {
			b.ReportMetric(per(d-r.servers[i]), s.metric+"-CPU-µs/msg")
		}
	}
}
