package jetstream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/queue"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
)

func natsURL(tb testing.TB) string {
	tb.Helper()
	return testenv.Require(tb, testenv.NATS, "the JetStream suite")
}

func connect(tb testing.TB, url string, opts ...nats.Option) (*nats.Conn, njs.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		tb.Fatalf("connect %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	js, err := njs.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return nc, js
}

func uniq() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// fixture is one test's stream, dead-letter stream and durable consumer.
type fixture struct {
	js       njs.JetStream
	name     string // stream name; the dead-letter stream is name+"_DL"
	subject  string
	dlSubj   string
	consumer string
}

type fixtureOpts struct {
	ackWait    time.Duration
	maxDeliver int
}

// newFixture creates a work-queue stream, a dead-letter stream with a
// dedup window and a durable pull consumer, all deleted at cleanup.
func newFixture(tb testing.TB, js njs.JetStream, o fixtureOpts) *fixture {
	tb.Helper()
	ctx := context.Background()
	id := uniq()
	f := &fixture{js: js, name: "IDEMT_" + strings.ToUpper(id), subject: "idemt." + id + ".q",
		dlSubj: "idemt." + id + ".dl", consumer: "worker"}
	if _, err := js.CreateStream(ctx, njs.StreamConfig{Name: f.name, Subjects: []string{f.subject},
		Retention: njs.WorkQueuePolicy, Storage: njs.MemoryStorage, Duplicates: time.Minute}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = js.DeleteStream(context.Background(), f.name) })
	if _, err := js.CreateStream(ctx, njs.StreamConfig{Name: f.name + "_DL", Subjects: []string{f.dlSubj},
		Storage: njs.MemoryStorage, Duplicates: time.Minute}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = js.DeleteStream(context.Background(), f.name+"_DL") })
	if o.ackWait == 0 {
		o.ackWait = 30 * time.Second
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, f.name, njs.ConsumerConfig{Durable: f.consumer,
		AckPolicy: njs.AckExplicitPolicy, AckWait: o.ackWait, MaxDeliver: o.maxDeliver}); err != nil {
		tb.Fatal(err)
	}
	return f
}

func (f *fixture) source(tb testing.TB, js njs.JetStream) *Source {
	tb.Helper()
	s, err := NewSource(context.Background(), js, SourceConfig{Stream: f.name, Consumer: f.consumer,
		DeadLetterSubject: f.dlSubj, PollWait: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

func (f *fixture) publisher(tb testing.TB, js njs.JetStream) *Publisher {
	tb.Helper()
	p, err := NewPublisher(js, f.subject)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// deadLetters reads everything in the dead-letter stream.
func (f *fixture) deadLetters(tb testing.TB) []*njs.RawStreamMsg {
	tb.Helper()
	ctx := context.Background()
	st, err := f.js.Stream(ctx, f.name+"_DL")
	if err != nil {
		tb.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	var out []*njs.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		out = append(out, m)
	}
	return out
}

// streamMsgs is how many messages the work-queue stream still holds.
func (f *fixture) streamMsgs(tb testing.TB) uint64 {
	tb.Helper()
	st, err := f.js.Stream(context.Background(), f.name)
	if err != nil {
		tb.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return info.State.Msgs
}

func publish(tb testing.TB, p queue.Publisher, m queue.Outgoing) queue.Published {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := p.Publish(ctx, m)
	if err != nil {
		tb.Fatalf("publish: %v", err)
	}
	return res
}

// receive waits up to d for at least one delivery.
func receive(tb testing.TB, s queue.Source, max int, d time.Duration) []queue.Delivery {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	ds, err := s.Receive(ctx, max)
	if err != nil {
		tb.Fatalf("receive: %v", err)
	}
	return ds
}

// receiveNone asserts that nothing is delivered within d.
func receiveNone(tb testing.TB, s queue.Source, d time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	ds, err := s.Receive(ctx, 10)
	if len(ds) > 0 {
		tb.Fatalf("received %d deliveries (first %q, count %d), want none", len(ds), ds[0].Message().Body, ds[0].Message().ReceiveCount)
	}
	if err == nil {
		tb.Fatal("Receive returned no deliveries and no error")
	}
}
