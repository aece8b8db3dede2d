package jetstream

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/internal/tcprelay"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
)

// A published message arrives once with its body, attributes, dedup id,
// stream sequence as ID, receive count 1 and publish time; once acked it is
// gone from the work-queue stream and never delivered again.
func TestPublishReceiveAck(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{})
	p, src := f.publisher(t, js), f.source(t, js)
	before := time.Now().Add(-time.Second)
	var ids []string
	for i := range 3 {
		res := publish(t, p, queue.Outgoing{Body: []byte(fmt.Sprint("m", i)),
			Attributes: map[string]string{"Order": strconv.Itoa(i)}, DedupID: fmt.Sprint("d", i)})
		if res.Duplicate || res.ID == "" {
			t.Fatalf("publish %d: %+v", i, res)
		}
		ids = append(ids, res.ID)
	}
	var got []queue.Delivery
	for len(got) < 3 {
		got = append(got, receive(t, src, 3-len(got), 5*time.Second)...)
	}
	for i, d := range got {
		m := d.Message()
		if string(m.Body) != fmt.Sprint("m", i) || m.Attributes["Order"] != strconv.Itoa(i) ||
			m.DedupID != fmt.Sprint("d", i) || m.ID != ids[i] || m.ReceiveCount != 1 ||
			m.Published.Before(before) || m.Published.After(time.Now().Add(time.Second)) {
			t.Fatalf("delivery %d: %+v (ids %v)", i, m, ids)
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatalf("ack %d: %v", i, err)
		}
	}
	if err := got[0].Ack(context.Background()); !errors.Is(err, queue.ErrSettled) {
		t.Fatalf("second ack: %v, want ErrSettled", err)
	}
	if n := f.streamMsgs(t); n != 0 {
		t.Fatalf("stream holds %d messages after acking all", n)
	}
	receiveNone(t, src, 500*time.Millisecond)
	if src.Visibility() != 30*time.Second {
		t.Fatalf("Visibility %v, want the consumer's AckWait 30s", src.Visibility())
	}
}

// An unsettled message comes back after the ack wait with the same ID and
// a receive count of 2; Retry(0) brings it back at once with 3.
func TestRedeliveryAfterAckWaitAndRetry(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{ackWait: time.Second})
	p, src := f.publisher(t, js), f.source(t, js)
	if src.Visibility() != time.Second {
		t.Fatalf("Visibility %v, want 1s", src.Visibility())
	}
	res := publish(t, p, queue.Outgoing{Body: []byte("again")})
	d1 := receive(t, src, 1, 5*time.Second)[0]
	d2 := receive(t, src, 1, 10*time.Second)[0] // after the ack wait
	// At least 2: nats-server 2.9 may count a delivery its client never
	// handed out (a pull that timed out as the message arrived), so the
	// count can jump; it never stays or goes back (see Source.count).
	if d2.Message().ID != res.ID || d2.Message().ReceiveCount < 2 || string(d2.Message().Body) != "again" {
		t.Fatalf("redelivery: %+v, first %+v", d2.Message(), d1.Message())
	}
	if err := d2.Retry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	d3 := receive(t, src, 1, 5*time.Second)[0]
	if d3.Message().ReceiveCount <= d2.Message().ReceiveCount {
		t.Fatalf("after Retry(0): receive count %d, want more than the redelivery's %d", d3.Message().ReceiveCount, d2.Message().ReceiveCount)
	}
	if err := d3.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// The receive count a Source reports for a stream sequence never falls
// below one more than the count it last reported for it, whatever the
// server says (see Source.count), and a message done here is
// forgotten.
func TestReceiveCountNeverGoesBack(t *testing.T) {
	s := &Source{seen: map[uint64]seenEntry{}, pruneAt: minPrune, keepSeen: time.Hour}
	for _, c := range []struct {
		seq         uint64
		server, got int
	}{
		{7, 1, 1}, {7, 1, 2}, {7, 3, 3}, {7, 3, 4}, {8, 1, 1}, {7, 9, 9},
	} {
		if n := s.count(c.seq, c.server); n != c.got {
			t.Fatalf("count(%d, %d) = %d, want %d", c.seq, c.server, n, c.got)
		}
	}
	s.forget(7)
	if n := s.count(7, 1); n != 1 {
		t.Fatalf("after forget: count %d, want the server's 1", n)
	}
	// Old entries are pruned once the map is large.
	for i := range uint64(minPrune) {
		s.seen[1000+i] = seenEntry{count: 1, at: time.Now().Add(-2 * time.Hour)}
	}
	s.count(5, 1)
	if len(s.seen) > 3 {
		t.Fatalf("%d entries after pruning, want the 3 recent ones", len(s.seen))
	}
}

// Retry with a delay is not redelivered before the delay.
func TestRetryDelay(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{})
	p, src := f.publisher(t, js), f.source(t, js)
	publish(t, p, queue.Outgoing{Body: []byte("later")})
	d := receive(t, src, 1, 5*time.Second)[0]
	start := time.Now()
	if err := d.Retry(context.Background(), 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	d = receive(t, src, 1, 10*time.Second)[0]
	if waited := time.Since(start); waited < 1400*time.Millisecond {
		t.Fatalf("redelivered after %v, want at least the 1.5s delay", waited)
	}
	// At least 2, as in TestRedeliveryAfterAckWaitAndRetry: the receive
	// waits through pull requests of a second each, and nats-server 2.9
	// may count a delivery to one that expired as the delay ran out.
	if d.Message().ReceiveCount < 2 {
		t.Fatalf("receive count %d, want at least 2", d.Message().ReceiveCount)
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Extend (InProgress) keeps a message from coming back while it is being
// worked on for longer than the ack wait.
func TestExtendHoldsTheMessage(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{ackWait: 2 * time.Second})
	p, src := f.publisher(t, js), f.source(t, js)
	publish(t, p, queue.Outgoing{Body: []byte("slow")})
	d := receive(t, src, 1, 5*time.Second)[0]
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		tick := time.NewTicker(400 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- nil
				return
			case <-tick.C:
				if err := d.Extend(context.Background(), time.Hour); err != nil {
					done <- err
					return
				}
			}
		}
	}()
	receiveNone(t, src, 4*time.Second) // twice the ack wait
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("extend: %v", err)
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatalf("ack after extending: %v", err)
	}
	if err := d.Extend(context.Background(), time.Second); !errors.Is(err, queue.ErrSettled) {
		t.Fatalf("extend after ack: %v, want ErrSettled", err)
	}
}

// Once a delivery's ack wait has lapsed the server may hand the message to
// another receiver, and it answers +WPI the same either way (an empty
// reply, also after the message was acked or terminated), applying it to
// whichever delivery of the stream sequence it holds now. So a late Extend
// must fail with ErrAckWaitExpired, not report that the message is still
// held, and must not keep the message from the next holder's own ack wait:
// the redelivery, left alone, comes back when its ack wait lapses.
func TestExtendAfterAckWaitLapsedFails(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{ackWait: time.Second})
	p, src := f.publisher(t, js), f.source(t, js)
	publish(t, p, queue.Outgoing{Body: []byte("late")})
	d1 := receive(t, src, 1, 5*time.Second)[0]
	if err := d1.Extend(context.Background(), time.Minute); err != nil {
		t.Fatalf("extend in time: %v", err)
	}
	d2 := receive(t, src, 1, 10*time.Second)[0] // d1's ack wait lapsed
	if d2.Message().ID != d1.Message().ID {
		t.Fatalf("redelivery of %s, want %s", d2.Message().ID, d1.Message().ID)
	}
	// The stale holder keeps extending, as queue.Consumer does while its
	// handler runs; the redelivery is not extended by its holder.
	stop, done := make(chan struct{}), make(chan error, 1)
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- nil
				return
			case <-tick.C:
				if err := d1.Extend(context.Background(), time.Minute); !errors.Is(err, ErrAckWaitExpired) {
					done <- fmt.Errorf("Extend after the ack wait lapsed: %v, want ErrAckWaitExpired", err)
					return
				}
			}
		}
	}()
	d3 := receive(t, src, 1, 5*time.Second)
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(d3) != 1 || d3[0].Message().ID != d1.Message().ID || d3[0].Message().ReceiveCount <= d2.Message().ReceiveCount {
		t.Fatalf("third delivery: %d deliveries (first %+v), want message %s once more", len(d3), d3[0].Message(), d1.Message().ID)
	}
	if err := d3[0].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Acked through another delivery: the stale one still fails.
	if err := d1.Extend(context.Background(), time.Minute); !errors.Is(err, ErrAckWaitExpired) {
		t.Fatalf("Extend after the message was acked elsewhere: %v, want ErrAckWaitExpired", err)
	}
}

// DeadLetter puts a copy with the reason, the original headers and the
// original's stream sequence in the dead-letter stream, and the original
// is never delivered again.
func TestDeadLetterKeepsTheReason(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{ackWait: time.Second})
	p, src := f.publisher(t, js), f.source(t, js)
	res := publish(t, p, queue.Outgoing{Body: []byte("poison"), Attributes: map[string]string{"Tenant": "7"}})
	d := receive(t, src, 1, 5*time.Second)[0]
	if err := d.DeadLetter(context.Background(), "cannot parse order: unexpected EOF"); err != nil {
		t.Fatal(err)
	}
	if err := d.Ack(context.Background()); !errors.Is(err, queue.ErrSettled) {
		t.Fatalf("ack after dead-letter: %v, want ErrSettled", err)
	}
	dl := f.deadLetters(t)
	if len(dl) != 1 {
		t.Fatalf("dead-letter stream holds %d messages, want 1", len(dl))
	}
	h := dl[0].Header
	if string(dl[0].Data) != "poison" || h.Get(HeaderDeadLetterReason) != "cannot parse order: unexpected EOF" ||
		h.Get("Tenant") != "7" || h.Get(HeaderDeadLetterSequence) != res.ID || h.Get(HeaderDeadLetterStream) != f.name ||
		h.Get(HeaderDeadLetterDeliveries) != "1" {
		t.Fatalf("dead letter: %q %v", dl[0].Data, h)
	}
	receiveNone(t, src, 2500*time.Millisecond) // past the ack wait
	if n := f.streamMsgs(t); n != 0 {
		t.Fatalf("stream still holds %d messages", n)
	}
}

// A multi-line reason (errors.Join, an error quoting a response) keeps its
// line breaks visibly, as \n and \r, in the one-line reason header:
// written raw, NATS turned them into spaces.
func TestDeadLetterMultiLineReason(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{ackWait: time.Second})
	p, src := f.publisher(t, js), f.source(t, js)
	publish(t, p, queue.Outgoing{Body: []byte("poison"), Attributes: map[string]string{"Tenant": "7"}})
	d := receive(t, src, 1, 5*time.Second)[0]
	why := errors.Join(errors.New("decode order: unexpected EOF"), errors.New("response:\r\nNats-Msg-Id: forged")).Error()
	if err := d.DeadLetter(context.Background(), why); err != nil {
		t.Fatal(err)
	}
	dl := f.deadLetters(t)
	if len(dl) != 1 {
		t.Fatalf("dead-letter stream holds %d messages, want 1", len(dl))
	}
	h := dl[0].Header
	want := `decode order: unexpected EOF\nresponse:\r\nNats-Msg-Id: forged`
	if got := h.Get(HeaderDeadLetterReason); got != want {
		t.Errorf("reason on the dead letter = %q, want %q", got, want)
	}
	if h.Get("Tenant") != "7" || h.Get(njs.MsgIDHeader) == "forged" {
		t.Errorf("dead letter headers: %v", h)
	}
}

// Publish refuses, with ErrBadAttribute and sending nothing, an attribute
// a NATS header would change (a value with CR or LF, or with spaces or
// tabs at its ends) or refuse (a name with a space, a colon or a control
// character); before, the values went out flattened and trimmed and
// Publish returned nil. A name the server reads as an instruction
// (Nats-Msg-Id, Nats-Expected-*, ...) is refused too: it would set the
// dedup id or make the publish fail. Values it can carry (inner spaces and tabs, UTF-8,
// bytes that are not UTF-8, an empty value) arrive unchanged, with the
// name's case.
func TestPublishAttributesUnchangedOrRefused(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{})
	p, src := f.publisher(t, js), f.source(t, js)
	for _, attrs := range []map[string]string{
		{"crlf": "line1\r\nInjected: yes"},
		{"lf": "a\nb"},
		{"cr": "a\rb"},
		{"lead": "  padded"},
		{"trail": "padded\t"},
		{"a name": "v"},
		{"a:b": "v"},
		{"ctl\x01": "v"},
		{"": "v"},
		{"é": "v"},
		{"Nats-Msg-Id": "order-1"},
		{"nats-expected-last-sequence": "1"},
		{"NATS-TTL": "1s"},
	} {
		if _, err := p.Publish(context.Background(), queue.Outgoing{Body: []byte("x"), Attributes: attrs}); !errors.Is(err, ErrBadAttribute) {
			t.Errorf("Publish with attributes %q: %v, want ErrBadAttribute", attrs, err)
		}
	}
	if n := f.streamMsgs(t); n != 0 {
		t.Fatalf("stream holds %d messages after refused publishes, want 0", n)
	}

	attrs := map[string]string{
		"Mixed-Case": "v",
		"inner":      "a  b\tc",
		"utf8":       "é ü 😀",
		"bin":        string([]byte{'a', 0xff, 0x00, 'b'}),
		"empty":      "",
	}
	publish(t, p, queue.Outgoing{Body: []byte("x"), Attributes: attrs})
	d := receive(t, src, 1, 5*time.Second)[0]
	got := d.Message().Attributes
	for k, v := range attrs {
		if w, ok := got[k]; !ok || w != v {
			t.Errorf("attribute %q = %q (present %v), want %q", k, w, ok, v)
		}
	}
	if len(got) != len(attrs) {
		t.Errorf("attributes %q, want %q", got, attrs)
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A reason as long as an error quoting a whole response (here larger than
// the server's max payload) is cut to its first 4,096 bytes: the message
// is dead-lettered, not left to come back for ever.
func TestDeadLetterHugeReason(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{ackWait: time.Second})
	p, src := f.publisher(t, js), f.source(t, js)
	publish(t, p, queue.Outgoing{Body: []byte("poison")})
	d := receive(t, src, 1, 5*time.Second)[0]
	why := strings.Repeat("é", 1<<20)
	if err := d.DeadLetter(context.Background(), why); err != nil {
		t.Fatal(err)
	}
	dl := f.deadLetters(t)
	if len(dl) != 1 || dl[0].Header.Get(HeaderDeadLetterReason) != why[:4096] {
		t.Fatalf("dead letters %d, reason of %d bytes; want one, with the reason's first 4,096 bytes", len(dl), len(dl[0].Header.Get(HeaderDeadLetterReason)))
	}
}

// Retry decides MaxDeliver on the server's own delivery count, not on the
// ReceiveCount this Source raised past it (see Source.count): the
// server still redelivers a message it has delivered fewer times, so
// dead-lettering it would be early.
func TestRetryUnderMaxDeliverOnTheServersCount(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{ackWait: time.Second, maxDeliver: 2})
	p, src := f.publisher(t, js), f.source(t, js)
	pub := publish(t, p, queue.Outgoing{Body: []byte("raised")})
	seq, err := strconv.ParseUint(pub.ID, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	src.count(seq, 4) // as if this Source had handed it out 4 times
	d := receive(t, src, 1, 5*time.Second)[0]
	if d.Message().ReceiveCount != 5 {
		t.Fatalf("receive count %d, want 5 (raised past the server's 1)", d.Message().ReceiveCount)
	}
	if err := d.Retry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if dl := f.deadLetters(t); len(dl) != 0 {
		t.Fatalf("%d dead letters after a retry on the server's first delivery, want none", len(dl))
	}
	d = receive(t, src, 1, 5*time.Second)[0]
	if string(d.Message().Body) != "raised" {
		t.Fatalf("redelivered %q", d.Message().Body)
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// With MaxDeliver set, Retry on the last allowed delivery dead-letters the
// message (the server would never redeliver it), and a last delivery whose
// ack wait expires is dead-lettered from the server's advisory: in neither
// case does the message stay stranded in the stream.
func TestMaxDeliverEndsInDeadLetter(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{ackWait: time.Second, maxDeliver: 2})
	p, src := f.publisher(t, js), f.source(t, js)
	if src.MaxDeliver() != 2 {
		t.Fatalf("MaxDeliver %d", src.MaxDeliver())
	}
	publish(t, p, queue.Outgoing{Body: []byte("refused")})
	d := receive(t, src, 1, 5*time.Second)[0]
	if err := d.Retry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	d = receive(t, src, 1, 5*time.Second)[0]
	if d.Message().ReceiveCount != 2 {
		t.Fatalf("receive count %d", d.Message().ReceiveCount)
	}
	if err := d.Retry(context.Background(), 0); err != nil {
		t.Fatalf("retry on the last delivery: %v", err)
	}
	dl := f.deadLetters(t)
	if len(dl) != 1 || string(dl[0].Data) != "refused" ||
		dl[0].Header.Get(HeaderDeadLetterReason) != "jetstream: max deliveries (2) reached: retry refused" {
		t.Fatalf("dead letters after a refused retry: %d %v", len(dl), dl)
	}

	// The advisory path: deliveries left to expire.
	publish(t, p, queue.Outgoing{Body: []byte("abandoned")})
	receive(t, src, 1, 5*time.Second)
	receive(t, src, 1, 10*time.Second) // the second and last delivery, never settled
	deadline := time.Now().Add(20 * time.Second)
	for {
		dl = f.deadLetters(t)
		if len(dl) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("abandoned message not dead-lettered after max deliveries: %d dead letters", len(dl))
		}
		// The server notices the exhausted message (and sends the advisory)
		// when the consumer next pulls, as a running consumer does.
		receiveNone(t, src, 300*time.Millisecond)
	}
	if string(dl[1].Data) != "abandoned" || dl[1].Header.Get(HeaderDeadLetterReason) != "jetstream: max deliveries (2) reached" {
		t.Fatalf("advisory dead letter: %q %v", dl[1].Data, dl[1].Header)
	}
	for deadline := time.Now().Add(5 * time.Second); f.streamMsgs(t) != 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("work-queue stream still holds %d messages", f.streamMsgs(t))
		}
	}
}

// A second publish with the same DedupID inside the stream's window is
// reported as a duplicate with the first message's sequence, and only one
// message is delivered.
func TestPublishDedupReported(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{})
	p, src := f.publisher(t, js), f.source(t, js)
	first := publish(t, p, queue.Outgoing{Body: []byte("once"), DedupID: "order-42"})
	second := publish(t, p, queue.Outgoing{Body: []byte("once, again"), DedupID: "order-42"})
	if first.Duplicate || !second.Duplicate || second.ID != first.ID {
		t.Fatalf("first %+v, second %+v", first, second)
	}
	other := publish(t, p, queue.Outgoing{Body: []byte("other"), DedupID: "order-43"})
	if other.Duplicate || other.ID == first.ID {
		t.Fatalf("other %+v", other)
	}
	var bodies []string
	for len(bodies) < 2 {
		for _, d := range receive(t, src, 10, 5*time.Second) {
			bodies = append(bodies, string(d.Message().Body))
			if err := d.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	sort.Strings(bodies)
	if fmt.Sprint(bodies) != "[once other]" {
		t.Fatalf("delivered %v", bodies)
	}
	receiveNone(t, src, 500*time.Millisecond)
}

// A delayed publish is refused with ErrUnsupported (not delivered at
// once), a GroupID is ignored, and a source without a dead-letter
// destination is refused with ErrConfig.
func TestUnsupportedAndConfig(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{})
	p := f.publisher(t, js)
	if _, err := p.Publish(context.Background(), queue.Outgoing{Body: []byte("x"), Delay: time.Second}); !errors.Is(err, queue.ErrUnsupported) {
		t.Fatalf("Delay: %v", err)
	}
	if n := f.streamMsgs(t); n != 0 {
		t.Fatalf("refused publish stored %d messages", n)
	}
	publish(t, p, queue.Outgoing{Body: []byte("grouped"), GroupID: "g"})
	if d := receive(t, f.source(t, js), 1, 5*time.Second)[0]; d.Message().GroupID != "" || string(d.Message().Body) != "grouped" {
		t.Fatalf("grouped message: %+v, want the body and no group", d.Message())
	}
	if _, err := NewSource(context.Background(), js, SourceConfig{Stream: f.name, Consumer: f.consumer}); !errors.Is(err, ErrConfig) {
		t.Fatalf("no dead-letter subject: %v", err)
	}
	if _, err := NewPublisher(js, ""); !errors.Is(err, ErrConfig) {
		t.Fatalf("no subject: %v", err)
	}
}

// A connection that dies while an ack (or a retry, an extension, a
// dead-letter) is on its way gives an error, not a false settle, and the
// message is delivered again: nothing is lost. A publish over the dead
// connection fails too and stores nothing.
func TestConnectionLostMidAck(t *testing.T) {
	url := natsURL(t)
	_, js := connect(t, url)
	f := newFixture(t, js, fixtureOpts{ackWait: 2 * time.Second})
	publish(t, f.publisher(t, js), queue.Outgoing{Body: []byte("fragile")})

	target := url[len("nats://"):]
	px := tcprelay.New(t, target)
	_, pjs := connect(t, "nats://"+px.Addr(), nats.MaxReconnects(0))
	psrc := f.source(t, pjs)
	d := receive(t, psrc, 1, 5*time.Second)[0]
	ppub := f.publisher(t, pjs)

	px.Blackhole()
	for name, settle := range map[string]func(context.Context) error{
		"Ack":        d.Ack,
		"Retry":      func(ctx context.Context) error { return d.Retry(ctx, 0) },
		"Extend":     func(ctx context.Context) error { return d.Extend(ctx, time.Minute) },
		"DeadLetter": func(ctx context.Context) error { return d.DeadLetter(ctx, "x") },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := settle(ctx)
		cancel()
		if err == nil {
			t.Fatalf("%s over a dead connection returned nil", name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err := ppub.Publish(ctx, queue.Outgoing{Body: []byte("lost?")})
	cancel()
	if err == nil {
		t.Fatal("Publish over a dead connection returned nil")
	}

	src := f.source(t, js)
	again := receive(t, src, 1, 10*time.Second)[0]
	if string(again.Message().Body) != "fragile" || again.Message().ReceiveCount < 2 { // at least: nats-server 2.9 may count an expired pull's delivery
		t.Fatalf("redelivery: %+v", again.Message())
	}
	if err := again.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if dl := f.deadLetters(t); len(dl) != 0 {
		t.Fatalf("%d dead letters from a DeadLetter over a dead connection", len(dl))
	}
	receiveNone(t, src, 300*time.Millisecond) // the publish over the dead connection stored nothing
}

// Receive returns ctx's error, and no deliveries, when ctx ends first.
func TestReceiveHonoursContext(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{})
	src := f.source(t, js)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	ds, err := src.Receive(ctx, 5)
	if !errors.Is(err, context.DeadlineExceeded) || len(ds) != 0 {
		t.Fatalf("Receive on an empty stream: %d deliveries, err %v", len(ds), err)
	}
}

// A message published with JetStream's publish expectations (headers such
// as Nats-Expected-Stream and Nats-Expected-Last-Subject-Sequence, which the
// stream stores with the message) must still be dead-lettered: the copy is
// a different publish, to a different stream, and must not carry them.
func TestDeadLetterDropsPublishExpectations(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{ackWait: 5 * time.Second})
	src := f.source(t, js)
	m := nats.NewMsg(f.subject)
	m.Data = []byte("poison")
	m.Header.Set("Tenant", "7")
	if _, err := js.PublishMsg(context.Background(), m, njs.WithExpectStream(f.name), njs.WithExpectLastSequencePerSubject(0)); err != nil {
		t.Fatal(err)
	}
	d := receive(t, src, 1, 5*time.Second)[0]
	if err := d.DeadLetter(context.Background(), "permanent"); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	dl := f.deadLetters(t)
	if len(dl) != 1 {
		t.Fatalf("dead-letter stream holds %d messages, want 1", len(dl))
	}
	if h := dl[0].Header; h.Get("Tenant") != "7" || h.Get(HeaderDeadLetterReason) != "permanent" {
		t.Fatalf("dead letter headers: %v", h)
	}
	if n := f.streamMsgs(t); n != 0 {
		t.Fatalf("stream still holds %d messages", n)
	}
}

// A received message can be published again as it came: the server's
// Nats-* headers (Nats-Msg-Id is DedupID) are not among its attributes,
// which Publish would refuse.
func TestReceivedMessagePublishesAgain(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{})
	p, src := f.publisher(t, js), f.source(t, js)
	publish(t, p, queue.Outgoing{Body: []byte("x"), DedupID: "order-1", Attributes: map[string]string{"Tenant": "7"}})
	d := receive(t, src, 1, 5*time.Second)[0]
	m := d.Message()
	if len(m.Attributes) != 1 || m.Attributes["Tenant"] != "7" || m.DedupID != "order-1" {
		t.Fatalf("received attributes %q, dedup id %q; want only Tenant=7, dedup id order-1", m.Attributes, m.DedupID)
	}
	if _, err := p.Publish(context.Background(), queue.Outgoing{Body: m.Body, Attributes: m.Attributes}); err != nil {
		t.Fatalf("publishing the received message again: %v", err)
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A body over the server's max_payload is refused before anything is sent,
// with an error matching queue.ErrRefused: publishing it again cannot
// succeed, so a relay dead-letters it rather than retrying it forever.
func TestPublishOverMaxPayloadRefused(t *testing.T) {
	nc, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{})
	p := f.publisher(t, js)
	_, err := p.Publish(context.Background(), queue.Outgoing{Body: make([]byte, nc.MaxPayload()+1)})
	if !errors.Is(err, queue.ErrRefused) || !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("Publish of %d bytes over max_payload %d: %v, want an error matching queue.ErrRefused and nats.ErrMaxPayload", nc.MaxPayload()+1, nc.MaxPayload(), err)
	}
	if n := f.streamMsgs(t); n != 0 {
		t.Fatalf("stream holds %d messages after a refused publish, want 0", n)
	}
}

// A message that nearly fills the server's max_payload still dead-letters:
// its copy with a long reason does not fit, so the reason is cut to what
// fits (the consumer's log keeps it whole) rather than leaving the message
// to be redelivered for ever.
func TestDeadLetterNearMaxPayload(t *testing.T) {
	nc, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{ackWait: time.Second})
	p, src := f.publisher(t, js), f.source(t, js)
	body := make([]byte, nc.MaxPayload()-1024)
	publish(t, p, queue.Outgoing{Body: body, Attributes: map[string]string{"Tenant": "7"}})
	d := receive(t, src, 1, 5*time.Second)[0]
	why := "cannot parse order: " + strings.Repeat("x", 4000)
	if err := d.DeadLetter(context.Background(), why); err != nil {
		t.Fatalf("dead letter of a message near max_payload: %v", err)
	}
	dl := f.deadLetters(t)
	if len(dl) != 1 || len(dl[0].Data) != len(body) || dl[0].Header.Get("Tenant") != "7" {
		t.Fatalf("dead letters: %d", len(dl))
	}
	got := dl[0].Header.Get(HeaderDeadLetterReason)
	if !strings.HasPrefix(got, "cannot parse order: xxx") || len(got) >= len(why) || !strings.Contains(got, "cut") {
		t.Fatalf("reason on the dead letter (%d bytes) = %.80q..., want the reason's start, marked as cut", len(got), got)
	}
	receiveNone(t, src, 2500*time.Millisecond)
}

// A message within a few bytes of max_payload still dead-letters: the
// copy's dead-letter headers cannot fit, so it goes with what fits, the
// body always (the original, stored with it, fitted). Without it, the
// message came back after every ack wait, failing to dead-letter for ever.
func TestDeadLetterAtMaxPayload(t *testing.T) {
	nc, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{ackWait: time.Second})
	p, src := f.publisher(t, js), f.source(t, js)
	for _, room := range []int64{64, 1} {
		body := make([]byte, nc.MaxPayload()-room)
		publish(t, p, queue.Outgoing{Body: body})
		d := receive(t, src, 1, 5*time.Second)[0]
		if err := d.DeadLetter(context.Background(), "undecodable"); err != nil {
			t.Fatalf("dead letter of a message of %d bytes (max_payload %d): %v", len(body), nc.MaxPayload(), err)
		}
	}
	dl := f.deadLetters(t)
	if len(dl) != 2 || len(dl[0].Data) != int(nc.MaxPayload()-64) || len(dl[1].Data) != int(nc.MaxPayload()-1) {
		t.Fatalf("dead letters: %d, want the two bodies whole", len(dl))
	}
	receiveNone(t, src, 2500*time.Millisecond)
}
