package amqpqueue

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
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store/memstore"
	"github.com/idemkit/idem/store/redisstore"
)

// BenchmarkConsume measures the consume rate of b.N messages published
// beforehand (to a classic or a quorum queue, prefetch 32), through
// queue.Consumer (concurrency 8 and 32, batches of 10, a handler that does
// nothing) with the ledger on Redis, the same consumer with the ledger in
// memory (the consumer's own cost, the ledger nearly free), and a plain
// receive-and-ack loop of as many workers on the same Source (no consumer, no
// ledger). Target of the issue: the Redis ledger costs at most 30% of the
// rate without it.
//
//	IDEM_TEST_AMQP=amqp://guest:guest@127.0.0.1:5672/ IDEM_TEST_REDIS=redis://127.0.0.1:6379/0 \
//		go test -run '^$' -bench Consume -benchtime 5000x -count 3 ./queue/amqpqueue/
func BenchmarkConsume(b *testing.B) {
	amqpURL(b)
	for _, quorum := range []bool{false, true} {
		name := "classic"
		if quorum {
			name = "quorum"
		}
		b.Run(name, func(b *testing.B) {
			runConsumeBenchmarks(b, func(b *testing.B) (queue.Source, queue.Publisher) {
				f := newFixture(b, quorum)
				return f.source(b, f.conn), f.publisher(b, f.conn)
			})
		})
	}
}

func runConsumeBenchmarks(b *testing.B, newQueue func(*testing.B) (queue.Source, queue.Publisher)) {
	for _, conc := range []int{8, 32} {
		b.Run(fmt.Sprintf("c=%d", conc), func(b *testing.B) {
			b.Run("plain", func(b *testing.B) { benchConsume(b, newQueue, nil, conc) })
			b.Run("ledger=memory", func(b *testing.B) {
				s := memstore.New()
				b.Cleanup(func() { s.Close() })
				benchConsume(b, newQueue, s, conc)
			})
			b.Run("ledger=redis", func(b *testing.B) {
				u := testenv.Require(b, testenv.Redis, "the benchmark with the ledger on Redis")
				s := openRedis(b, u)
				benchConsume(b, newQueue, s, conc)
			})
			// The Redis ledger alone (Do of a new key with a no-op fn, conc
			// callers, no queue): the ceiling of ledger=redis.
			b.Run("ledger-alone=redis", func(b *testing.B) {
				u := testenv.Require(b, testenv.Redis, "the benchmark with the ledger on Redis")
				s := openRedis(b, u)
				l := idem.New(s, idem.WithLogger(slog.New(slog.DiscardHandler)), idem.WithRetention(10*time.Minute))
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for range conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
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
			})
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
// through a queue.Consumer with a ledger on store, or, when store is nil,
// with a plain loop of conc workers that receive up to 10 and ack each.
func benchConsume(b *testing.B, newQueue func(*testing.B) (queue.Source, queue.Publisher), store idem.Store, conc int) {
	n := b.N
	src, pub := newQueue(b)
	run := uniq()
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
	start := time.Now()
	if store == nil {
		for range conc {
			stopped.Add(1)
			go func() {
				defer stopped.Done()
				for ctx.Err() == nil {
					ds, _ := counter.Receive(ctx, 10)
					for _, d := range ds {
						if err := d.Ack(context.Background()); err != nil {
							b.Error(err)
						}
					}
				}
			}()
		}
	} else {
		l := idem.New(store, idem.WithLogger(quiet), idem.WithRetention(10*time.Minute))
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
	case <-time.After(10 * time.Minute):
		b.Fatalf("only %d of %d messages acked after 10 minutes", counter.n.Load(), n)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	stopped.Wait()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
}

// openRedis opens a redisstore under a prefix of its own, whose keys are
// deleted at cleanup.
func openRedis(b *testing.B, url string) *redisstore.Store {
	s, err := redisstore.Open(context.Background(), url, redisstore.WithPrefix("idemt:bench:"+uniq()+":"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx := context.Background()
		c := s.Client()
		for cursor := uint64(0); ; {
			keys, next, err := c.Scan(ctx, cursor, s.Prefix()+"*", 1000).Result()
			if err != nil {
				b.Logf("cleanup of %s*: %v", s.Prefix(), err)
				break
			}
			if len(keys) > 0 {
				c.Unlink(ctx, keys...)
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
		s.Close()
	})
	return s
}
