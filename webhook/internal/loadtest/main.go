// Command loadtest measures the webhook Receiver from a second process on
// loopback: Standard Webhooks requests, each signed when it is sent, a share
// of them duplicates of earlier events (new timestamp and signature, same
// id), against (1) a bare server that reads the body and answers 200 doing
// nothing, then (2) the Receiver verifying, deduplicating and capturing into
// a queue in the ledger's SQLite file. It prints both and their ratio.
//
//	go run ./webhook/internal/loadtest -duration 10s -conns 32 -dup 0.2
//
// The servers run as child processes of this one (the same binary with
// -serve), so the load generator and the server are separate processes
// sharing the machine's cores, as wrk would.
package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/idemkit/idem/webhook"
)

// serverArgs are passed on to the server processes.
var serverArgs []string

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func main() {
	serve := flag.String("serve", "", "run a server: bare or receiver (internal)")
	capture := flag.String("capture", "tx", "receiver capture: sqlqueue-tx (PublishTx to queue/sqlqueue in the store's transaction), sqlqueue-tx-nodedup (the same, the queue's dedup window off: the ledger's claim in the transaction is the dedup), sqlqueue (Publish to queue/sqlqueue in the store's file, group commit, shared write turn), tx (PublishTx to a table of the store's file), plain (Publish to a table of the store's file, one commit per message) or plain-batched (Publish to a queue file of its own, group commit)")
	syncMode := flag.String("sync", "FULL", "SQLite synchronous mode: FULL or NORMAL")
	dir := flag.String("dir", "", "directory for the database (default: a temporary one)")
	duration := flag.Duration("duration", 10*time.Second, "how long each load runs")
	warmup := flag.Duration("warmup", 2*time.Second, "load before measuring")
	conns := flag.Int("conns", 32, "concurrent connections")
	dup := flag.Float64("dup", 0.2, "share of requests that repeat an earlier event")
	body := flag.Int("body", 512, "body size in bytes")
	only := flag.String("only", "", "run only this server (bare or receiver)")
	profile := flag.String("cpuprofile", "", "server: write a CPU profile of the first -profiletime to this file")
	profileTime := flag.Duration("profiletime", 8*time.Second, "server: how long to profile")
	flag.Parse()

	if *serve != "" {
		if *profile != "" {
			f, err := os.Create(*profile)
			if err != nil {
				log.Fatal(err)
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				log.Fatal(err)
			}
			time.AfterFunc(*profileTime, func() { pprof.StopCPUProfile(); f.Close() })
		}
		runServer(*serve, *capture, *syncMode, *dir)
		return
	}
	serverArgs = nil
	if *profile != "" {
		serverArgs = []string{"-cpuprofile", *profile, "-profiletime", profileTime.String()}
	}
	var results []result
	for _, mode := range []string{"bare", "receiver"} {
		if *only != "" && mode != *only {
			continue
		}
		r, err := measure(mode, *capture, *syncMode, *dir, *duration, *warmup, *conns, *dup, *body)
		if err != nil {
			log.Fatal(err)
		}
		results = append(results, r)
		fmt.Println(r)
	}
	if len(results) == 2 {
		fmt.Printf("ratio receiver/bare: %.3f (throughput), %.2f (server CPU per request)\n",
			results[1].rps/results[0].rps, float64(results[1].cpuPerReq)/float64(results[0].cpuPerReq))
	}
}

// runServer serves on 127.0.0.1:0 and prints its address on stdout.
func runServer(mode, capture, syncMode, dir string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	var h http.Handler
	switch mode {
	case "bare":
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"status":"accepted"}`))
		})
	case "receiver":
		h = newReceiver(capture, syncMode, dir)
	default:
		log.Fatalf("unknown server %q", mode)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second}
	fmt.Println(ln.Addr().String())
	log.Fatal(srv.Serve(ln))
}

func newReceiver(capture, syncMode, dir string) http.Handler {
	ctx := context.Background()
	if dir == "" {
		d, err := os.MkdirTemp("", "webhook-load-")
		if err != nil {
			log.Fatal(err)
		}
		dir = d
	}
	st, err := sqlitestore.Open(ctx, filepath.Join(dir, fmt.Sprintf("idem-%d.db", os.Getpid())),
		sqlitestore.WithSynchronous(sqlitestore.Synchronous(syncMode)))
	if err != nil {
		log.Fatal(err)
	}
	q, err := newTableQueue(st.DB())
	if err != nil {
		log.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	l := idem.New(st, idem.WithLogger(quiet), idem.WithCache(1<<16))
	var c webhook.Capture
	switch capture {
	case "tx":
		c = webhook.PublishTx[*sql.Tx](q)
	case "plain":
		c = webhook.Publish(q)
	case "sqlqueue-tx", "sqlqueue-tx-nodedup", "sqlqueue":
		qs, err := sqlqueue.NewSQLite(ctx, st.DB(), sqlqueue.WithGroupCommit(st), sqlqueue.WithLogger(quiet))
		if err != nil {
			log.Fatal(err)
		}
		var qopts []sqlqueue.QueueOption
		if capture == "sqlqueue-tx-nodedup" {
			// The claim in the same transaction already makes the capture
			// exactly once: the queue's own dedup table is redundant.
			qopts = append(qopts, sqlqueue.WithDedupWindow(0))
		}
		sq, err := qs.Queue("webhooks", qopts...)
		if err != nil {
			log.Fatal(err)
		}
		if capture != "sqlqueue" {
			c = webhook.PublishTx[*sql.Tx](sq)
		} else {
			c = webhook.Publish(sq)
		}
	case "plain-batched":
		bq, err := newBatchQueue(filepath.Join(dir, fmt.Sprintf("queue-%d.db", os.Getpid())), syncMode)
		if err != nil {
			log.Fatal(err)
		}
		c = webhook.Publish(bq)
	default:
		log.Fatalf("unknown capture %q", capture)
	}
	s, err := webhook.NewStandard(secret)
	if err != nil {
		log.Fatal(err)
	}
	r, err := webhook.NewReceiver("load", s, l, c, webhook.WithLogger(quiet))
	if err != nil {
		log.Fatal(err)
	}
	return r
}

// tableQueue is a queue table in the ledger's SQLite file (one row per
// message), standing in for queue/sqlqueue until it lands on main.
type tableQueue struct {
	db  *sql.DB
	ins *sql.Stmt
}

func newTableQueue(db *sql.DB) (*tableQueue, error) {
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS webhook_load_queue (
		id INTEGER PRIMARY KEY, dedup_id TEXT NOT NULL, body BLOB NOT NULL, attrs TEXT NOT NULL)`); err != nil {
		return nil, err
	}
	ins, err := db.Prepare(`INSERT INTO webhook_load_queue (dedup_id, body, attrs) VALUES (?, ?, ?)`)
	if err != nil {
		return nil, err
	}
	return &tableQueue{db: db, ins: ins}, nil
}

func attrs(m queue.Outgoing) string {
	var b strings.Builder
	for k, v := range m.Attributes {
		b.WriteString(k + "=" + v + "\n")
	}
	return b.String()
}

func (q *tableQueue) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	res, err := q.ins.ExecContext(ctx, m.DedupID, m.Body, attrs(m))
	if err != nil {
		return queue.Published{}, err
	}
	id, _ := res.LastInsertId()
	return queue.Published{ID: fmt.Sprint(id)}, nil
}

func (q *tableQueue) PublishTx(ctx context.Context, tx *sql.Tx, m queue.Outgoing) (queue.Published, error) {
	res, err := tx.StmtContext(ctx, q.ins).ExecContext(ctx, m.DedupID, m.Body, attrs(m))
	if err != nil {
		return queue.Published{}, err
	}
	id, _ := res.LastInsertId()
	return queue.Published{ID: fmt.Sprint(id)}, nil
}

type result struct {
	mode          string
	n             int
	rps           float64
	p50, p99, max time.Duration
	statuses      map[int]int
	replayed      int
	errors        int
	cpuPerReq     time.Duration // the server process's CPU time per request
}

func (r result) String() string {
	return fmt.Sprintf("%-8s %8.0f req/s  server CPU %v/req  n=%d  p50=%v p99=%v max=%v  statuses=%v replayed=%d errors=%d",
		r.mode, r.rps, r.cpuPerReq.Round(time.Microsecond), r.n, r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), r.max.Round(10*time.Microsecond),
		r.statuses, r.replayed, r.errors)
}

// measure starts the server as a child process, loads it, stops it.
func measure(mode, capture, syncMode, dir string, duration, warmup time.Duration, conns int, dup float64, bodySize int) (result, error) {
	self, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	args := append([]string{"-serve", mode, "-capture", capture, "-sync", syncMode}, serverArgs...)
	if dir != "" {
		args = append(args, "-dir", dir)
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return result{}, err
	}
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return result{}, fmt.Errorf("server did not start: %w", err)
	}
	url := "http://" + strings.TrimSpace(addr) + "/hooks"
	s, err := webhook.NewStandard(secret)
	if err != nil {
		return result{}, err
	}
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	pad := strings.Repeat("x", max(bodySize-60, 0))

	var (
		next     atomic.Int64 // events created so far
		measured atomic.Bool
		stop     atomic.Bool
		mu       sync.Mutex
		lat      []time.Duration
		statuses = map[int]int{}
		replayed int
		errs     int
	)
	worker := func(seed uint64) {
		rng := rand.New(rand.NewPCG(seed, seed*7+1))
		var local []time.Duration
		localStatus := map[int]int{}
		localReplayed, localErrs := 0, 0
		for !stop.Load() {
			var ev int64
			if n := next.Load(); n > 100 && rng.Float64() < dup {
				ev = n - 1 - rng.Int64N(min(n-1, 1000)) // a recent event again
			} else {
				ev = next.Add(1)
			}
			id := fmt.Sprintf("msg_%d_%d", os.Getpid(), ev)
			body := fmt.Sprintf(`{"type":"invoice.paid","id":%q,"pad":%q}`, id, pad)
			now := time.Now()
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Webhook-Id", id)
			req.Header.Set("Webhook-Timestamp", fmt.Sprint(now.Unix()))
			req.Header.Set("Webhook-Signature", s.Sign(id, now, []byte(body)))
			start := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				localErrs++
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			d := time.Since(start)
			if measured.Load() {
				local = append(local, d)
				localStatus[resp.StatusCode]++
				if resp.Header.Get(webhook.ReplayedHeader) == "true" {
					localReplayed++
				}
			}
		}
		mu.Lock()
		lat = append(lat, local...)
		for k, v := range localStatus {
			statuses[k] += v
		}
		replayed += localReplayed
		errs += localErrs
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() { worker(uint64(i + 1)) })
	}
	time.Sleep(warmup)
	cpu0 := procCPU(cmd.Process.Pid)
	measured.Store(true)
	t0 := time.Now()
	time.Sleep(duration)
	measured.Store(false)
	elapsed := time.Since(t0)
	cpu := procCPU(cmd.Process.Pid) - cpu0
	stop.Store(true)
	wg.Wait()
	if len(lat) == 0 {
		return result{}, errors.New("no request completed")
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(int(float64(len(lat))*p), len(lat)-1)] }
	return result{mode: mode, n: len(lat), rps: float64(len(lat)) / elapsed.Seconds(),
		p50: pct(0.50), p99: pct(0.99), max: lat[len(lat)-1], statuses: statuses, replayed: replayed, errors: errs,
		cpuPerReq: cpu / time.Duration(len(lat))}, nil
}

// batchQueue is a queue in a SQLite file of its own whose writer commits
// every publish queued meanwhile in one transaction (group commit), as
// queue/sqlqueue's SQLite writer does.
type batchQueue struct {
	db   *sql.DB
	ins  *sql.Stmt
	reqs chan pubReq
}

type pubReq struct {
	m    queue.Outgoing
	done chan pubRes
}

type pubRes struct {
	p   queue.Published
	err error
}

func newBatchQueue(path, syncMode string) (*batchQueue, error) {
	db, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)&_pragma=synchronous("+syncMode+")&_pragma=busy_timeout(10000)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS webhook_load_queue (
		id INTEGER PRIMARY KEY, dedup_id TEXT NOT NULL, body BLOB NOT NULL, attrs TEXT NOT NULL)`); err != nil {
		return nil, err
	}
	ins, err := db.Prepare(`INSERT INTO webhook_load_queue (dedup_id, body, attrs) VALUES (?, ?, ?)`)
	if err != nil {
		return nil, err
	}
	q := &batchQueue{db: db, ins: ins, reqs: make(chan pubReq, 1024)}
	go q.loop()
	return q, nil
}

func (q *batchQueue) loop() {
	batch := make([]pubReq, 0, 256)
	for first := range q.reqs {
		batch = append(batch[:0], first)
	fill:
		for len(batch) < cap(batch) {
			select {
			case r := <-q.reqs:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		res := make([]pubRes, len(batch))
		tx, err := q.db.Begin()
		if err == nil {
			ins := tx.Stmt(q.ins)
			for i, r := range batch {
				var x sql.Result
				x, err = ins.Exec(r.m.DedupID, r.m.Body, attrs(r.m))
				if err != nil {
					break
				}
				id, _ := x.LastInsertId()
				res[i].p = queue.Published{ID: fmt.Sprint(id)}
			}
			if err == nil {
				err = tx.Commit()
			} else {
				_ = tx.Rollback()
			}
		}
		for i, r := range batch {
			if err != nil {
				res[i] = pubRes{err: err}
			}
			r.done <- res[i]
		}
	}
}

func (q *batchQueue) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	done := make(chan pubRes, 1)
	select {
	case q.reqs <- pubReq{m: m, done: done}:
	case <-ctx.Done():
		return queue.Published{}, ctx.Err()
	}
	select {
	case r := <-done:
		return r.p, r.err
	case <-ctx.Done():
		return queue.Published{}, ctx.Err()
	}
}

// procCPU is the user+system CPU time of process pid so far (Linux).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which is in parentheses): utime is the
	// 14th field of the line, stime the 15th, in clock ticks (100/s).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if len(f) < 13 {
		return 0
	}
	var ut, st int64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return time.Duration(ut+st) * 10 * time.Millisecond
}
