package queuetest

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
)

// EnvLoadMessages, when set to a number, overrides every adapter's
// Features.LoadMessages: adapters may run a smaller load check to keep a
// developer's race run short, and .ci/run sets it to the full 100,000.
const EnvLoadMessages = "IDEM_TEST_LOAD_MESSAGES"

// testLoad publishes LoadMessages messages, a tenth of them duplicates of
// earlier keys, and consumes them with handlers that fail at random (before
// their effect, as a retryable error): every distinct key's effect happens
// exactly once, no message is lost, none is left in flight.
func testLoad(t *testing.T, h Harness) {
	n := h.Features.LoadMessages
	if n <= 0 {
		n = 100_000
	}
	if v, err := strconv.Atoi(os.Getenv(EnvLoadMessages)); err == nil && v > 0 {
		n = v // CI runs every adapter at the full size
	}
	if testing.Short() {
		n = min(n, 5_000)
	}
	distinct := n - n/10
	src, pub := h.New(t, 30*time.Second)
	obs := observe(src)
	var fx effects
	var failures atomic.Int64
	quiet := slog.New(slog.DiscardHandler) // two lines per message would measure the logger
	l := idem.New(h.store(t), idem.WithLogger(quiet))
	c, err := queue.NewConsumer(obs, l, bodyKey, func(_ context.Context, m queue.Message) ([]byte, error) {
		if rand.N(20) == 0 { // 5%: the provider times out before sending
			failures.Add(1)
			return nil, errFlaky
		}
		k, _ := bodyKey(m)
		fx.do(k.String())
		return nil, nil
	}, queue.WithConcurrency(16), queue.WithBatchSize(10), queue.WithMaxReceives(0),
		queue.WithBackoff(time.Millisecond, 20*time.Millisecond), queue.WithBusyDelay(20*time.Millisecond),
		queue.WithHandlerTimeout(10*time.Second), queue.WithLogger(quiet))
	if err != nil {
		t.Fatalf("NewConsumer: %v", err)
	}

	// Publish from 8 goroutines; message i < distinct is key i, the rest
	// repeat a random earlier key.
	start := time.Now()
	var wg sync.WaitGroup
	var pubErr atomic.Value
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				k := i
				if i >= distinct {
					k = rand.N(distinct)
				}
				if _, err := pub.Publish(context.Background(), queue.Outgoing{Body: fmt.Appendf(nil, "order-%d load", k)}); err != nil {
					pubErr.Store(err)
					return
				}
			}
		}()
	}
	stop := runConsumer(t, c)
	wg.Wait()
	if err, _ := pubErr.Load().(error); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	published := time.Since(start)
	// At least 50 messages a second: an emulator under the race detector
	// is slow, a stall is not.
	deadline := max(10*time.Minute, time.Duration(n)*20*time.Millisecond)
	eventually(t, deadline, "the load did not drain", func() bool {
		keys, _ := fx.distinct()
		return keys == distinct && obs.count("ack") == n
	})
	stop()
	took := time.Since(start)
	keys, total := fx.distinct()
	if keys != distinct || total != distinct {
		t.Fatalf("%d messages (%d distinct keys): effects on %d keys, %d in all; want %d and %d", n, distinct, keys, total, distinct, distinct)
	}
	if dl := obs.count("dead-letter"); dl != 0 {
		t.Fatalf("%d messages dead-lettered, want 0", dl)
	}
	receiveNone(t, src, 500*time.Millisecond, "after the load drained")
	t.Logf("%d messages (%d duplicates, %d handler failures retried): published in %v, all done in %v (%.0f msg/s end to end)",
		n, n-distinct, failures.Load(), published.Round(time.Millisecond), took.Round(time.Millisecond), float64(n)/took.Seconds())
}
