package sqsqueue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/internal/sqsmsg"
	"github.com/idemkit/idem/queue/internal/visibility"
)

// ReasonAttribute is the message attribute (type String) in which
// DeadLetter keeps its reason on the dead-lettered copy.
const ReasonAttribute = "idem-dead-letter-reason"

// SourceIDAttribute is the message attribute (type String) in which
// DeadLetter keeps the original message's MessageId, when there is room.
const SourceIDAttribute = "idem-source-message-id"

// Limits SQS sets.
const (
	// MaxBatch is the most messages one ReceiveMessage or
	// DeleteMessageBatch call handles.
	MaxBatch = 10
	// MaxDelay is the longest DelaySeconds SQS accepts (15 minutes).
	MaxDelay = 15 * time.Minute
	// MaxVisibility is the longest visibility timeout SQS accepts (12 hours).
	MaxVisibility = 12 * time.Hour
	// MaxWaitTime is the longest long poll SQS accepts (20 seconds).
	MaxWaitTime = 20 * time.Second
	// DedupInterval is how long SQS FIFO remembers a deduplication id.
	DedupInterval = 5 * time.Minute
	// maxAttributes is the most message attributes a message may carry.
	maxAttributes = 10
)

var (
	// ErrStaleReceipt is returned (wrapped) by Ack, Retry, Extend and
	// DeadLetter when the delivery's visibility timeout had lapsed, or SQS
	// refused its receipt handle: the message may have been handed to
	// another receiver, and the call may not have taken effect.
	ErrStaleReceipt = errors.New("sqsqueue: receipt handle is stale (visibility timeout lapsed)")
	// ErrDelayTooLong is returned (wrapped) by Publish for an
	// Outgoing.Delay above [MaxDelay]; nothing is sent.
	ErrDelayTooLong = queue.Refusal("sqsqueue: delay exceeds SQS's 15 minute maximum")
	// ErrNoDeadLetterQueue is returned by DeadLetter when the Queue has no
	// dead-letter queue (no Options.DeadLetterURL and no RedrivePolicy).
	// The message is left in flight and comes back after its visibility
	// timeout.
	ErrNoDeadLetterQueue = errors.New("sqsqueue: no dead-letter queue configured")
	// ErrNoGroupID is returned by Publish on a FIFO queue for an Outgoing
	// without a GroupID (SQS requires one); nothing is sent.
	ErrNoGroupID = queue.Refusal("sqsqueue: FIFO queue needs a GroupID")
	// ErrNoDedupID is returned by Publish on a FIFO queue without
	// ContentBasedDeduplication for an Outgoing without a DedupID (SQS
	// requires one); nothing is sent.
	ErrNoDedupID = queue.Refusal("sqsqueue: FIFO queue without content-based deduplication needs a DedupID")
	// ErrBadAttribute is returned by Publish for more than 10 attributes, an
	// empty attribute name or value (SQS refuses both), or a name or value
	// that is not UTF-8 of the characters SQS accepts (see [ErrBadBody]);
	// nothing is sent.
	ErrBadAttribute = queue.Refusal("sqsqueue: invalid message attribute")
	// ErrBadBody is returned by Publish for a body that is not UTF-8 made
	// of the characters SQS accepts: #x9, #xA, #xD, #x20 to #xD7FF, #xE000
	// to #xFFFD and #x10000 to #x10FFFF. Nothing is sent. (The SDK would
	// replace each invalid byte with U+FFFD on the way, and SQS store the
	// changed message.) Binary payloads must be encoded by the caller, for
	// example with base64.
	ErrBadBody = queue.Refusal("sqsqueue: message body is not UTF-8 of the characters SQS accepts")
)

// Client is the part of *sqs.Client a Queue uses. *sqs.Client satisfies it;
// a wrapper may add logging or metrics.
type Client interface {
	GetQueueAttributes(ctx context.Context, in *sqs.GetQueueAttributesInput, optFns ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
	GetQueueUrl(ctx context.Context, in *sqs.GetQueueUrlInput, optFns ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error)
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, optFns ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessage(ctx context.Context, in *sqs.DeleteMessageInput, optFns ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error)
	DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
	ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
	ChangeMessageVisibilityBatch(ctx context.Context, in *sqs.ChangeMessageVisibilityBatchInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityBatchOutput, error)
	SendMessage(ctx context.Context, in *sqs.SendMessageInput, optFns ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
}

var _ Client = (*sqs.Client)(nil)

// Options configure a Queue. The zero value is valid.
type Options struct {
	// Visibility is the visibility timeout asked for on every
	// ReceiveMessage (whole seconds, rounded up, at most 12 hours). 0 (the
	// default): the queue's VisibilityTimeout attribute, read by Open.
	// A queue.Consumer's default handler timeout is a sixth of it, at
	// most 30 s (5 s on a queue with SQS's default of 30 s).
	Visibility time.Duration
	// WaitTime is the long poll of each ReceiveMessage call (whole seconds,
	// at most 20 s). 0 (the default): 20 s. Receive polls again until a
	// message arrives or its context is done, whatever WaitTime is.
	WaitTime time.Duration
	// DeadLetterURL is the queue DeadLetter sends to. "" (the default):
	// the deadLetterTargetArn of the queue's RedrivePolicy, resolved by Open
	// with GetQueueUrl; with neither, DeadLetter returns
	// ErrNoDeadLetterQueue. A FIFO queue's dead-letter queue must be FIFO
	// too (DeadLetter keeps the group id and uses the original MessageId as
	// the dedup id, so a repeated DeadLetter within 5 minutes sends one
	// copy).
	//
	// Two ways into the dead-letter queue coexist: DeadLetter(reason),
	// which the consumer calls for a permanent failure or past its max
	// receives, and SQS's redrive policy, which moves a message after
	// maxReceiveCount receives without a reason (a handler that crashes
	// the process every time never reaches DeadLetter). Set maxReceiveCount
	// above the consumer's max receives so that the consumer's reasoned
	// DeadLetter normally comes first and the redrive policy is the
	// backstop. [Queue.MaxReceiveCount] reports the policy's count.
	DeadLetterURL string
	// AckTimeout bounds a delete sent for acks batched together (each
	// caller waits for its own context too). 0 (the default): 30 s.
	AckTimeout time.Duration
}

// Queue is one SQS queue as a [queue.Source] and a [queue.Publisher]. It is
// safe for concurrent use.
type Queue struct {
	client     Client
	url        string
	fifo       bool
	contentDup bool
	groupDedup bool // DeduplicationScope messageGroup
	visibility time.Duration
	reqVis     int32 // VisibilityTimeout sent on ReceiveMessage (0: queue's)
	wait       int32
	dlqURL     string
	dlqFIFO    bool
	maxRecv    int
	ackTimeout time.Duration

	del deleter

	dupMu   sync.Mutex
	dupSeen map[string]sentID // dedup key -> first MessageId seen
	dupLog  []dupEntry        // in send order, for pruning
}

type sentID struct {
	id string
	at time.Time
}

type dupEntry struct {
	key string
	at  time.Time
}

var (
	_ queue.Source    = (*Queue)(nil)
	_ queue.Publisher = (*Queue)(nil)
)

// Open reads the queue's attributes (VisibilityTimeout, FifoQueue,
// ContentBasedDeduplication, DeduplicationScope, RedrivePolicy) and returns
// a Queue for url. It fails if the queue does not exist, if a RedrivePolicy
// names a dead-letter queue that cannot be found, or if the queue's
// VisibilityTimeout is 0 and Options.Visibility is not set.
func Open(ctx context.Context, client Client, url string, opts Options) (*Queue, error) {
	if client == nil || url == "" {
		return nil, errors.New("sqsqueue: Open needs a client and a queue URL")
	}
	if opts.Visibility < 0 || opts.Visibility > MaxVisibility {
		return nil, fmt.Errorf("sqsqueue: Visibility %v outside 0..12h", opts.Visibility)
	}
	if opts.WaitTime < 0 || opts.WaitTime > MaxWaitTime {
		return nil, fmt.Errorf("sqsqueue: WaitTime %v outside 0..20s", opts.WaitTime)
	}
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
	})
	if err != nil {
		return nil, fmt.Errorf("sqsqueue: reading attributes of %s: %w", url, err)
	}
	a := out.Attributes
	q := &Queue{
		client:     client,
		url:        url,
		fifo:       a[string(types.QueueAttributeNameFifoQueue)] == "true",
		contentDup: a[string(types.QueueAttributeNameContentBasedDeduplication)] == "true",
		groupDedup: a[string(types.QueueAttributeNameDeduplicationScope)] == "messageGroup",
		wait:       int32(MaxWaitTime / time.Second),
		ackTimeout: 30 * time.Second,
		dlqURL:     opts.DeadLetterURL,
		dupSeen:    map[string]sentID{},
	}
	q.del.q = q
	if opts.WaitTime > 0 {
		q.wait = int32(opts.WaitTime / time.Second)
	}
	if opts.AckTimeout > 0 {
		q.ackTimeout = opts.AckTimeout
	}
	if opts.Visibility > 0 {
		q.reqVis = seconds(opts.Visibility)
		q.visibility = time.Duration(q.reqVis) * time.Second
	} else {
		v, err := strconv.Atoi(a[string(types.QueueAttributeNameVisibilityTimeout)])
		if err != nil {
			return nil, fmt.Errorf("sqsqueue: queue %s reports VisibilityTimeout %q", url, a[string(types.QueueAttributeNameVisibilityTimeout)])
		}
		q.visibility = time.Duration(v) * time.Second
		if v == 0 {
			return nil, fmt.Errorf("sqsqueue: queue %s has VisibilityTimeout 0 (every message would be handed out again at once); set Options.Visibility", url)
		}
	}
	if rp := a[string(types.QueueAttributeNameRedrivePolicy)]; rp != "" {
		var p struct {
			Target string `json:"deadLetterTargetArn"`
			Max    any    `json:"maxReceiveCount"` // a number or a string
		}
		if err := json.Unmarshal([]byte(rp), &p); err != nil {
			return nil, fmt.Errorf("sqsqueue: queue %s has an unreadable RedrivePolicy %q: %w", url, rp, err)
		}
		q.maxRecv, _ = strconv.Atoi(strings.Trim(fmt.Sprint(p.Max), `"`))
		if q.dlqURL == "" && p.Target != "" {
			// arn:aws:sqs:region:account:name
			parts := strings.Split(p.Target, ":")
			if len(parts) != 6 {
				return nil, fmt.Errorf("sqsqueue: queue %s: RedrivePolicy target %q is not an SQS ARN", url, p.Target)
			}
			in := &sqs.GetQueueUrlInput{QueueName: aws.String(parts[5])}
			if parts[4] != "" {
				in.QueueOwnerAWSAccountId = aws.String(parts[4])
			}
			u, err := client.GetQueueUrl(ctx, in)
			if err != nil {
				return nil, fmt.Errorf("sqsqueue: queue %s: resolving its dead-letter queue %s: %w", url, p.Target, err)
			}
			q.dlqURL = aws.ToString(u.QueueUrl)
		}
	}
	q.dlqFIFO = strings.HasSuffix(q.dlqURL, ".fifo")
	return q, nil
}

// URL returns the queue's URL.
func (q *Queue) URL() string { return q.url }

// FIFO reports whether the queue is a FIFO queue.
func (q *Queue) FIFO() bool { return q.fifo }

// DeadLetterURL returns the queue DeadLetter sends to ("" for none).
func (q *Queue) DeadLetterURL() string { return q.dlqURL }

// MaxReceiveCount returns the maxReceiveCount of the queue's RedrivePolicy
// as Open read it (0: no redrive policy).
func (q *Queue) MaxReceiveCount() int { return q.maxRecv }

// Visibility returns Options.Visibility, or the queue's VisibilityTimeout
// attribute as Open read it.
func (q *Queue) Visibility() time.Duration { return q.visibility }

// Receive long-polls until at least one message arrives or ctx is done, and
// returns up to n deliveries (n is clamped to 1..10). It returns ctx's
// error and no deliveries when ctx is done first.
//
// A long poll is not cut off by ctx: SQS may hand messages out to a
// request whose caller has gone, and they would stay invisible for a whole
// visibility timeout. When ctx is done first, Receive returns at once and
// the poll finishes in the background (within WaitTime); whatever it
// brings is made visible again at once (ChangeMessageVisibilityBatch 0),
// which adds one to those messages' receive counts.
func (q *Queue) Receive(ctx context.Context, n int) ([]queue.Delivery, error) {
	n = min(MaxBatch, max(1, n))
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r, err := q.poll(ctx, n)
		if err != nil {
			return nil, err
		}
		if len(r.out.Messages) == 0 {
			continue
		}
		// SQS starts the visibility timeout when it hands the messages out:
		// after start, and for a long poll that waited, close to the
		// response. Count from visibility.ReceiveSlack before the response
		// (never earlier than start), which covers the response's way back.
		deadline := visibility.Received(r.start, r.end, q.visibility)
		ds := make([]queue.Delivery, 0, len(r.out.Messages))
		for _, m := range r.out.Messages {
			ds = append(ds, &Delivery{q: q, msg: toMessage(m), attrs: m.MessageAttributes, handle: aws.ToString(m.ReceiptHandle), deadline: deadline})
		}
		return ds, nil
	}
}

type polled struct {
	out        *sqs.ReceiveMessageOutput
	err        error
	start, end time.Time
}

// poll makes one ReceiveMessage call that ctx does not cut off (see
// Receive).
func (q *Queue) poll(ctx context.Context, n int) (polled, error) {
	var (
		mu        sync.Mutex
		abandoned bool
		ch        = make(chan polled, 1)
	)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(q.wait)*time.Second+30*time.Second)
	go func() {
		defer cancel()
		r := polled{start: time.Now()}
		r.out, r.err = q.client.ReceiveMessage(pctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(q.url),
			MaxNumberOfMessages:         int32(n),
			WaitTimeSeconds:             q.wait,
			VisibilityTimeout:           q.reqVis,
			AttributeNames:              []types.QueueAttributeName{types.QueueAttributeNameAll},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
			MessageAttributeNames:       []string{"All"},
		})
		r.end = time.Now()
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			q.handBack(pctx, r)
			return
		}
		ch <- r
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return r, fmt.Errorf("sqsqueue: receiving from %s: %w", q.url, r.err)
		}
		return r, nil
	case <-ctx.Done():
		mu.Lock()
		abandoned = true
		mu.Unlock()
		select {
		case r := <-ch: // arrived just now
			go q.handBack(context.WithoutCancel(ctx), r)
		default: // the poll hands back what it brings
		}
		return polled{}, ctx.Err()
	}
}

// handBack makes the messages of a poll nobody waits for visible again.
func (q *Queue) handBack(ctx context.Context, r polled) {
	if r.err != nil || r.out == nil || len(r.out.Messages) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, q.ackTimeout)
	defer cancel()
	entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(r.out.Messages))
	for i, m := range r.out.Messages {
		entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
	}
	// Best effort: a message not handed back returns after its visibility
	// timeout.
	_, _ = q.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(q.url), Entries: entries})
}

// toMessage reads a received message as a queue.Message (see
// sqsmsg.Message).
func toMessage(m types.Message) queue.Message {
	return sqsmsg.Message(aws.ToString(m.MessageId), aws.ToString(m.Body), m.Attributes, sqsmsg.Attributes(m.MessageAttributes,
		func(a types.MessageAttributeValue) (*string, []byte) { return a.StringValue, a.BinaryValue }))
}

// seconds rounds d up to whole seconds, within 0..12h.
func seconds(d time.Duration) int32 {
	if d <= 0 {
		return 0
	}
	d = min(d, MaxVisibility)
	return int32(math.Ceil(d.Seconds()))
}

// fifoID returns id as a MessageGroupId or MessageDeduplicationId that SQS
// takes: id itself if it is 1 to 128 characters of SQS's set (ASCII letters,
// digits and punctuation), else "sha256:" and the hex of its SHA-256. An
// operation key may be longer (up to 1,024 bytes) or hold other characters;
// the digest keeps one id for one key, so dedup and grouping still hold.
func fifoID(id string) string {
	if len(id) <= 128 && strings.IndexFunc(id, func(r rune) bool { return r < '!' || r > '~' }) < 0 {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Publish sends m with SendMessage and returns once SQS has accepted it.
//
// On a FIFO queue m.GroupID is required ([ErrNoGroupID]) and m.DedupID too
// unless the queue has ContentBasedDeduplication ([ErrNoDedupID]); an id
// SQS would refuse (over 128 characters, or characters outside ASCII's
// printable set) is sent as "sha256:" and the hex of its SHA-256, which
// consumers then receive as the message's GroupID or DedupID; a
// non-zero m.Delay is refused with an error wrapping [queue.ErrUnsupported]
// (SQS FIFO queues only have a queue-wide delay). On a standard queue
// m.DedupID and m.GroupID are ignored. m.Delay is rounded up to whole
// seconds; above 15 minutes Publish returns [ErrDelayTooLong]. Attributes
// are sent as String message attributes (at most 10, non-empty names and
// values: [ErrBadAttribute]). See the package doc for when
// Published.Duplicate is reported.
//
// SQS carries text only: a body, attribute name or attribute value that is
// not valid UTF-8, or holds a character outside SQS's set (NUL and most
// other control characters, U+FFFE, U+FFFF, surrogates), is refused with
// [ErrBadBody] or [ErrBadAttribute] and nothing is sent, rather than
// arriving changed. Encode binary payloads (base64, for example) before
// publishing.
func (q *Queue) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	if i := badText(string(m.Body)); i >= 0 {
		return queue.Published{}, fmt.Errorf("%w: byte %d of %d (%q)", ErrBadBody, i, len(m.Body), excerpt(string(m.Body), i))
	}
	in := &sqs.SendMessageInput{QueueUrl: aws.String(q.url), MessageBody: aws.String(string(m.Body))}
	if m.Delay < 0 || m.Delay > MaxDelay {
		return queue.Published{}, fmt.Errorf("%w: %v", ErrDelayTooLong, m.Delay)
	}
	if q.fifo {
		if m.Delay > 0 {
			return queue.Published{}, fmt.Errorf("sqsqueue: per-message delay on FIFO queue %s: %w", q.url, queue.ErrUnsupported)
		}
		if m.GroupID == "" {
			return queue.Published{}, ErrNoGroupID
		}
		if m.DedupID == "" && !q.contentDup {
			return queue.Published{}, ErrNoDedupID
		}
		in.MessageGroupId = aws.String(fifoID(m.GroupID))
		if m.DedupID != "" {
			in.MessageDeduplicationId = aws.String(fifoID(m.DedupID))
		}
	} else {
		in.DelaySeconds = int32(math.Ceil(m.Delay.Seconds()))
	}
	attrs, err := toAttributes(m.Attributes)
	if err != nil {
		return queue.Published{}, err
	}
	in.MessageAttributes = attrs
	out, err := q.client.SendMessage(ctx, in)
	if err != nil {
		return queue.Published{}, fmt.Errorf("sqsqueue: sending to %s: %w", q.url, err)
	}
	p := queue.Published{ID: aws.ToString(out.MessageId)}
	if q.fifo && m.DedupID != "" {
		key := m.DedupID
		if q.groupDedup {
			key = m.GroupID + "\x00" + m.DedupID
		}
		p.Duplicate = q.seen(key, p.ID)
	}
	return p, nil
}

func toAttributes(a map[string]string) (map[string]types.MessageAttributeValue, error) {
	if len(a) == 0 {
		return nil, nil
	}
	if len(a) > maxAttributes {
		return nil, fmt.Errorf("%w: %d attributes, SQS allows %d", ErrBadAttribute, len(a), maxAttributes)
	}
	out := make(map[string]types.MessageAttributeValue, len(a))
	for k, v := range a {
		if k == "" || v == "" {
			return nil, fmt.Errorf("%w: attribute %q has an empty name or value", ErrBadAttribute, k)
		}
		if i := badText(k); i >= 0 {
			return nil, fmt.Errorf("%w: name %q is not UTF-8 of the characters SQS accepts (byte %d)", ErrBadAttribute, k, i)
		}
		if i := badText(v); i >= 0 {
			return nil, fmt.Errorf("%w: value of %q is not UTF-8 of the characters SQS accepts (byte %d: %q)", ErrBadAttribute, k, i, excerpt(v, i))
		}
		out[k] = stringAttribute(v)
	}
	return out, nil
}

// sqsRune reports whether SQS accepts r in a message body or String
// attribute: #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD |
// #x10000 to #x10FFFF.
func sqsRune(r rune) bool {
	switch {
	case r == '\t' || r == '\n' || r == '\r',
		r >= 0x20 && r <= 0xD7FF,
		r >= 0xE000 && r <= 0xFFFD,
		r >= 0x10000 && r <= 0x10FFFF:
		return true
	}
	return false
}

// badText returns the byte offset of the first byte of s that is not part
// of a valid UTF-8 encoding of a character SQS accepts, or -1 if there is
// none. (A U+FFFD that s really holds is accepted: it is a character.)
func badText(s string) int {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n == 1 {
				return i
			}
		}
		if !sqsRune(r) {
			return i
		}
	}
	return -1
}

// excerpt is at most 16 bytes of s from i, for an error message.
func excerpt(s string, i int) string {
	return s[i:min(len(s), i+16)]
}

// stringAttribute is v as a message attribute of type String.
func stringAttribute(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

// seen records that a send with dedup id key got MessageId id and reports
// whether an earlier send of key within DedupInterval got the same id.
func (q *Queue) seen(key, id string) bool {
	now := time.Now()
	q.dupMu.Lock()
	defer q.dupMu.Unlock()
	n := 0
	for n < len(q.dupLog) && now.Sub(q.dupLog[n].at) > DedupInterval {
		if e, ok := q.dupSeen[q.dupLog[n].key]; ok && e.at.Equal(q.dupLog[n].at) {
			delete(q.dupSeen, q.dupLog[n].key)
		}
		n++
	}
	q.dupLog = q.dupLog[n:]
	if e, ok := q.dupSeen[key]; ok && e.id == id {
		return true
	}
	q.dupSeen[key] = sentID{id: id, at: now}
	q.dupLog = append(q.dupLog, dupEntry{key: key, at: now})
	return false
}
