package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue/jetstream"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
)

// TestJetStreamTarget: relaying to JetStream, a relay that dies between
// the PubAck and the outbox ack leaves the messages to a restarted relay,
// whose republishes carry the same Nats-Msg-Id: the stream's duplicate
// window drops them (PubAck Duplicate), and the stream holds one copy of
// each, with the key in the Idem-Key header.
func TestJetStreamTarget(t *testing.T) {
	url := testenv.Require(t, testenv.NATS, "the JetStream outbox test")
	ctx := context.Background()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := njs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	name, subject := "OUTBOXT_"+strings.ToUpper(id), "outboxt."+id
	stream, err := js.CreateStream(ctx, njs.StreamConfig{Name: name, Subjects: []string{subject},
		Storage: njs.MemoryStorage, Duplicates: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	pub, err := jetstream.NewPublisher(js, subject)
	if err != nil {
		t.Fatal(err)
	}

	const vis = time.Second
	a := openApp(t, "", vis)
	a.placeOrder(t, "o1", true)
	a.placeOrder(t, "o2", true, withoutKey)
	doomed, err := outbox.NewRelay(crashingSource{a.outbox}, pub, outbox.WithPublishTimeout(vis/2), outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := doomed.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	var log testlog.Buffer
	r, err := outbox.NewRelay(a.outbox, pub, outbox.WithPublishTimeout(vis/2), outbox.WithLogger(debugLog(&log)))
	if err != nil {
		t.Fatal(err)
	}
	if n := drainUntilEmpty(t, r, a.outbox); n != 2 {
		t.Fatalf("the restarted relay relayed %d, want 2", n)
	}
	if got := strings.Count(log.String(), "duplicate=true"); got != 2 {
		t.Fatalf("%d duplicates logged, want 2 (Nats-Msg-Id):\n%s", got, log.String())
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("the stream holds %d messages, want 2", info.State.Msgs)
	}
	ids := map[string]string{} // body → Nats-Msg-Id
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		ids[string(m.Data)] = m.Header.Get(nats.MsgIdHdr)
		if string(m.Data) == "order placed o1" && m.Header.Get(outbox.KeyAttribute) != "order-placed:o1" {
			t.Fatalf("o1's %s header is %q, want its key", outbox.KeyAttribute, m.Header.Get(outbox.KeyAttribute))
		}
	}
	if ids["order placed o1"] != "order-placed:o1" || !strings.HasPrefix(ids["order placed o2"], outbox.DefaultDedupPrefix) {
		t.Fatalf("Nats-Msg-Id by body: %v; want the key for o1 and a derived id for o2", ids)
	}
}
