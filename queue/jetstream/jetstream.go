package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/internal/reason"
	"github.com/idemkit/idem/queue/internal/visibility"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
)

// Header names the adapter writes on dead-lettered copies.
const (
	// HeaderDeadLetterReason holds the reason given to DeadLetter.
	HeaderDeadLetterReason = "Idem-Dead-Letter-Reason"
	// HeaderDeadLetterStream and HeaderDeadLetterSequence name the
	// original message.
	HeaderDeadLetterStream   = "Idem-Dead-Letter-Stream"
	HeaderDeadLetterSequence = "Idem-Dead-Letter-Sequence"
	// HeaderDeadLetterDeliveries is the original's delivery count when it
	// was dead-lettered.
	HeaderDeadLetterDeliveries = "Idem-Dead-Letter-Deliveries"
)

var (
	// ErrConfig is returned by NewSource and NewPublisher for a missing or
	// unusable setting (no dead-letter subject, a push consumer, a consumer
	// without explicit acks).
	ErrConfig = errors.New("jetstream: invalid configuration")
	// ErrAckWaitExpired is returned (wrapped) by Delivery.Extend once the
	// ack wait its receipt or last Extend bought has lapsed: the server may
	// have handed the message to another receiver, and its answer to +WPI
	// would not say (see Delivery.Extend). Nothing is sent.
	ErrAckWaitExpired = errors.New("jetstream: the delivery's ack wait expired (the server may have redelivered the message)")
	// ErrBadAttribute is returned (wrapped) by Publish for an attribute a
	// NATS header cannot carry unchanged: a name that is empty or holds
	// anything but printable ASCII less the separators " ( ) / , : ; < = >
	// ? @ [ \ ] { } (nats.go refuses those), or a value holding CR or LF
	// or beginning or ending with a space or tab (NATS would turn CR and
	// LF into spaces and trim the ends, and the message arrive changed);
	// and a name beginning with Nats- in any case, which the server reads
	// as an instruction (Nats-Msg-Id, Nats-Expected-*, Nats-Rollup,
	// Nats-TTL: an attribute must not set the dedup id or fail the
	// publish). Nothing is sent.
	ErrBadAttribute = queue.Refusal("jetstream: attribute cannot be carried in a NATS header")
)

// defaultTimeout bounds a settle or publish whose context has no deadline.
const defaultTimeout = 10 * time.Second

// SourceConfig configures a [Source].
type SourceConfig struct {
	// Stream and Consumer name an existing stream and durable pull consumer
	// with AckPolicy explicit (the default). Required.
	Stream   string
	Consumer string
	// DeadLetterSubject is where DeadLetter publishes the dead-lettered
	// copy. A stream must capture it (not the consumer's own stream's
	// filter, or the copy would be delivered again). Required: a
	// dead-letter without a destination would lose the message.
	DeadLetterSubject string
	// PollWait is how long one pull request waits for messages before
	// Receive asks again (default 5s, capped by Receive's context). It
	// bounds how late Receive notices that its context is done.
	PollWait time.Duration
	// Logger receives the advisory handling's errors (default
	// slog.Default()).
	Logger *slog.Logger
}

// Source receives from a durable pull consumer. It is safe for concurrent
// use. Close it to stop listening for max-deliveries advisories.
type Source struct {
	js         njs.JetStream
	nc         *nats.Conn
	cons       njs.Consumer
	stream     njs.Stream
	cfg        SourceConfig
	ackWait    time.Duration
	maxDeliver int
	workQueue  bool
	log        *slog.Logger
	advisories *nats.Subscription
	closeOnce  sync.Once

	seenMu   sync.Mutex
	seen     map[uint64]seenEntry // stream sequence -> last count handed out
	pruneAt  int
	keepSeen time.Duration
}

// seenEntry remembers the receive count a Source last reported for a stream
// sequence, until the message is acked or dead-lettered here, or keepSeen
// passes.
type seenEntry struct {
	count int
	at    time.Time
}

// minPrune is the size of the seen map below which it is never pruned.
const minPrune = 1024

var _ queue.Source = (*Source)(nil)

// NewSource binds to cfg.Consumer on cfg.Stream and reads its AckWait and
// MaxDeliver. When MaxDeliver > 0 it subscribes to the consumer's
// max-deliveries advisory (see the package documentation).
func NewSource(ctx context.Context, js njs.JetStream, cfg SourceConfig) (*Source, error) {
	if cfg.Stream == "" || cfg.Consumer == "" {
		return nil, fmt.Errorf("%w: Stream and Consumer are required", ErrConfig)
	}
	if cfg.DeadLetterSubject == "" {
		return nil, fmt.Errorf("%w: DeadLetterSubject is required", ErrConfig)
	}
	if cfg.PollWait <= 0 {
		cfg.PollWait = 5 * time.Second
	}
	s := &Source{js: js, nc: js.Conn(), cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	st, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("jetstream: stream %q: %w", cfg.Stream, err)
	}
	s.stream = st
	s.workQueue = st.CachedInfo().Config.Retention == njs.WorkQueuePolicy
	cons, err := st.Consumer(ctx, cfg.Consumer)
	if err != nil {
		return nil, fmt.Errorf("jetstream: consumer %q on %q: %w", cfg.Consumer, cfg.Stream, err)
	}
	ci := cons.CachedInfo()
	if ci.Config.DeliverSubject != "" {
		return nil, fmt.Errorf("%w: consumer %q is a push consumer; a pull consumer is required", ErrConfig, cfg.Consumer)
	}
	if ci.Config.AckPolicy != njs.AckExplicitPolicy {
		return nil, fmt.Errorf("%w: consumer %q must use AckPolicy explicit", ErrConfig, cfg.Consumer)
	}
	s.cons = cons
	s.ackWait = ci.Config.AckWait
	if s.ackWait <= 0 {
		s.ackWait = 30 * time.Second // the server's default
	}
	s.maxDeliver = ci.Config.MaxDeliver
	s.seen, s.pruneAt, s.keepSeen = map[uint64]seenEntry{}, minPrune, max(10*s.ackWait, 15*time.Minute)
	if s.maxDeliver > 0 {
		subj := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + cfg.Stream + "." + cfg.Consumer
		sub, err := s.nc.Subscribe(subj, s.onMaxDeliveries)
		if err != nil {
			return nil, fmt.Errorf("jetstream: subscribe to %s: %w", subj, err)
		}
		s.advisories = sub
	}
	return s, nil
}

// Close stops the advisory subscription. It does not close the NATS
// connection. Deliveries already received can still be settled.
func (s *Source) Close() error {
	var err error
	s.closeOnce.Do(func() {
		if s.advisories != nil {
			err = s.advisories.Unsubscribe()
		}
	})
	return err
}

// Visibility returns the consumer's AckWait.
func (s *Source) Visibility() time.Duration { return s.ackWait }

// MaxDeliver returns the consumer's MaxDeliver (0 or less: unlimited).
func (s *Source) MaxDeliver() int { return s.maxDeliver }

// Receive pulls up to max messages. It first takes what is available at
// once; when nothing is, it waits (in pull requests of PollWait) until a
// message arrives or ctx is done. Messages that arrive for a wait that ctx
// cut short are handed back with -NAK (their delivery count grows by one).
func (s *Source) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	if max <= 0 {
		max = 1
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	asked := time.Now()
	batch, err := s.cons.FetchNoWait(max)
	if err != nil {
		return nil, fmt.Errorf("jetstream: fetch: %w", err)
	}
	out, err := s.collect(ctx, batch, asked)
	if len(out) > 0 || err != nil {
		return out, err
	}
	for {
		wait := s.cfg.PollWait
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl))
		}
		if wait <= time.Millisecond {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		asked := time.Now()
		batch, err := s.cons.Fetch(1, njs.FetchMaxWait(wait))
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("jetstream: fetch: %w", err)
		}
		out, err := s.collect(ctx, batch, asked)
		if err != nil || len(out) == 0 {
			if err == nil {
				continue
			}
			return nil, err
		}
		if max > 1 {
			asked := time.Now()
			more, err := s.cons.FetchNoWait(max - 1)
			if err == nil {
				rest, _ := s.collect(ctx, more, asked)
				out = append(out, rest...)
			}
		}
		return out, nil
	}
}

// collect reads a batch, pulled at asked, to its end. When ctx is done
// first it returns ctx's error and hands back (Nak) whatever the batch
// still delivers.
func (s *Source) collect(ctx context.Context, batch njs.MessageBatch, asked time.Time) ([]queue.Delivery, error) {
	var out []queue.Delivery
	ch := batch.Messages()
	for {
		select {
		case m, ok := <-ch:
			if !ok {
				if err := batch.Error(); err != nil && len(out) == 0 {
					return nil, fmt.Errorf("jetstream: fetch: %w", err)
				}
				return out, nil
			}
			out = append(out, s.delivery(m, asked))
		case <-ctx.Done():
			go func() {
				for m := range ch {
					_ = m.Nak()
				}
			}()
			for _, d := range out {
				_ = d.(*Delivery).msg.Nak()
			}
			return nil, ctx.Err()
		}
	}
}

func (s *Source) delivery(m njs.Msg, asked time.Time) *Delivery {
	d := &Delivery{src: s, msg: m, deadline: visibility.Received(asked, time.Now(), s.ackWait)}
	md, err := m.Metadata()
	msg := queue.Message{Body: m.Data(), ReceiveCount: 1}
	if err == nil {
		d.seq = md.Sequence.Stream
		d.serverDelivered = int(md.NumDelivered)
		d.numDelivered = s.count(md.Sequence.Stream, int(md.NumDelivered))
		msg.ID = strconv.FormatUint(md.Sequence.Stream, 10)
		msg.ReceiveCount = d.numDelivered
		msg.Published = md.Timestamp
	}
	if h := m.Headers(); len(h) > 0 {
		msg.Attributes = make(map[string]string, len(h))
		for k, v := range h {
			// Nats-* headers are the server's (instructions, or what it
			// adds, such as Nats-Stream-Source; Nats-Msg-Id is DedupID),
			// not the application's attributes: Publish refuses them, so
			// a message received and published again must not carry them.
			if len(v) > 0 && !serverHeader(k) {
				msg.Attributes[k] = v[0]
			}
		}
		msg.DedupID = h.Get(njs.MsgIDHeader)
	}
	d.m = msg
	return d
}

// count returns the receive count to report for a delivery of seq that the
// server numbered n, and remembers it: n, raised to one more than the count
// this Source last handed out for seq when the server reports less, so a
// ReceiveCount never stays or goes back.
//
// Why: nats-server 2.9 (2.9.10 here) hands a message out again with
// NumDelivered 1 when its ack wait expires just as the consumer's only pull
// request expires (the "redo" path of its delivery loop rewinds the
// consumer to a message already delivered; the same path can hand out a
// message another receiver still holds, which the ledger then finds busy).
// It may also count a delivery its client never handed out (a pull that
// timed out as the message arrived), so the count can jump.
func (s *Source) count(seq uint64, n int) int {
	now := time.Now()
	s.seenMu.Lock()
	defer s.seenMu.Unlock()
	if e, ok := s.seen[seq]; ok && n <= e.count {
		n = e.count + 1
	}
	s.seen[seq] = seenEntry{count: n, at: now}
	if len(s.seen) >= s.pruneAt {
		for k, e := range s.seen {
			if now.Sub(e.at) > s.keepSeen {
				delete(s.seen, k)
			}
		}
		s.pruneAt = max(2*len(s.seen), minPrune)
	}
	return n
}

// forget drops seq from the remembered counts: the message is done here.
func (s *Source) forget(seq uint64) {
	s.seenMu.Lock()
	delete(s.seen, seq)
	s.seenMu.Unlock()
}

// Delivery is one received JetStream message.
type Delivery struct {
	src          *Source
	msg          njs.Msg
	m            queue.Message
	seq          uint64
	numDelivered int // the ReceiveCount handed out (see Source.count)
	// serverDelivered is the server's own NumDelivered, which decides
	// whether it would deliver the message again under MaxDeliver.
	serverDelivered int
	settled         atomic.Bool
	mu              sync.Mutex // serialises settles and extensions
	// deadline is when the ack wait bought by the receipt or the last
	// Extend lapses, at the earliest (guarded by mu).
	deadline visibility.Deadline
}

var _ queue.Delivery = (*Delivery)(nil)

// Message returns the delivered message. Its Attributes leave out the
// headers beginning Nats- (see the package documentation); [Delivery.Raw]
// has them all.
func (d *Delivery) Message() queue.Message { return d.m }

// Raw returns the underlying JetStream message.
func (d *Delivery) Raw() njs.Msg { return d.msg }

// Ack acknowledges the message and waits for the server's confirmation
// (a double ack). An error means the ack may not have been recorded: the
// message may be delivered again. The server does not answer an ack for a
// message it no longer holds (acked through a later delivery after this
// one's ack wait passed): that Ack fails when ctx ends (after 10s without a
// deadline).
func (d *Delivery) Ack(ctx context.Context) error {
	if err := d.settle(ctx, "ack", []byte("+ACK")); err != nil {
		return err
	}
	d.src.forget(d.seq)
	return nil
}

// Retry sends -NAK with delay (0: redeliver at once) and waits for the
// server's confirmation. On the consumer's last allowed delivery (the
// server's NumDelivered ≥ MaxDeliver, whatever ReceiveCount was raised to)
// the server would never redeliver, so Retry dead-letters the message
// instead.
func (d *Delivery) Retry(ctx context.Context, delay time.Duration) error {
	if md := d.src.maxDeliver; md > 0 && d.serverDelivered >= md {
		return d.DeadLetter(ctx, fmt.Sprintf("jetstream: max deliveries (%d) reached: retry refused", md))
	}
	body := []byte("-NAK")
	if delay > 0 {
		body = fmt.Appendf(nil, `-NAK {"delay": %d}`, delay.Nanoseconds())
	}
	return d.settle(ctx, "nak", body)
}

// Extend sends +WPI (InProgress): the server restarts the ack wait at its
// configured length, whatever d. It waits for the server's answer, which
// does not say whether the delivery was still held: once the ack wait
// bought by the receipt or the last Extend has lapsed, Extend sends
// nothing and returns an error wrapping [ErrAckWaitExpired], since the
// message may be in another receiver's hands (the ledger then finds its
// key busy).
//
// Late extensions: the server's answer to +WPI says nothing about the
// delivery: nats-server (2.9.10 checked) answers with the same empty reply
// whether the delivery is still pending, its ack wait has lapsed, the
// message was redelivered (to this receiver or another), or it was acked or
// terminated meanwhile. It applies +WPI to the stream sequence, not the
// delivery, so a late one restarts the ack wait of whichever delivery of
// the message it holds now, another receiver's included. The consumer's
// info has no per-message state to compare with either. So each Delivery
// keeps the deadline its receipt or last Extend bought (counted from when
// the +WPI was sent, and from 250 ms before the message arrived, or from
// when its pull request was sent if that was later; see Source.delivery).
// Within the deadline Extend cannot tell a delivery the server handed out
// again early (the 2.9 "redo" path, see Source.count) from one it still
// holds; nor can Ack, Retry or DeadLetter tell, at any time, which delivery
// they settle (the server acts on the stream sequence).
func (d *Delivery) Extend(ctx context.Context, _ time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled.Load() {
		return queue.ErrSettled
	}
	start := time.Now()
	if d.deadline.Lapsed(start) {
		return fmt.Errorf("jetstream: in progress of stream sequence %d: %w (deadline %s passed)",
			d.seq, ErrAckWaitExpired, d.deadline)
	}
	if err := d.request(ctx, "in progress", []byte("+WPI")); err != nil {
		return err
	}
	d.deadline.Extend(start, d.src.ackWait)
	return nil
}

// DeadLetter publishes a copy of the message (body and headers, less those
// that steer a publish such as Nats-Expected-*, plus the reason, valid
// UTF-8 and at most its first 4,096 bytes, with CR and LF written as \r
// and \n so that a multi-line reason stays readable in a one-line header,
// and the original's stream, sequence and delivery count as headers)
// to the dead-letter subject, waits for its PubAck, and then terminates the
// original (+TERM). The copy carries Nats-Msg-Id "idem-dl:<stream>:<seq>", so
// a DeadLetter repeated after a failed +TERM is dropped by a dead-letter
// stream with a Duplicates window. When the copy does not fit the server's
// max_payload (the original nearly fills it), it goes with what fits: the
// reason cut (and marked so), then without the reason, the other
// dead-letter headers, the original's headers and Nats-Msg-Id, in that
// order and only as far as needed; the body always goes. If the publish
// fails the original is left as it was and an error is returned.
func (d *Delivery) DeadLetter(ctx context.Context, reason string) error {
	if d.settled.Load() {
		return queue.ErrSettled
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	out := nats.NewMsg(d.src.cfg.DeadLetterSubject)
	out.Data = d.msg.Data()
	for k, v := range d.msg.Headers() {
		if !publishControl(k) {
			out.Header[k] = v
		}
	}
	d.src.deadLetterHeaders(out.Header, d.seq, d.numDelivered, reason)
	_, err := d.src.js.PublishMsg(ctx, out)
	if errors.Is(err, nats.ErrMaxPayload) && fitDeadLetter(out, d.src.js.Conn().MaxPayload()) {
		// The original nearly fills max_payload: the copy goes with
		// what fits (the consumer's log line has the reason whole).
		_, err = d.src.js.PublishMsg(ctx, out)
	}
	if err != nil {
		return fmt.Errorf("jetstream: dead-letter publish to %s: %w", d.src.cfg.DeadLetterSubject, err)
	}
	if err := d.settle(ctx, "term", []byte("+TERM")); err != nil {
		return err
	}
	d.src.forget(d.seq)
	return nil
}

// reasonCutMark ends a dead-letter reason cut to fit max_payload.
const reasonCutMark = " ... (cut to fit the server's max_payload)"

// fitDeadLetter makes the dead-letter copy m fit max bytes of payload
// (body and headers, as the client counts them), giving up, in this order
// and only as far as needed: the reason's tail (the rest is kept, marked
// as cut), the reason, the other dead-letter headers but Nats-Msg-Id, the
// original's own headers, and Nats-Msg-Id. The body always goes: the
// original, stored with it, fitted. It reports whether m changed.
func fitDeadLetter(m *nats.Msg, max int64) bool {
	// The payload the client checks against max_payload: the encoded
	// headers and the body, without the subject nats.Msg.Size counts.
	size := func() int64 { return int64(m.Size() - len(m.Subject) - len(m.Reply)) }
	over := size() - max
	if over <= 0 {
		return false
	}
	r := m.Header.Get(HeaderDeadLetterReason)
	if keep := int64(len(r)) - over - int64(len(reasonCutMark)); keep > 0 {
		m.Header.Set(HeaderDeadLetterReason, strings.ToValidUTF8(r[:keep], "")+reasonCutMark)
		return true
	}
	m.Header.Del(HeaderDeadLetterReason)
	drops := [][]string{
		{HeaderDeadLetterStream, HeaderDeadLetterSequence, HeaderDeadLetterDeliveries},
		nil, // the original's headers: all but Nats-Msg-Id
		{njs.MsgIDHeader},
	}
	for _, names := range drops {
		if size() <= max {
			break
		}
		if names == nil {
			for k := range m.Header {
				if k != njs.MsgIDHeader {
					delete(m.Header, k)
				}
			}
			continue
		}
		for _, k := range names {
			m.Header.Del(k)
		}
	}
	return true
}

// publishControl reports whether a stored header of the original is one
// that steers a publish (the stream stores them with the message): the
// dedup id, the publish expectations (Nats-Expected-Stream,
// Nats-Expected-Last-Sequence, ...), a rollup and a per-message TTL. The
// dead-lettered copy must not carry them: it goes to another stream, which
// would refuse it ("expected stream does not match", a wrong last
// sequence, rollups or TTLs not allowed) on every attempt, leaving the
// message never dead-lettered, or roll up the dead letters already held.
func publishControl(k string) bool {
	k = strings.ToLower(k)
	return k == strings.ToLower(njs.MsgIDHeader) || strings.HasPrefix(k, "nats-expected-") ||
		k == "nats-rollup" || k == "nats-ttl"
}

// reasonEscaper writes CR and LF in a dead-letter reason visibly; a NATS
// header value would have them turned into spaces.
var reasonEscaper = strings.NewReplacer("\r", `\r`, "\n", `\n`)

func (s *Source) deadLetterHeaders(h nats.Header, seq uint64, deliveries int, why string) {
	h.Set(HeaderDeadLetterReason, reasonEscaper.Replace(reason.Bound(why)))
	h.Set(HeaderDeadLetterStream, s.cfg.Stream)
	h.Set(HeaderDeadLetterSequence, strconv.FormatUint(seq, 10))
	h.Set(HeaderDeadLetterDeliveries, strconv.Itoa(deliveries))
	h.Set(njs.MsgIDHeader, "idem-dl:"+s.cfg.Stream+":"+strconv.FormatUint(seq, 10))
}

func (d *Delivery) settle(ctx context.Context, what string, body []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled.Load() {
		return queue.ErrSettled
	}
	if err := d.request(ctx, what, body); err != nil {
		return err
	}
	d.settled.Store(true)
	return nil
}

// request sends an ack-type body to the message's reply subject and waits
// for the server's (empty) answer.
func (d *Delivery) request(ctx context.Context, what string, body []byte) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if _, err := d.src.nc.RequestWithContext(ctx, d.msg.Reply(), body); err != nil {
		return fmt.Errorf("jetstream: %s of stream sequence %d: %w", what, d.seq, err)
	}
	return nil
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, defaultTimeout)
}

// maxDeliveriesAdvisory is the part of io.nats.jetstream.advisory.v1.max_deliver
// the adapter reads.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries int    `json:"deliveries"`
}

// onMaxDeliveries moves the message an advisory names to the dead-letter
// subject and, on a work-queue stream, deletes it from the stream.
func (s *Source) onMaxDeliveries(m *nats.Msg) {
	var a maxDeliveriesAdvisory
	if err := json.Unmarshal(m.Data, &a); err != nil || a.StreamSeq == 0 {
		s.log.Error("jetstream: unreadable max-deliveries advisory", "subject", m.Subject, "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTimeout)
	defer cancel()
	raw, err := s.stream.GetMsg(ctx, a.StreamSeq)
	if err != nil {
		if errors.Is(err, njs.ErrMsgNotFound) {
			return // settled meanwhile (acked or dead-lettered already)
		}
		s.log.Error("jetstream: max deliveries reached; cannot read the message to dead-letter it",
			"stream", a.Stream, "seq", a.StreamSeq, "err", err)
		return
	}
	out := nats.NewMsg(s.cfg.DeadLetterSubject)
	out.Data = raw.Data
	for k, v := range raw.Header {
		if !publishControl(k) {
			out.Header[k] = v
		}
	}
	reason := fmt.Sprintf("jetstream: max deliveries (%d) reached", a.Deliveries)
	s.deadLetterHeaders(out.Header, a.StreamSeq, a.Deliveries, reason)
	if _, err := s.js.PublishMsg(ctx, out); err != nil {
		s.log.Error("jetstream: max deliveries reached; dead-letter publish failed, the message stays in the stream",
			"stream", a.Stream, "seq", a.StreamSeq, "err", err)
		return
	}
	if s.workQueue {
		if err := s.stream.DeleteMsg(ctx, a.StreamSeq); err != nil && !errors.Is(err, njs.ErrMsgNotFound) {
			s.log.Error("jetstream: dead-lettered after max deliveries; deleting the original failed",
				"stream", a.Stream, "seq", a.StreamSeq, "err", err)
		}
	}
}

// Publisher publishes to one subject. It is safe for concurrent use.
type Publisher struct {
	js      njs.JetStream
	subject string
}

var _ queue.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher sending to subject, which a stream must
// capture (otherwise Publish fails with njs.ErrNoStreamResponse).
func NewPublisher(js njs.JetStream, subject string) (*Publisher, error) {
	if subject == "" {
		return nil, fmt.Errorf("%w: subject is required", ErrConfig)
	}
	return &Publisher{js: js, subject: subject}, nil
}

// Publish sends m and waits for the stream's PubAck. Attributes become
// headers, names kept as given (case included); one a header cannot carry
// unchanged is refused with [ErrBadAttribute] and nothing is sent. DedupID
// becomes Nats-Msg-Id. A duplicate inside the stream's
// Duplicates window returns Published{ID: the held message's sequence,
// Duplicate: true}. GroupID is ignored; a non-zero Delay is refused with
// [queue.ErrUnsupported] (see the package documentation). Without a deadline on ctx, Publish waits at most 10s.
func (p *Publisher) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	if m.Delay > 0 {
		return queue.Published{}, fmt.Errorf("jetstream: Delay: %w", queue.ErrUnsupported)
	}
	for k, v := range m.Attributes {
		if err := checkAttribute(k, v); err != nil {
			return queue.Published{}, err
		}
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	out := nats.NewMsg(p.subject)
	out.Data = m.Body
	for k, v := range m.Attributes {
		out.Header.Set(k, v)
	}
	var opts []njs.PublishOpt
	if m.DedupID != "" {
		opts = append(opts, njs.WithMsgID(m.DedupID))
	}
	ack, err := p.js.PublishMsg(ctx, out, opts...)
	if errors.Is(err, nats.ErrMaxPayload) {
		// Checked by the client before sending: never, as it is.
		return queue.Published{}, fmt.Errorf("jetstream: publish to %s: %w (%w)", p.subject, err, queue.ErrRefused)
	}
	if err != nil {
		return queue.Published{}, fmt.Errorf("jetstream: publish to %s: %w", p.subject, err)
	}
	return queue.Published{ID: strconv.FormatUint(ack.Sequence, 10), Duplicate: ack.Duplicate}, nil
}

// checkAttribute returns an error wrapping ErrBadAttribute when a NATS
// header cannot carry name k with value v unchanged (see ErrBadAttribute).
func checkAttribute(k, v string) error {
	if k == "" {
		return fmt.Errorf("%w: empty name", ErrBadAttribute)
	}
	if serverHeader(k) {
		return fmt.Errorf("%w: name %q: headers beginning Nats- steer the server (use DedupID for Nats-Msg-Id)", ErrBadAttribute, k)
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < '!' || c > '~' || strings.IndexByte(`"()/,:;<=>?@[\]{}`, c) >= 0 {
			return fmt.Errorf("%w: name %q: byte %d (%q) is not allowed in a header name", ErrBadAttribute, k, i, c)
		}
	}
	if i := strings.IndexAny(v, "\r\n"); i >= 0 {
		return fmt.Errorf("%w: value of %q holds a line break at byte %d", ErrBadAttribute, k, i)
	}
	if v != "" && (isBlank(v[0]) || isBlank(v[len(v)-1])) {
		return fmt.Errorf("%w: value of %q (%q) begins or ends with a space or tab", ErrBadAttribute, k, v)
	}
	return nil
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

// serverHeader reports whether a header named k is one the server reads
// as an instruction: its name begins with Nats-, in any case.
func serverHeader(k string) bool {
	return len(k) >= len("Nats-") && strings.EqualFold(k[:len("Nats-")], "Nats-")
}
