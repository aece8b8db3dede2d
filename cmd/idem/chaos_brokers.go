package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/storeurl"
	"github.com/idemkit/idem/internal/tcprelay"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/amqpqueue"
	"github.com/idemkit/idem/queue/jetstream"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/queue/sqsqueue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/dynamostore"
)

// chaosProxyCut is the share of the relayed connections one broker or
// DynamoDB fault closes, and chaosProxyEvery the least time between two:
// a broker connection carries a worker's whole flow (its pulls, its
// acks), and a worker must get some work done between reconnections.
const (
	chaosProxyCut   = 1.0 / 3
	chaosProxyEvery = time.Second
)

// proxyCutter cuts a proxy's connections, at most every chaosProxyEvery.
// The proxy stands in the harness between the workers and a broker (or
// DynamoDB) that has no means of its own to drop a client's connection on
// demand: the workers dial the proxy, and a fault resets some of the
// relayed connections, both ends at once, with no clean shutdown (the
// worker reads a reset, the server sees its client vanish).
type proxyCutter struct {
	proxy *tcprelay.Relay // nil: no proxy (in a worker, or an endpoint it cannot stand in for)
	mu    sync.Mutex
	last  time.Time
}

func (c *proxyCutter) cut() int {
	if c.proxy == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.last) < chaosProxyEvery {
		return 0
	}
	n := c.proxy.CutSome(chaosProxyCut)
	if n > 0 { // none yet (the workers still starting): try again at the next fault
		c.last = time.Now()
	}
	return n
}

func (c *proxyCutter) close() {
	if c.proxy != nil {
		c.proxy.Close()
	}
}

// hostPort is u's host with its port, or with def when it names none.
func hostPort(u *url.URL, def string) string {
	if u.Port() != "" {
		return u.Host
	}
	return net.JoinHostPort(u.Hostname(), def)
}

// viaProxy returns raw with its host replaced by proxy (host:port).
func viaProxy(raw, proxy string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	u.Host = proxy
	return u.String(), nil
}

// retryOpen calls open until it succeeds, 40 times at most: a worker may
// start while the harness cuts its connections.
func retryOpen[T any](ctx context.Context, open func() (T, error)) (T, error) {
	for try := 0; ; try++ {
		v, err := open()
		if err == nil || try == 40 || ctx.Err() != nil {
			return v, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dynamoTarget is dynamostore on a table of the run's own (created by
// the harness, deleted at the end), opened as `idem --store dynamodb://`
// opens it. The workers reach an http:// endpoint (dynalite) through
// the harness's proxy, whose cuts are the store fault; DynamoDB itself
// has no means to drop a client's connection. DynamoDB has no DoTx: the
// transactional policy does not run on it. Its default queue is
// sqlQueueFile.
type dynamoTarget struct {
	t     chaosTarget
	s     *dynamostore.Store
	setup bool
	cut   proxyCutter
}

// dynamoURL is t.URL naming the run's table, with endpoint in place of
// its own when endpoint is not empty.
func dynamoURL(t *chaosTarget, endpoint string) (string, error) {
	u, err := url.Parse(t.URL)
	if err != nil {
		return "", err
	}
	u.Host = t.Schema
	if endpoint != "" {
		q := u.Query()
		q.Set("endpoint", endpoint)
		u.RawQuery = q.Encode()
	}
	return u.String(), nil
}

func openChaosDynamo(ctx context.Context, t *chaosTarget, setup bool) (*dynamoTarget, error) {
	d := &dynamoTarget{t: *t, setup: setup}
	u, err := url.Parse(t.URL)
	if err != nil {
		return nil, err
	}
	endpoint := ""
	if setup {
		if ep, err := url.Parse(u.Query().Get("endpoint")); err == nil && ep.Scheme == "http" && ep.Host != "" {
			if d.cut.proxy, err = tcprelay.Listen(hostPort(ep, "80")); err != nil {
				return nil, err
			}
			t.StoreProxy = d.cut.proxy.Addr()
		}
	} else if t.StoreProxy != "" {
		endpoint = "http://" + t.StoreProxy
	}
	raw, err := dynamoURL(t, endpoint)
	if err != nil {
		d.cut.close()
		return nil, err
	}
	// The harness creates the table (storeurl creates a missing one); a
	// worker only opens it.
	s, err := retryOpen(ctx, func() (store.Store, error) {
		return storeurl.New().Open(ctx, raw, storeurl.Options{MustExist: !setup})
	})
	if err != nil {
		d.cut.close()
		return nil, err
	}
	d.s = s.(*dynamostore.Store)
	return d, nil
}

func (d *dynamoTarget) Store() store.Store { return d.s }

func (d *dynamoTarget) DoTx(context.Context, *idem.Ledger, string, func(context.Context) error, func(context.Context) error, string, string) (idem.Result, error) {
	return idem.Result{}, errors.New("dynamostore has no DoTx")
}

func (d *dynamoTarget) Effects(context.Context) (map[string][]string, error) {
	return nil, errors.New("dynamostore has no DoTx")
}

// Fault cuts about a third of the workers' HTTP connections to DynamoDB
// at the proxy, at most once a second; none without a proxy (an https
// endpoint, or AWS's: a proxy cannot stand in for its certificate).
func (d *dynamoTarget) Fault(context.Context) (int, error) { return d.cut.cut(), nil }

func (d *dynamoTarget) FaultName() string {
	if d.cut.proxy == nil {
		return "none for DynamoDB without an http:// endpoint"
	}
	return "the workers' DynamoDB connections cut at a proxy"
}

func (d *dynamoTarget) Close() error {
	d.cut.close()
	if d.setup && d.s != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := d.s.Client().DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(d.s.Table())})
		return errors.Join(err, d.s.Close())
	}
	if d.s != nil {
		return d.s.Close()
	}
	return nil
}

// pgQueue is sqlqueue on PostgreSQL in a schema of the run's own
// (dropped at the end), beside a store that is elsewhere. Its fault is
// pg_terminate_backend of a third of the workers' connections.
type pgQueue struct {
	t     chaosTarget
	pool  *pgxpool.Pool
	h     *sqlqueue.Postgres
	setup bool
}

func (q *pgQueue) connName() string { return "idemchaosq-" + q.t.BrokerName }

func openChaosPGQueue(ctx context.Context, t chaosTarget, setup bool) (*pgQueue, error) {
	q := &pgQueue{t: t, setup: setup}
	cfg, err := pgxpool.ParseConfig(t.BrokerURL)
	if err != nil {
		return nil, err
	}
	if !setup {
		cfg.ConnConfig.RuntimeParams["application_name"] = q.connName()
		cfg.MaxConns = 6
	}
	if q.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	if setup {
		if _, err := q.pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{t.BrokerName}.Sanitize()); err != nil {
			q.Close()
			return nil, err
		}
	}
	if q.h, err = retryOpen(ctx, func() (*sqlqueue.Postgres, error) {
		return sqlqueue.NewPostgres(ctx, q.pool, sqlqueue.WithSchema(t.BrokerName), sqlqueue.WithLogger(slog.New(slog.DiscardHandler)))
	}); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

func (q *pgQueue) Source(ctx context.Context, vis time.Duration) (queue.Source, error) {
	return q.h.Queue(q.t.Queue, sqlqueue.WithVisibility(vis))
}

func (q *pgQueue) Publisher(ctx context.Context, vis time.Duration) (queue.Publisher, error) {
	return q.h.Queue(q.t.Queue, sqlqueue.WithVisibility(vis))
}

func (q *pgQueue) Pending(ctx context.Context) (int64, int64, error) {
	qq, err := q.h.Queue(q.t.Queue)
	if err != nil {
		return 0, 0, err
	}
	st, err := qq.Stats(ctx)
	return st.Ready + st.InFlight + st.Delayed, st.DeadLettered, err
}

func (q *pgQueue) Fault(ctx context.Context) (int, error) {
	var n int
	err := q.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE application_name = $1 AND random() < 1.0/3`, q.connName()).Scan(&n)
	return n, err
}

func (q *pgQueue) FaultName() string {
	return "pg_terminate_backend of the workers' queue connections"
}

func (q *pgQueue) Close() error {
	if q.h != nil {
		q.h.Close()
	}
	if q.setup {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = q.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{q.t.BrokerName}.Sanitize()+" CASCADE")
	}
	q.pool.Close()
	return nil
}

// natsQueue is queue/jetstream on a work-queue stream of the run's own
// and its dead-letter stream (deleted at the end), with one durable pull
// consumer whose AckWait is the run's visibility. The workers connect
// through the harness's proxy: NATS has no means (without a system
// account) to drop a client's connection.
type natsQueue struct {
	t     chaosTarget
	nc    *nats.Conn
	js    njs.JetStream
	src   *jetstream.Source
	setup bool
	cut   proxyCutter
}

func (q *natsQueue) subject() string   { return "idemchaos." + q.t.BrokerName + ".q" }
func (q *natsQueue) dlSubject() string { return "idemchaos." + q.t.BrokerName + ".dl" }
func (q *natsQueue) dlStream() string  { return q.t.BrokerName + "_DL" }

func openChaosNATS(ctx context.Context, t *chaosTarget, setup bool) (*natsQueue, error) {
	q := &natsQueue{t: *t, setup: setup}
	u, err := url.Parse(t.BrokerURL)
	if err != nil {
		return nil, err
	}
	raw := t.BrokerURL
	opts := []nats.Option{nats.Name("idemchaos-" + t.BrokerName)}
	if setup {
		if q.cut.proxy, err = tcprelay.Listen(hostPort(u, "4222")); err != nil {
			return nil, err
		}
		t.Proxy = q.cut.proxy.Addr()
	} else {
		if raw, err = viaProxy(raw, t.Proxy); err != nil {
			return nil, err
		}
		// Reconnect at once, for ever, to the proxy only (not to a
		// server the first one names).
		opts = append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
			nats.IgnoreDiscoveredServers(), nats.RetryOnFailedConnect(false))
	}
	if q.nc, err = nats.Connect(raw, opts...); err != nil {
		q.cut.close()
		return nil, err
	}
	if q.js, err = njs.New(q.nc); err != nil {
		q.Close()
		return nil, err
	}
	if setup {
		if _, err := q.js.CreateStream(ctx, njs.StreamConfig{Name: t.BrokerName, Subjects: []string{q.subject()},
			Retention: njs.WorkQueuePolicy, Duplicates: time.Minute}); err != nil {
			q.Close()
			return nil, err
		}
		if _, err := q.js.CreateStream(ctx, njs.StreamConfig{Name: q.dlStream(), Subjects: []string{q.dlSubject()},
			Duplicates: time.Minute}); err != nil {
			q.Close()
			return nil, err
		}
		// No MaxDeliver: the consumer dead-letters a message past its
		// max receives, with a reason.
		if _, err := q.js.CreateOrUpdateConsumer(ctx, t.BrokerName, njs.ConsumerConfig{Durable: "workers",
			AckPolicy: njs.AckExplicitPolicy, AckWait: t.Visibility}); err != nil {
			q.Close()
			return nil, err
		}
	}
	return q, nil
}

func (q *natsQueue) Source(ctx context.Context, _ time.Duration) (queue.Source, error) {
	var err error
	q.src, err = retryOpen(ctx, func() (*jetstream.Source, error) {
		return jetstream.NewSource(ctx, q.js, jetstream.SourceConfig{Stream: q.t.BrokerName, Consumer: "workers",
			DeadLetterSubject: q.dlSubject(), PollWait: time.Second, Logger: slog.New(slog.DiscardHandler)})
	})
	return q.src, err
}

func (q *natsQueue) Publisher(context.Context, time.Duration) (queue.Publisher, error) {
	return jetstream.NewPublisher(q.js, q.subject())
}

// Pending is the JetStream's own count: a work-queue stream holds a
// message until it is acked (or dead-lettered, then acked).
func (q *natsQueue) Pending(ctx context.Context) (int64, int64, error) {
	var n [2]int64
	for i, name := range []string{q.t.BrokerName, q.dlStream()} {
		st, err := q.js.Stream(ctx, name)
		if err != nil {
			return 0, 0, err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return 0, 0, err
		}
		n[i] = int64(info.State.Msgs)
	}
	return n[0], n[1], nil
}

func (q *natsQueue) Fault(context.Context) (int, error) { return q.cut.cut(), nil }

func (q *natsQueue) FaultName() string { return "the workers' NATS connections cut at a proxy" }

func (q *natsQueue) Close() error {
	if q.src != nil {
		q.src.Close()
	}
	if q.setup && q.js != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = q.js.DeleteStream(ctx, q.t.BrokerName)
		_ = q.js.DeleteStream(ctx, q.dlStream())
	}
	if q.nc != nil {
		q.nc.Close()
	}
	q.cut.close()
	return nil
}

// amqpQueue is queue/amqpqueue on a classic durable queue of the run's
// own and its dead-letter queue (deleted at the end, with the delay
// queues its retries made). The workers dial through the harness's
// proxy, and redial when it cuts them; their unacked deliveries go back
// to the queue with the connection.
//
// AMQP 0-9-1 counts only a queue's ready messages, not the unacked ones
// (that needs the management plugin): Pending is the messages the
// harness published whose id no worker has set out to ack or
// dead-letter (the workers log each before they send it, in the run's
// directory: a worker killed just after its ack went out must not leave
// the message unsettled for ever), plus the ready messages of the queue
// and of its delay queues (where a retried message waits, with the same
// id). A settle that then failed counts: its ack may have reached the
// broker before the connection died (then the message never comes
// back); if it did not, the message comes back to the queue, and to a
// worker that replays its completed key. The dead letters are the dead-letter
// queue's own count.
type amqpQueue struct {
	t     chaosTarget
	cfg   amqpqueue.Config
	conn  *amqp.Connection // the harness's
	dir   string
	setup bool
	cut   proxyCutter

	mu        sync.Mutex
	published map[string]bool
	missing   map[string]time.Time // delay queues found missing, and when
	src       *amqpqueue.Source
	pub       *amqpqueue.Publisher
}

// amqpSettled is the file of the run's directory where the workers log
// each ack or dead-letter they set out to send: "ack ID" or "dead ID".
const amqpSettled = "settled"

func openChaosAMQP(ctx context.Context, t *chaosTarget, dir string, setup bool) (*amqpQueue, error) {
	q := &amqpQueue{t: *t, dir: dir, setup: setup, published: map[string]bool{}, missing: map[string]time.Time{},
		cfg: amqpqueue.Config{Queue: t.BrokerName, Prefetch: 8}}
	if !setup {
		return q, nil
	}
	u, err := url.Parse(t.BrokerURL)
	if err != nil {
		return nil, err
	}
	def := "5672"
	if u.Scheme == "amqps" {
		def = "5671"
	}
	if q.cut.proxy, err = tcprelay.Listen(hostPort(u, def)); err != nil {
		return nil, err
	}
	t.Proxy = q.cut.proxy.Addr()
	if q.conn, err = amqp.Dial(t.BrokerURL); err != nil {
		q.cut.close()
		return nil, err
	}
	if err := amqpqueue.Declare(ctx, q.conn, q.cfg); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

func (q *amqpQueue) Source(ctx context.Context, _ time.Duration) (queue.Source, error) {
	raw, err := viaProxy(q.t.BrokerURL, q.t.Proxy)
	if err != nil {
		return nil, err
	}
	f, err := openAppend(q.dir, amqpSettled)
	if err != nil {
		return nil, err
	}
	if q.src, err = retryOpen(ctx, func() (*amqpqueue.Source, error) {
		return amqpqueue.NewSourceDial(ctx, amqpqueue.DialURL(raw), q.cfg)
	}); err != nil {
		f.Close()
		return nil, err
	}
	return &wrappedSource{Source: q.src, wrap: func(d queue.Delivery) queue.Delivery { return &settleLogged{Delivery: d, f: f} }}, nil
}

func (q *amqpQueue) Publisher(context.Context, time.Duration) (queue.Publisher, error) {
	var err error
	if q.pub, err = amqpqueue.NewPublisher(q.conn, q.cfg); err != nil {
		return nil, err
	}
	return publishLog{q}, nil
}

// publishLog remembers the id of each message the harness published.
type publishLog struct{ q *amqpQueue }

func (p publishLog) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	res, err := p.q.pub.Publish(ctx, m)
	if err == nil {
		p.q.mu.Lock()
		p.q.published[res.ID] = true
		p.q.mu.Unlock()
	}
	return res, err
}

// settleLogged logs, one line each, every ack or dead-letter a worker
// sets out to send.
type settleLogged struct {
	queue.Delivery
	f *os.File
}

func (d *settleLogged) Ack(ctx context.Context) error {
	_ = appendLine(d.f, "ack %s", d.Message().ID)
	return d.Delivery.Ack(ctx)
}

func (d *settleLogged) DeadLetter(ctx context.Context, why string) error {
	_ = appendLine(d.f, "dead %s", d.Message().ID)
	return d.Delivery.DeadLetter(ctx, why)
}

func (q *amqpQueue) Pending(ctx context.Context) (int64, int64, error) {
	settled := map[string]bool{}
	if err := scanLines(filepath.Join(q.dir, amqpSettled), func(f []string) {
		if len(f) == 2 {
			settled[f[1]] = true
		}
	}); err != nil {
		return 0, 0, err
	}
	var unsettled int64
	q.mu.Lock()
	for id := range q.published {
		if !settled[id] {
			unsettled++
		}
	}
	q.mu.Unlock()
	ch, err := q.conn.Channel()
	if err != nil {
		return 0, 0, err
	}
	defer ch.Close()
	main, err := ch.QueueDeclarePassive(q.cfg.Queue, true, false, false, false, nil)
	if err != nil {
		return 0, 0, err
	}
	dead, err := ch.QueueDeclarePassive(q.cfg.Queue+".dead-letter", true, false, false, false, nil)
	if err != nil {
		return 0, 0, err
	}
	delayed, err := q.delayed()
	return unsettled + int64(main.Messages) + delayed, int64(dead.Messages), err
}

// delayed counts the ready messages of the delay queues. A delay queue
// that does not exist closes the channel that asked (404), so each is
// asked on a channel of its own, and one found missing is asked again
// only a second later.
func (q *amqpQueue) delayed() (int64, error) {
	var n int64
	for _, name := range q.delayQueues() {
		q.mu.Lock()
		skip := time.Since(q.missing[name]) < time.Second
		q.mu.Unlock()
		if skip {
			continue
		}
		ch, err := q.conn.Channel()
		if err != nil {
			return 0, err
		}
		dq, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			q.mu.Lock()
			q.missing[name] = time.Now()
			q.mu.Unlock()
			continue
		case err != nil:
			return 0, err
		}
		ch.Close()
		n += int64(dq.Messages)
	}
	return n, nil
}

// delayQueues names the delay queues the run's retries may declare (one
// per power of two milliseconds, up to about 70 minutes).
func (q *amqpQueue) delayQueues() []string {
	var names []string
	for k := range 23 {
		names = append(names, q.cfg.Queue+".delay."+strconv.Itoa(1<<k)+"ms")
	}
	return names
}

func (q *amqpQueue) Fault(context.Context) (int, error) { return q.cut.cut(), nil }

func (q *amqpQueue) FaultName() string { return "the workers' RabbitMQ connections cut at a proxy" }

func (q *amqpQueue) Close() error {
	if q.src != nil {
		q.src.Close()
	}
	if q.pub != nil {
		q.pub.Close()
	}
	if q.conn != nil {
		// The run's queues, and the delay queues its retries may have
		// declared: deleting a queue that does not exist is a no-op.
		names := append([]string{q.cfg.Queue, q.cfg.Queue + ".dead-letter"}, q.delayQueues()...)
		var ch *amqp.Channel
		for _, n := range names {
			if ch == nil || ch.IsClosed() {
				var err error
				if ch, err = q.conn.Channel(); err != nil {
					break
				}
			}
			_, _ = ch.QueueDelete(n, false, false, false)
		}
		if ch != nil {
			ch.Close()
		}
		q.conn.Close()
	}
	q.cut.close()
	return nil
}

// sqsQueue is queue/sqsqueue on a standard queue of the run's own and
// its dead-letter queue (deleted at the end), named by
// sqs://PREFIX?region=R&endpoint=URL as dynamodb:// names a table.
// With an http:// endpoint (local-aws-sqs) the workers reach it through
// the harness's proxy, whose cuts are the broker fault; an unacked
// message comes back when its visibility runs out. Pending and the dead
// letters are SQS's own counts (ApproximateNumberOf...).
type sqsQueue struct {
	t        chaosTarget
	client   *sqs.Client
	url, dlq string
	setup    bool
	cut      proxyCutter
}

// sqsClient opens an SQS client as dynamodb:// opens DynamoDB's: the AWS
// SDK's usual chain, the URL's region and endpoint.
func sqsClient(ctx context.Context, raw, endpoint string) (*sqs.Client, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	var opts []func(*config.LoadOptions) error
	if r := u.Query().Get("region"); r != "" {
		opts = append(opts, config.WithRegion(r))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("loading the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, errors.New("no AWS region: add ?region=REGION or set AWS_REGION")
	}
	if endpoint == "" {
		endpoint = u.Query().Get("endpoint")
	}
	return sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	}), nil
}

func openChaosSQS(ctx context.Context, t *chaosTarget, setup bool) (*sqsQueue, error) {
	q := &sqsQueue{t: *t, setup: setup}
	endpoint := ""
	var err error
	if setup {
		u, err := url.Parse(t.BrokerURL)
		if err != nil {
			return nil, err
		}
		if ep, err := url.Parse(u.Query().Get("endpoint")); err == nil && ep.Scheme == "http" && ep.Host != "" {
			if q.cut.proxy, err = tcprelay.Listen(hostPort(ep, "80")); err != nil {
				return nil, err
			}
			t.Proxy = q.cut.proxy.Addr()
		}
	} else if t.Proxy != "" {
		endpoint = "http://" + t.Proxy
	}
	if q.client, err = sqsClient(ctx, t.BrokerURL, endpoint); err != nil {
		q.cut.close()
		return nil, err
	}
	if setup {
		dlq, err := q.client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(t.BrokerName + "-dlq")})
		if err != nil {
			q.cut.close()
			return nil, err
		}
		q.dlq = aws.ToString(dlq.QueueUrl)
		out, err := q.client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(t.BrokerName),
			Attributes: map[string]string{"VisibilityTimeout": strconv.Itoa(int((t.Visibility + time.Second - 1) / time.Second))}})
		if err != nil {
			q.Close()
			return nil, err
		}
		q.url = aws.ToString(out.QueueUrl)
		return q, nil
	}
	for i, name := range []string{t.BrokerName, t.BrokerName + "-dlq"} {
		out, err := retryOpen(ctx, func() (*sqs.GetQueueUrlOutput, error) {
			return q.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
		})
		if err != nil {
			return nil, err
		}
		if i == 0 {
			q.url = aws.ToString(out.QueueUrl)
		} else {
			q.dlq = aws.ToString(out.QueueUrl)
		}
	}
	return q, nil
}

func (q *sqsQueue) open(ctx context.Context, vis time.Duration) (*sqsqueue.Queue, error) {
	return retryOpen(ctx, func() (*sqsqueue.Queue, error) {
		return sqsqueue.Open(ctx, q.client, q.url, sqsqueue.Options{Visibility: vis, DeadLetterURL: q.dlq, WaitTime: 2 * time.Second})
	})
}

func (q *sqsQueue) Source(ctx context.Context, vis time.Duration) (queue.Source, error) {
	return q.open(ctx, vis)
}

func (q *sqsQueue) Publisher(ctx context.Context, vis time.Duration) (queue.Publisher, error) {
	return q.open(ctx, vis)
}

func (q *sqsQueue) Pending(ctx context.Context) (int64, int64, error) {
	count := func(u string, names ...types.QueueAttributeName) (int64, error) {
		out, err := q.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(u), AttributeNames: names})
		if err != nil {
			return 0, err
		}
		var n int64
		for _, name := range names {
			v, err := strconv.ParseInt(out.Attributes[string(name)], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s of %s: %q", name, u, out.Attributes[string(name)])
			}
			n += v
		}
		return n, nil
	}
	pending, err := count(q.url, types.QueueAttributeNameApproximateNumberOfMessages,
		types.QueueAttributeNameApproximateNumberOfMessagesNotVisible, types.QueueAttributeNameApproximateNumberOfMessagesDelayed)
	if err != nil {
		return 0, 0, err
	}
	dead, err := count(q.dlq, types.QueueAttributeNameApproximateNumberOfMessages)
	return pending, dead, err
}

func (q *sqsQueue) Fault(context.Context) (int, error) { return q.cut.cut(), nil }

func (q *sqsQueue) FaultName() string {
	if q.cut.proxy == nil {
		return "none for SQS without an http:// endpoint"
	}
	return "the workers' SQS connections cut at a proxy"
}

func (q *sqsQueue) Close() error {
	if q.setup {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, u := range []string{q.url, q.dlq} {
			if u != "" {
				_, _ = q.client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(u)})
			}
		}
	}
	q.cut.close()
	return nil
}
