package sqlqueue_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/tcprelay"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/queuetest"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgRelayPool returns a pool whose connections go through a tcprelay to
// IDEM_TEST_POSTGRES, and the relay.
func pgRelayPool(t *testing.T) (*pgxpool.Pool, *tcprelay.Relay) {
	t.Helper()
	u := os.Getenv("IDEM_TEST_POSTGRES")
	if u == "" {
		t.Skip(pgSkip)
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	px := tcprelay.New(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, err := net.SplitHostPort(px.Addr())
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(p), nil
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	// No liveness ping when a connection is taken from the pool after a
	// second idle (pgxpool's default): on a loaded machine the ping came
	// between DropReplies and the call under test, lost the answer in its
	// place, and the pool went on with a fresh connection.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, px
}

// pgSettleOps are the calls on a delivery cut mid-call.
var pgSettleOps = queuetest.SettleOps(time.Second)

// pgCutFixture is a queue opened directly and the same queue opened
// through a relay.
type pgCutFixture struct {
	direct, relayed *sqlqueue.PostgresQueue
	px              *tcprelay.Relay
}

func newPGCutFixture(t *testing.T) pgCutFixture {
	t.Helper()
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	direct := pgQueue(t, openPostgres(t, pool, schema), "orders", sqlqueue.WithVisibility(time.Second))
	rpool, px := pgRelayPool(t)
	relayed := pgQueue(t, openPostgres(t, rpool, schema), "orders", sqlqueue.WithVisibility(time.Second))
	// Closed first: pgx's cancel requests and goodbyes through a silent
	// relay would hold up the closing of the handle and the pool.
	t.Cleanup(px.Close)
	return pgCutFixture{direct: direct, relayed: relayed, px: px}
}

// The connection to PostgreSQL is cut while a settle (or an extension) is
// on its way, before the server saw the statement: the call returns an
// error, and the message is as it was: it comes back when its visibility
// lapses (receive count 2), not dead-lettered, not hidden longer.
func TestPostgresCutMidSettle(t *testing.T) {
	for _, op := range pgSettleOps {
		t.Run(op.Name, func(t *testing.T) {
			f := newPGCutFixture(t)
			publish(t, f.direct, queue.Outgoing{Body: []byte("fragile")})
			d := receive(t, f.relayed, 1)[0]

			f.px.Blackhole()
			res := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				res <- op.Call(ctx, d)
			}()
			time.Sleep(50 * time.Millisecond)
			f.px.Cut()
			if err := <-res; err == nil {
				t.Fatalf("%s cut mid-call returned nil", op.Name)
			}

			again := receive(t, f.direct, 1)
			if len(again) != 1 || string(again[0].Message().Body) != "fragile" || again[0].Message().ReceiveCount != 2 {
				t.Fatalf("redelivery: %q", bodies(again))
			}
			if err := again[0].Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
			if dl, err := f.direct.DeadLetters(context.Background(), 10); err != nil || len(dl) != 0 {
				t.Fatalf("dead letters %d, %v; want none", len(dl), err)
			}
		})
	}
}

// The server's answer to a settle is lost and the connection closes: the
// statement may have committed, but the caller cannot know, so the call
// returns an error, never nil. (Statements that NOTIFY are left out: the
// listener's notification may be the answer the relay drops.) The relay
// drops the answer to the settle's own request (DropReplies): the relayed
// handle's listener may get the publish's notification meanwhile, and on
// a loaded machine DropAnswers could drop that instead.
func TestPostgresSettleAnswerCut(t *testing.T) {
	for _, op := range pgSettleOps {
		if op.Name != "Ack" && op.Name != "Extend" {
			continue // the statement NOTIFYs: its answer races the listener's
		}
		t.Run(op.Name, func(t *testing.T) {
			f := newPGCutFixture(t)
			publish(t, f.direct, queue.Outgoing{Body: []byte("fragile")})
			d := receive(t, f.relayed, 1)[0]
			f.px.DropReplies(1)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := op.Call(ctx, d); err == nil {
				t.Fatalf("%s whose answer was cut returned nil", op.Name)
			}
		})
	}
}

// A publish cut before the server saw it returns an error and stores
// nothing; one whose answer is cut returns an error too (it may be
// stored: a retry with the same DedupID is then dropped as a duplicate).
func TestPostgresCutMidPublish(t *testing.T) {
	t.Run("before", func(t *testing.T) {
		f := newPGCutFixture(t)
		f.px.Blackhole()
		res := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := f.relayed.Publish(ctx, queue.Outgoing{Body: []byte("lost?")})
			res <- err
		}()
		time.Sleep(50 * time.Millisecond)
		f.px.Cut()
		if err := <-res; err == nil {
			t.Fatal("Publish cut mid-call returned nil")
		}
		receiveNone(t, f.direct)
	})
	t.Run("answer", func(t *testing.T) {
		f := newPGCutFixture(t)
		// A first call over the relay, so that its connection is open and
		// the dropped answer is the publish's own. Not a publish: its
		// NOTIFY goes out after it returns, from the handle's notifier,
		// and on a loaded machine it came after DropReplies and lost its
		// answer instead (the publish then returned nil).
		if _, err := f.relayed.Stats(context.Background()); err != nil {
			t.Fatal(err)
		}
		f.px.DropReplies(1)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := f.relayed.Publish(ctx, queue.Outgoing{Body: []byte("maybe")}); err == nil {
			t.Fatal("Publish whose answer was cut returned nil")
		}
	})
}
