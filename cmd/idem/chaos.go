package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkit/idem/cmd/idem/internal/storeurl"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store"
)

var chaosCmd = &command{
	name:     "chaos",
	synopsis: "[--queue Q] [--policies P,..] [--faults F,..] [--keys N] [--workers N] [--handlers N] [--duration D] [--seed N] [--restart-store CMD] [--json FILE] [--report DIR]",
	summary:  "prove each policy's guarantee on a real pipeline under crashes and faults",
	help: `
Chaos runs a real pipeline under faults and checks each policy's
guarantee (docs/guarantees.md). For each policy it publishes every key 1-5
times onto a queue, runs --workers worker processes (this binary again),
each a queue.Consumer whose effect is recorded in a sink the harness reads
afterwards, injects the faults, waits until the queue is drained, and
checks every key's effects against its record:

  transactional, reconcile  every key exactly once
  at_least_once             no key lost; every duplicate made by an attempt
                            that lost its lease between its effect and its
                            completion (its worker killed, frozen, or cut
                            off from the store past its lease, which its
                            log says: lease-lost, or a store-error on the
                            write that ends it), and taken over
                            (journalled as a takeover)
  at_most_once              no key twice; every key without its effect is
                            indeterminate, listed by 'idem ls --stuck', and
                            left by an attempt that lost its lease so

The store: the embedded default, sqlitestore and sqlqueue in one SQLite
file in a temporary directory, removed at the end (--keep-dir keeps it);
--store postgres://... runs pgstore and sqlqueue in that database (a
schema per policy, dropped at the end); --store redis://... runs
redisstore (a key prefix per policy, deleted at the end), and --store
dynamodb://TABLE?region=R&endpoint=URL dynamostore (a table
TABLE-PID-POLICY per policy, deleted at the end), each with sqlqueue in a
SQLite file as the broker, every policy but transactional (it needs
idem.DoTx, which only the SQL stores have).

The queue (--queue), with any store: sqlqueue (the default, as above);
postgres://... sqlqueue on PostgreSQL, in a schema per policy; nats://...
JetStream, a work-queue stream and a dead-letter stream per policy;
amqp://... RabbitMQ, a queue and its dead-letter queue per policy;
sqs://PREFIX?region=R&endpoint=URL SQS, a queue PREFIX-PID-POLICY and its
dead-letter queue. All are deleted at the end. The workers reach JetStream,
RabbitMQ, SQS and DynamoDB (an http:// endpoint) through a TCP proxy of
the harness, which the faults cut.

Where the queue is sqlqueue in the store's database (the embedded default,
PostgreSQL) it is made with sqlqueue.WithLedger (--fused=false: apart),
so that receive and claim commit together, and complete and ack.

The sink: an O_APPEND file (at_least_once, at_most_once); a
SQLite file that honours fences and answers the Reconcile hook
(reconcile); a row written in the ledger's transaction by idem.DoTx
(transactional: a receive loop settles each message by DoTx's answer).

Faults (--faults, default all but outbox-relay-kill and store-restart),
on a schedule drawn from --seed (the same seed gives the same keys, copies and faults; the
timing of the processes is the machine's):

  kill-before-effect   a worker SIGKILLs itself in the handler, before the
                       effect, for a scheduled key
  kill-after-effect    ... after the effect, before its completion
  kill-after-complete  ... after the completion, before the ack (on the
                       fused path completion and ack are one commit: after
                       both, and nothing may come back)
  stop                 SIGSTOP of a worker past its lease, then SIGCONT
  short-visibility     the handler outlives the message's visibility, which
                       is not extended: another worker receives it meanwhile
  store-cut            the store's and broker's connections broken (SQLite:
                       another connection holds the write lock past the
                       workers' busy timeout; PostgreSQL:
                       pg_terminate_backend; Redis: CLIENT KILL;
                       DynamoDB, JetStream, RabbitMQ, SQS: a third of the
                       workers' connections closed at the proxy, at most
                       once a second), every --cut-every on average
  outbox-relay-kill    (not by default) the producer writes every message
                       into an outbox
                       (outbox.PublishTx into a sqlqueue queue beside the
                       run's queue) and relay processes run outbox.Relay
                       to the queue; a relay SIGKILLs itself after a
                       confirmed publish, before the outbox ack, for a
                       scheduled key; the next relay publishes it again
                       (the queue drops it by its dedup id for an even
                       key, delivers it for an odd one: the ledger
                       absorbs it)
  store-restart        --restart-store CMD runs CMD (sh -c) every third of
                       --duration (2 s - 30 s) to restart the store's server
                       (PostgreSQL or Redis; the data must survive it, e.g.
                       Redis with appendonly); only with --restart-store,
                       which adds it to the default faults

Each scheduled fault strikes one key in --fault-every. A killed worker or
relay is replaced. --synchronous normal runs the SQLite files with
synchronous=NORMAL (a commit survives a process crash, every fault here,
not a power loss). Each policy prints a line of
figures, then a table per policy and per fault kind (and the outbox's and
the restarts' figures); --json FILE writes every figure, --report DIR a
PNG chart and an HTML page. Exit 1 when a guarantee broke.`,
	exits: `  0    every policy kept its guarantee
  1    a guarantee broke (the table says which key and why), or the run
       failed (a worker could not start, the queue did not drain)
  2    usage error
  130  interrupted (Ctrl-C)`,
	run: runChaos,
}

// chaosOptions are the command's flags.
type chaosOptions struct {
	policies     []string
	faults       []string
	keys         int
	workers      int
	handlers     int // handlers per worker at once
	duration     time.Duration
	lease        time.Duration
	visibility   time.Duration
	seed         uint64
	jsonFile     string
	reportDir    string
	keepDir      bool
	broken       bool
	exe          string        // the worker binary (default: this one)
	cutEvery     time.Duration // --cut-every: the mean time between store cuts
	faultEvery   int           // --fault-every: one key in N gets each scheduled fault
	sync         string        // --synchronous: the SQLite files' synchronous setting
	fused        bool          // --fused: sqlqueue.WithLedger where the queue is in the store's database
	pgURL        string        // --store postgres://...: pgstore and sqlqueue there
	redisURL     string        // --store redis://...: redisstore, and sqlqueue in a SQLite file
	restartStore string        // --restart-store: the shell command that restarts the store's server
	dynamoURL    string        // --store dynamodb://...: dynamostore, and sqlqueue in a SQLite file
	broker       string        // --queue: "" (the store's sqlqueue), "postgres", "nats", "amqp", "sqs"
	queueURL     string        // --queue's URL
}

// The causes of an effect whose worker lived but could not reach the
// store, found by its attempt id in the workers' log (cutOffAttempts). To
// the store such a worker is one frozen past its lease.
const (
	// chaosLeaseLost: its heartbeats could not reach the store (a store
	// fault) for a whole lease, and the ledger logged lease-lost.
	chaosLeaseLost = "lease-lost: store unreachable past the lease"
	// chaosNotRecorded: fn returned, but the store could not take the
	// write that ends the attempt within the ledger's finish timeout, and
	// the ledger logged store-error for it; the lease then ran out.
	chaosNotRecorded = "store-error: its end not recorded"
)

// The defaults of the sizing flags, which the command that repeats a run
// (chaosCommandLine) leaves out.
const (
	chaosDefaultHandlers   = 4
	chaosDefaultFaultEvery = 500
	chaosDefaultCutEvery   = 300 * time.Millisecond
	chaosDefaultSync       = "full"
)

// chaosPublishers is how many messages the producer publishes at once.
const chaosPublishers = 8

var chaosPolicies = []string{"at_least_once", "at_most_once", "reconcile", "transactional"}

func runChaos(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	o := chaosOptions{}
	policies := fs.String("policies", strings.Join(chaosPolicies, ","), "the `policies` to run, comma-separated")
	faults := fs.String("faults", strings.Join(defaultChaosFaults, ","), "the `faults` to inject, comma-separated, or none (outbox-relay-kill and store-restart only when named; store-restart needs --restart-store)")
	fs.IntVar(&o.keys, "keys", 200, "how many keys per policy (`N`); each is published 1-5 times")
	fs.IntVar(&o.workers, "workers", 3, "worker processes alive at once (`N`)")
	fs.IntVar(&o.handlers, "handlers", chaosDefaultHandlers, "messages each worker handles at once (`N`)")
	fs.StringVar(&o.sync, "synchronous", chaosDefaultSync, "SQLite's synchronous `mode` for the ledger's and the sink's files: full (the default, an acknowledged write survives a power loss) or normal (it survives a process crash, which is all the faults here are)")
	o.duration = 10 * time.Second
	fs.Var(durationValue{&o.duration}, "duration", "how long the messages arrive and the faults go on, per policy (`D`)")
	o.lease = 3 * time.Second
	fs.Var(durationValue{&o.lease}, "lease", "the workers' lease (`D`)")
	o.visibility = 4 * time.Second
	fs.Var(durationValue{&o.visibility}, "visibility", "the queue's visibility timeout (`D`)")
	fs.Uint64Var(&o.seed, "seed", 1, "the schedule's seed (`N`): keys, copies, faults")
	fs.IntVar(&o.faultEvery, "fault-every", chaosDefaultFaultEvery, "each scheduled fault (the kills, short-visibility) strikes one key in `N`, at least 6 keys and at most one in 25")
	o.cutEvery = chaosDefaultCutEvery
	fs.Var(durationValue{&o.cutEvery}, "cut-every", "the mean time between two store cuts (`D`; each 1/2 D to 3/2 D after the last)")
	fs.StringVar(&o.jsonFile, "json", "", "write the figures as JSON to `FILE` (- for stdout)")
	fs.StringVar(&o.reportDir, "report", "", "write chart.png and index.html into `DIR`")
	fs.BoolVar(&o.keepDir, "keep-dir", false, "keep the run's directory (database, sink, logs) and print its path")
	fs.BoolVar(&o.fused, "fused", true, "where the queue lives in the store's database (embedded, PostgreSQL), make it with sqlqueue.WithLedger: receive and claim commit together, and complete and ack (--fused=false: each its own write)")
	queueName := fs.String("queue", "sqlqueue", "the `queue`: sqlqueue (in the store's database; beside Redis and DynamoDB, in a SQLite file), or postgres://..., nats://..., amqp://..., sqs://PREFIX?region=R&endpoint=URL")
	fs.StringVar(&o.restartStore, "restart-store", "", "restart the store's server with `CMD` (run by sh -c) during the run: the store-restart fault (off by default)")
	fs.BoolVar(&o.broken, "broken-ledger", false, "workers skip the shared ledger (each keeps its own in memory): shows that the checker catches broken guarantees")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if a.storeExplicit {
		scheme, _, _ := strings.Cut(a.storeURL, ":")
		switch strings.ToLower(scheme) {
		case "postgres", "postgresql":
			o.pgURL = strings.ToLower(scheme) + a.storeURL[len(scheme):]
		case "redis", "rediss":
			o.redisURL = strings.ToLower(scheme) + a.storeURL[len(scheme):]
		case "dynamodb":
			o.dynamoURL = strings.ToLower(scheme) + a.storeURL[len(scheme):]
			if urlHost(o.dynamoURL) == "" {
				return usagef("--store: write dynamodb://TABLE?region=REGION (and &endpoint=URL for an emulator); the run's tables are named TABLE-PID-POLICY")
			}
		default:
			return usagef("--store: chaos runs on the embedded default, PostgreSQL (postgres://...), Redis (redis://...) or DynamoDB (dynamodb://...), not %s", storeurl.Redact(a.storeURL))
		}
	}
	if err := o.parseQueue(*queueName); err != nil {
		return err
	}
	for p := range strings.SplitSeq(*policies, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if !slices.Contains(chaosPolicies, p) {
			return usagef("--policies: unknown policy %q (want %s)", p, strings.Join(chaosPolicies, ", "))
		}
		o.policies = append(o.policies, p)
	}
	if noTx := o.storeWithoutDoTx(); noTx != "" && slices.Contains(o.policies, "transactional") {
		explicit := false
		fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "policies" })
		if explicit {
			return usagef("--policies: transactional needs idem.DoTx, which %s has not", noTx)
		}
		o.policies = slices.DeleteFunc(o.policies, func(p string) bool { return p == "transactional" })
	}
	if len(o.policies) == 0 {
		return usagef("--policies: name at least one policy")
	}
	if *faults != "none" {
		for f := range strings.SplitSeq(*faults, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			if !slices.Contains(allChaosFaults, f) {
				return usagef("--faults: unknown fault %q (want %s, or none)", f, strings.Join(allChaosFaults, ", "))
			}
			o.faults = append(o.faults, f)
		}
	}
	faultsGiven := false
	fs.Visit(func(f *flag.Flag) { faultsGiven = faultsGiven || f.Name == "faults" })
	if err := checkRestartFlag(&o, faultsGiven); err != nil {
		return err
	}
	if o.broker != "" && slices.Contains(o.faults, faultRelayKill) {
		return usagef("--faults: outbox-relay-kill keeps its outbox in sqlqueue beside the run's queue, so it runs with the default --queue sqlqueue, not %s", o.broker)
	}
	switch {
	case o.keys < 1:
		return usagef("--keys must be at least 1")
	case o.workers < 1:
		return usagef("--workers must be at least 1")
	case o.handlers < 1:
		return usagef("--handlers must be at least 1")
	case o.sync != "full" && o.sync != "normal":
		return usagef("--synchronous must be full or normal, not %q", o.sync)
	case o.duration < time.Second:
		return usagef("--duration must be at least 1s")
	case o.lease < 500*time.Millisecond:
		return usagef("--lease must be at least 500ms")
	case o.faultEvery < 1:
		return usagef("--fault-every must be at least 1")
	case o.cutEvery < 10*time.Millisecond:
		return usagef("--cut-every must be at least 10ms")
	case o.visibility < time.Second:
		return usagef("--visibility must be at least 1s")
	}
	if o.exe, err = os.Executable(); err != nil {
		return err
	}
	rep, err := chaosRun(ctx, o, a.stdout)
	if err != nil {
		return err
	}
	if err := writeChaosTables(a.stdout, rep); err != nil {
		return err
	}
	if o.jsonFile != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		b = append(b, '\n')
		if o.jsonFile == "-" {
			_, err = a.stdout.Write(b)
		} else {
			err = os.WriteFile(o.jsonFile, b, 0o644)
		}
		if err != nil {
			return err
		}
	}
	if o.reportDir != "" {
		if err := writeChaosReport(o.reportDir, rep); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "report: %s\n", filepath.Join(o.reportDir, "index.html"))
	}
	if !rep.OK {
		var broke []string
		for _, p := range rep.Policies {
			if !p.OK {
				broke = append(broke, p.Policy)
			}
		}
		return &codeError{exitError, fmt.Errorf("a guarantee broke under %s", strings.Join(broke, ", "))}
	}
	return nil
}

// chaosReport is the figures of a run (--json).
type chaosReport struct {
	Seed       uint64               `json:"seed"`
	Target     string               `json:"target"`
	Faults     []string             `json:"faults"`
	Keys       int                  `json:"keys_per_policy"`
	Workers    int                  `json:"workers"`
	Duration   string               `json:"duration"`
	Lease      string               `json:"lease"`
	Visibility string               `json:"visibility"`
	Handlers   int                  `json:"handlers_per_worker"`
	CutEvery   string               `json:"cut_every"`
	FaultEvery int                  `json:"fault_every"`
	Sync       string               `json:"sqlite_synchronous"`
	Fused      bool                 `json:"fused"`
	FusedOff   bool                 `json:"fused_off,omitempty"` // --fused=false
	Queue      string               `json:"queue,omitempty"`     // --queue's URL, its password hidden
	Broken     bool                 `json:"broken_ledger,omitempty"`
	Policies   []*chaosPolicyReport `json:"policies"`
	OK         bool                 `json:"ok"`
}

// chaosPolicyReport is one policy's run.
type chaosPolicyReport struct {
	Policy    string `json:"policy"`
	Guarantee string `json:"guarantee"`
	Keys      int    `json:"keys"`
	Messages  int    `json:"messages"`
	Effects   int    `json:"effects"`
	// KeysBy: keys with 0, 1 and 2+ effects.
	KeysWith0  int `json:"keys_with_0_effects"`
	KeysWith1  int `json:"keys_with_1_effect"`
	KeysWith2  int `json:"keys_with_2_or_more"`
	Duplicates int `json:"duplicates"`
	// DuplicateCauses counts the duplicates by the fault that caused
	// each (the kill or freeze of the worker whose attempt made it).
	DuplicateCauses map[string]int `json:"duplicate_causes"`
	DuplicateList   []chaosEffect  `json:"duplicate_effects,omitempty"` // the first 100
	Indeterminate   int            `json:"indeterminate"`
	// IndeterminateWhy counts the keys left indeterminate by cause.
	IndeterminateWhy map[string]int `json:"indeterminate_causes"`
	ListedStuck      int            `json:"listed_by_ls_stuck"`
	Lost             int            `json:"lost"`
	DeadLetters      int            `json:"dead_letters"`
	// FaultsInjected counts the faults by kind: kills that fired, freezes,
	// keys whose visibility ran out, connection faults, relay kills,
	// store restarts.
	FaultsInjected map[string]int `json:"faults_injected"`
	// Outbox: the outbox-relay-kill fault's figures (nil without it).
	Outbox *chaosOutboxReport `json:"outbox,omitempty"`
	// Restart: the store-restart fault's figures (nil without it).
	Restart *chaosRestartReport `json:"store_restart,omitempty"`
	// ConnectionCuts splits the store-cut faults: connections broken (or
	// write locks held) on the store's side and on the broker's; with
	// the queue in the store's database, all are the store's.
	ConnectionCuts  map[string]int `json:"connection_cuts,omitempty"`
	WorkersStarted  int            `json:"workers_started"`
	Took            string         `json:"took"`
	Throughput      float64        `json:"messages_per_second"`
	DrainAfterFault string         `json:"drain_after_last_fault"`
	Violations      []string       `json:"violations,omitempty"` // the first 50
	ViolationCount  int            `json:"violation_count"`
	OK              bool           `json:"ok"`
}

// chaosEffect is one effect the sink holds.
type chaosEffect struct {
	Key     string `json:"key"`
	PID     int    `json:"pid"`
	Attempt string `json:"attempt,omitempty"`
	Fence   int64  `json:"fence,omitempty"`
	Message string `json:"message,omitempty"`
	Cause   string `json:"cause,omitempty"`
	// Bystander: the kill named by Cause fired for another key the
	// worker was handling at the same time, not in this attempt.
	Bystander bool `json:"bystander,omitempty"`
}

var chaosGuarantees = map[string]string{
	"at_least_once": "no key lost; duplicates only from an attempt that lost its lease (worker killed, frozen, or cut off from the store past it) between its effect and its completion, taken over",
	"at_most_once":  "no key twice; every key without its effect indeterminate, listed by ls --stuck, left by an attempt that lost its lease (worker killed, frozen, or cut off from the store)",
	"reconcile":     "every key exactly once",
	"transactional": "every key exactly once",
}

func chaosRun(ctx context.Context, o chaosOptions, out io.Writer) (*chaosReport, error) {
	root, err := os.MkdirTemp("", "idem-chaos-")
	if err != nil {
		return nil, err
	}
	if o.keepDir {
		fmt.Fprintf(out, "run directory: %s\n", root)
	} else {
		defer os.RemoveAll(root)
	}
	target := o.targetName()
	rep := &chaosReport{Seed: o.seed, Target: target, Faults: o.faults,
		Keys: o.keys, Workers: o.workers, Duration: o.duration.String(), Lease: o.lease.String(),
		Visibility: o.visibility.String(), Handlers: o.handlers, CutEvery: o.cutEvery.String(), FaultEvery: o.faultEvery, Sync: o.sync, Fused: o.chaosFused(), FusedOff: !o.fused, Broken: o.broken, OK: true}
	if o.broker != "" {
		rep.Queue = storeurl.Redact(o.queueURL)
	}
	if rep.Faults == nil {
		rep.Faults = []string{}
	}
	fmt.Fprintf(out, "idem chaos: seed %d, %d keys per policy, %d workers of %d handlers, faults %s for %s per policy, lease %s, visibility %s, fused %t\n",
		o.seed, o.keys, o.workers, o.handlers, orNone(o.faults), o.duration, o.lease, o.visibility, rep.Fused)
	for i, p := range o.policies {
		dir := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Join(dir, "fired"), 0o755); err != nil {
			return nil, err
		}
		r := &chaosScenario{o: o, policy: p, dir: dir, out: out,
			rng: rand.New(rand.NewPCG(o.seed, uint64(i))), stopped: map[int]bool{}}
		pr, err := r.run(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		rep.Policies = append(rep.Policies, pr)
		rep.OK = rep.OK && pr.OK
		verdict := "ok"
		if !pr.OK {
			verdict = fmt.Sprintf("BROKEN (%d violations)", pr.ViolationCount)
		}
		fmt.Fprintf(out, "%-14s keys=%d messages=%d effects=%d duplicates=%d indeterminate=%d dead-letters=%d took=%s drain=%s %s\n",
			p, pr.Keys, pr.Messages, pr.Effects, pr.Duplicates, pr.Indeterminate, pr.DeadLetters, pr.Took, pr.DrainAfterFault, verdict)
		for _, v := range pr.Violations[:min(len(pr.Violations), 5)] {
			fmt.Fprintf(out, "  %s\n", v)
		}
	}
	return rep, nil
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}

// chaosScenario is one policy's run, in the harness.
type chaosScenario struct {
	o      chaosOptions
	policy string
	dir    string
	out    io.Writer
	rng    *rand.Rand
	target chaosTarget
	sched  chaosSchedule

	mu        sync.Mutex
	workers   chaosProcs   // chaos_procs.go
	stopped   map[int]bool // frozen past the lease at least once
	lastFault time.Time
	failed    []string // workers and relays that exited with an error
	cuts      int
	ob        chaosOutboxState  // chaos_outbox.go
	restart   chaosRestartState // chaos_restart.go

	lastProgress time.Time
}

func (r *chaosScenario) has(f string) bool { return slices.Contains(r.o.faults, f) }

func (r *chaosScenario) noteFault(t time.Time) {
	r.mu.Lock()
	if t.After(r.lastFault) {
		r.lastFault = t
	}
	r.mu.Unlock()
}

// schedule draws the keys' copies and the faults assigned to keys: for
// each kind, one key in --fault-every (500 unless told), at least 6 (and at
// most one in 25): every kill costs a worker start, and a long run should
// measure the pipeline, not restarts. The keys are drawn evenly among all keys, so the faults
// are spread over the run.
func (r *chaosScenario) schedule() (copies []int) {
	r.sched = chaosSchedule{}
	copies = make([]int, r.o.keys)
	for i := range copies {
		copies[i] = 1 + r.rng.IntN(5)
	}
	limit := max(6, r.o.keys/r.o.faultEvery)
	for _, f := range []string{faultKillBeforeEffect, faultKillAfterEffect, faultKillBeforeAck, faultSlow} {
		if !r.has(f) {
			continue
		}
		n := min(limit, max(r.o.keys/25, 1))
		for tries := 0; n > 0 && tries < 20*r.o.keys; tries++ {
			k := chaosKey(r.rng.IntN(r.o.keys))
			if _, taken := r.sched[k]; !taken {
				r.sched[k] = f
				n--
			}
		}
	}
	if r.has(faultRelayKill) {
		// At least 2: one re-publish the queue drops, one it delivers.
		r.scheduleRelayKills(min(limit, max(r.o.keys/25, 2)))
	}
	return copies
}

func (r *chaosScenario) run(ctx context.Context) (*chaosPolicyReport, error) {
	copies := r.schedule()
	b, _ := json.Marshal(r.sched)
	if err := os.WriteFile(filepath.Join(r.dir, "schedule.json"), b, 0o644); err != nil {
		return nil, err
	}
	r.target = chaosTargetFor(r.o, r.policy, r.dir)
	be, err := openChaosBackend(ctx, &r.target, r.dir, true)
	if err != nil {
		return nil, err
	}
	defer be.Close()
	if r.policy == "reconcile" {
		db, err := openSinkDB(r.dir, r.o.sync)
		if err != nil {
			return nil, err
		}
		_, err = db.ExecContext(ctx, sinkSchema)
		db.Close()
		if err != nil {
			return nil, fmt.Errorf("creating the sink: %w", err)
		}
	}
	pub, err := be.Publisher(ctx, r.o.visibility)
	if err != nil {
		return nil, err
	}
	wc := chaosWorkerCfg{Policy: r.policy, Dir: r.dir, Backend: r.target, Lease: r.o.lease, Visibility: r.o.visibility, Handlers: r.o.handlers,
		MaxReceives: 12, Broken: r.o.broken}
	cb, _ := json.Marshal(wc)
	r.workers = newChaosProcs("worker", "pid", chaosWorkerEnv+"="+string(cb))

	began := time.Now()
	defer r.stopProcs(&r.workers)
	for range r.o.workers {
		if err := r.startProc(&r.workers); err != nil {
			return nil, err
		}
	}
	defer r.stopProcs(&r.ob.relays)
	if err := r.startRelays(); err != nil {
		return nil, err
	}
	if err := r.awaitReady(ctx); err != nil {
		return nil, err
	}

	// The messages: every key 1-5 times, in an order drawn from the
	// seed, spread over two thirds of the duration.
	var msgs []int
	for i, n := range copies {
		for range n {
			msgs = append(msgs, i)
		}
	}
	r.rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	faultCtx, stopFaults := context.WithTimeout(ctx, r.o.duration)
	defer stopFaults()
	var wg sync.WaitGroup
	if r.has(faultStoreCut) {
		wg.Go(func() { r.cutLoop(faultCtx, be) })
	}
	if r.has(faultStop) {
		wg.Go(func() { r.stopLoop(faultCtx) })
	}
	if r.has(faultStoreRestart) {
		wg.Go(func() { r.restartLoop(faultCtx) })
	}
	// The producer: chaosPublishers publish at once (one alone would wait
	// for a commit a message), each message not before its time in the
	// spread.
	spread := r.o.duration * 2 / 3
	step := spread / time.Duration(len(msgs)+1)
	pubStart := time.Now()
	copyOf := make([]int, len(msgs)) // each message's copy number of its key
	seen := make([]int, r.o.keys)
	for n, i := range msgs {
		seen[i]++
		copyOf[n] = seen[i]
	}
	var (
		count, next atomic.Int64
		pubErr      error
		pubOnce     sync.Once
		pw          sync.WaitGroup
	)
	pubCtx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	for range chaosPublishers {
		pw.Go(func() {
			for {
				n := int(next.Add(1) - 1)
				if n >= len(msgs) {
					return
				}
				if d := time.Until(pubStart.Add(time.Duration(n) * step)); d > 0 && !sleepCtx(pubCtx, d) {
					return
				}
				key := chaosKey(msgs[n])
				m := queue.Outgoing{Body: []byte(key), DedupID: key + "#" + strconv.Itoa(copyOf[n])}
				for first := time.Now(); ; {
					p, err := r.publish(pubCtx, be, pub, m)
					if err == nil {
						if !p.Duplicate {
							count.Add(1)
						}
						break
					}
					if pubCtx.Err() != nil {
						return
					}
					if time.Since(first) > chaosPatience { // a store restart lasts less
						pubOnce.Do(func() { pubErr = fmt.Errorf("publishing: %w", err); stopPub() })
						return
					}
					sleepCtx(pubCtx, 20*time.Millisecond)
				}
			}
		})
	}
	pubDone := make(chan struct{})
	go func() { pw.Wait(); close(pubDone) }()
	for waiting := true; waiting; {
		select {
		case <-pubDone:
			waiting = false
		case <-time.After(time.Second):
			r.progress(ctx, be, began, int(count.Load()), len(msgs))
		}
	}
	if pubErr != nil {
		return nil, pubErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	published := int(count.Load())
	wg.Wait() // the faults end with the duration
	stopFaults()

	// Drain: every message acked or dead-lettered. A backlog left by a
	// long run may take a while: the run fails only when the queue makes
	// no progress for drainBound.
	drainBound := 3*time.Minute + r.o.lease*4 + r.o.visibility*4
	deadline := time.Now().Add(drainBound)
	var dead int64
	least := int64(-1)
	for {
		r.progress(ctx, be, began, published, len(msgs))
		pending, d, err := r.pending(ctx, be)
		if err == nil && pending == 0 {
			dead = d
			break
		}
		if err == nil && (least < 0 || pending < least) {
			least = pending
			deadline = time.Now().Add(drainBound)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the queue made no progress for %s after the faults' end: %d of %d messages unsettled (%v; worker log: %s)",
				drainBound, pending, published, err, filepath.Join(r.dir, "worker.log"))
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
	drained := time.Now()
	r.stopProcs(&r.workers)
	r.stopProcs(&r.ob.relays)
	took := drained.Sub(began)

	pr := &chaosPolicyReport{Policy: r.policy, Guarantee: chaosGuarantees[r.policy], Keys: r.o.keys, Messages: published, DeadLetters: int(dead),
		DuplicateCauses: map[string]int{}, IndeterminateWhy: map[string]int{}, FaultsInjected: map[string]int{},
		Took: took.Round(100 * time.Millisecond).String(), Throughput: float64(published) / took.Seconds()}
	r.mu.Lock()
	pr.WorkersStarted = r.workers.started
	last := r.lastFault
	if r.has(faultStoreCut) {
		pr.FaultsInjected[faultStoreCut] = r.cuts
		if p, ok := be.(*chaosPair); ok {
			pr.ConnectionCuts = p.connectionCuts()
		}
	}
	if r.has(faultStop) {
		pr.FaultsInjected[faultStop] = len(r.stopped)
	}
	failed := slices.Clone(r.failed)
	r.mu.Unlock()
	if last.IsZero() {
		last = began
	}
	pr.DrainAfterFault = max(drained.Sub(last), 0).Round(100 * time.Millisecond).String()
	if err := r.check(ctx, be, pr); err != nil {
		return nil, err
	}
	if err := r.checkOutbox(ctx, be, pr); err != nil {
		return nil, err
	}
	r.checkRestarts(pr)
	for _, f := range failed {
		pr.violate("a worker failed: %s", f)
	}
	pr.OK = pr.ViolationCount == 0
	return pr, nil
}

// chaosProgressEvery is how often a long run (a duration of a minute or
// more) prints a progress line.
const chaosProgressEvery = 30 * time.Second

// progress prints a progress line, at most every chaosProgressEvery, in a
// long run.
func (r *chaosScenario) progress(ctx context.Context, be chaosBackend, began time.Time, published, total int) {
	if r.o.duration < time.Minute || time.Since(r.lastProgress) < chaosProgressEvery {
		return
	}
	if r.lastProgress.IsZero() {
		r.lastProgress = began
		return
	}
	r.lastProgress = time.Now()
	pending, dead, err := be.Pending(ctx)
	if err != nil {
		return
	}
	r.mu.Lock()
	started := r.workers.started
	r.mu.Unlock()
	done := int64(published) - pending
	fmt.Fprintf(r.out, "  %s %s: published %d of %d messages, %d settled (%d dead letters), %.0f msg/s, %d workers started\n",
		r.policy, time.Since(began).Round(time.Second), published, total, done, dead, float64(done)/time.Since(began).Seconds(), started)
}

func (pr *chaosPolicyReport) violate(format string, args ...any) {
	pr.ViolationCount++
	if len(pr.Violations) < 50 {
		pr.Violations = append(pr.Violations, fmt.Sprintf(format, args...))
	}
}

// scanLines calls fn with the fields of each line of the file at path
// (eachLine).
func scanLines(path string, fn func([]string)) error {
	return eachLine(path, func(b []byte) { fn(strings.Fields(string(b))) })
}

// eachLine calls fn with each line of the file at path, of any length
// (an error's text in a log line has none); a file that is not there has
// no lines.
func eachLine(path string, fn func([]byte)) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	for {
		b, err := r.ReadBytes('\n')
		if len(b) > 0 {
			fn(b)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// cutLoop injects the backend's connection fault every 200-400 ms.
func (r *chaosScenario) cutLoop(ctx context.Context, be chaosBackend) {
	for sleepCtx(ctx, r.o.cutEvery/2+rand.N(r.o.cutEvery)) {
		n, err := be.Fault(ctx)
		if err == nil || ctx.Err() == nil {
			r.mu.Lock()
			r.cuts += n
			r.mu.Unlock()
			r.noteFault(time.Now())
		}
	}
}

// stopLoop freezes a worker (SIGSTOP) for longer than its lease every
// 3-5 s, then lets it go on (SIGCONT).
func (r *chaosScenario) stopLoop(ctx context.Context) {
	for sleepCtx(ctx, 3*time.Second+time.Duration(r.rng.Int64N(int64(2*time.Second)))) {
		r.mu.Lock()
		pids := slices.Sorted(maps.Keys(r.workers.procs))
		var cmd *exec.Cmd
		if len(pids) > 0 {
			cmd = r.workers.procs[pids[rand.N(len(pids))]]
		}
		r.mu.Unlock()
		if cmd == nil {
			continue
		}
		if cmd.Process.Signal(syscall.SIGSTOP) != nil {
			continue
		}
		r.mu.Lock()
		r.stopped[cmd.Process.Pid] = true
		r.mu.Unlock()
		time.Sleep(r.o.lease + time.Second) // past the lease, whatever ctx says
		_ = cmd.Process.Signal(syscall.SIGCONT)
		r.noteFault(time.Now())
	}
}

// cutOffAttempts reads the workers' log (slog's JSON lines) for the
// attempts whose live worker could not reach the store: by attempt id,
// chaosLeaseLost for those the ledger logged as lease-lost (the key's next
// attempt takes it over), chaosNotRecorded for those whose closing write
// it logged as a store-error (op complete, release, fail or abandon: the
// lease runs out, and the same follows). A claim's store-error names no
// attempt that ran fn, so it is not one. A line that is not JSON (a
// crashing worker's last words) says nothing.
func cutOffAttempts(path string) (map[string]string, error) {
	cut := map[string]string{}
	err := eachLine(path, func(b []byte) {
		var line struct {
			Outcome   string `json:"outcome"`
			Op        string `json:"op"`
			AttemptID string `json:"attempt_id"`
		}
		if json.Unmarshal(b, &line) != nil || line.AttemptID == "" {
			return
		}
		switch {
		case line.Outcome == "lease-lost":
			cut[line.AttemptID] = chaosLeaseLost
		case line.Outcome == "store-error" && slices.Contains([]string{"complete", "release", "fail", "abandon"}, line.Op):
			cut[line.AttemptID] = chaosNotRecorded
		}
	})
	if err != nil {
		return nil, err
	}
	return cut, nil
}

// check reads every key's record and effects and checks the policy's
// guarantee, filling pr.
func (r *chaosScenario) check(ctx context.Context, be chaosBackend, pr *chaosPolicyReport) error {
	s := be.Store()
	// The kills that fired: kind per pid, and per attempt.
	killKind := map[int]string{}
	killAttempt := map[string]string{}
	if err := scanLines(filepath.Join(r.dir, "kills"), func(f []string) {
		if len(f) >= 4 {
			pid, _ := strconv.Atoi(f[2])
			killKind[pid] = f[0]
			if f[3] != "-" {
				killAttempt[f[3]] = f[0]
			}
			pr.FaultsInjected[f[0]]++
		}
	}); err != nil {
		return err
	}
	cutOff, err := cutOffAttempts(filepath.Join(r.dir, "worker.log"))
	if err != nil {
		return err
	}
	if r.has(faultSlow) {
		fired, err := os.ReadDir(filepath.Join(r.dir, "fired"))
		if err != nil {
			return err
		}
		for _, f := range fired {
			if strings.HasPrefix(f.Name(), faultSlow+"-") {
				pr.FaultsInjected[faultSlow]++
			}
		}
	}
	effects := map[string][]chaosEffect{}
	switch r.policy {
	case "transactional":
		rows, err := be.Effects(ctx)
		if err != nil {
			return err
		}
		for k, whos := range rows {
			for _, who := range whos {
				pid, _ := strconv.Atoi(who)
				effects[k] = append(effects[k], chaosEffect{Key: k, PID: pid})
			}
		}
	case "reconcile":
		db, err := openSinkDB(r.dir, r.o.sync)
		if err != nil {
			return err
		}
		defer db.Close()
		rows, err := db.QueryContext(ctx, "SELECT key, pid, attempt, fence, message FROM effects")
		if err != nil {
			return err
		}
		for rows.Next() {
			var e chaosEffect
			if err := rows.Scan(&e.Key, &e.PID, &e.Attempt, &e.Fence, &e.Message); err != nil {
				rows.Close()
				return err
			}
			effects[e.Key] = append(effects[e.Key], e)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	default:
		if err := scanLines(filepath.Join(r.dir, "effects"), func(f []string) {
			if len(f) == 5 {
				pid, _ := strconv.Atoi(f[1])
				fence, _ := strconv.ParseInt(f[3], 10, 64)
				effects[f[0]] = append(effects[f[0]], chaosEffect{Key: f[0], PID: pid, Attempt: f[2], Fence: fence, Message: f[4]})
			}
		}); err != nil {
			return err
		}
	}
	// The keys `idem ls --stuck` lists.
	stuck := map[string]bool{}
	for after := ""; ; {
		recs, err := s.List(ctx, store.ListQuery{Stuck: true, After: after, Limit: 1000})
		if err != nil {
			return fmt.Errorf("listing the stuck keys: %w", err)
		}
		for _, rec := range recs {
			stuck[rec.Key] = true
		}
		if len(recs) < 1000 {
			break
		}
		after = recs[len(recs)-1].Key
	}
	pr.ListedStuck = len(stuck)

	// cause names what made an effect that did not complete its key.
	causeOf := func(e chaosEffect) (string, bool) {
		if k, ok := killAttempt[e.Attempt]; ok {
			return k, false
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if k, ok := killKind[e.PID]; ok {
			return k, r.policy != "transactional"
		}
		if r.stopped[e.PID] {
			return faultStop, false
		}
		if r.workers.killed[e.PID] {
			return "killed", false
		}
		if c, ok := cutOff[e.Attempt]; ok {
			return c, false
		}
		return "none: a live worker", false
	}
	cause := func(e chaosEffect) string { c, _ := causeOf(e); return c }
	ownerPID := func(owner string) int {
		pid, _ := strconv.Atoi(strings.TrimPrefix(owner, "chaos-"))
		return pid
	}
	for i := range r.o.keys {
		k := chaosKey(i)
		es := effects[k]
		pr.Effects += len(es)
		switch len(es) {
		case 0:
			pr.KeysWith0++
		case 1:
			pr.KeysWith1++
		default:
			pr.KeysWith2++
		}
		rec, err := s.Get(ctx, k)
		if errors.Is(err, store.ErrNotFound) {
			rec = store.Record{Key: k}
		} else if err != nil {
			return fmt.Errorf("reading %s: %w", k, err)
		}
		var extra []chaosEffect
		switch r.policy {
		case "transactional":
			if len(es) == 1 && rec.Owner != "chaos-"+strconv.Itoa(es[0].PID) {
				pr.violate("%s: its effect row was written by %d, its record is owned by %s", k, es[0].PID, rec.Owner)
			}
			extra = es[min(1, len(es)):]
		default:
			for _, e := range es {
				if e.Attempt != rec.AttemptID || rec.Status != store.StatusCompleted {
					extra = append(extra, e)
				}
			}
			if rec.Status == store.StatusCompleted && len(extra) == len(es) && r.policy != "reconcile" {
				pr.violate("%s: completed, but none of its %d effects is the completing attempt's", k, len(es))
			}
		}
		if r.policy == "at_most_once" && rec.Status != store.StatusCompleted {
			extra = nil // an indeterminate key's one effect is not a duplicate
		}
		if r.policy == "reconcile" && rec.Status == store.StatusCompleted && len(es) == 1 {
			extra = nil // a reconciled key completes with the lapsed attempt's effect
		}
		if len(es) > 1 {
			pr.Duplicates += len(es) - 1
		}
		unexplained := false
		for n, e := range extra {
			if len(es) <= 1 || n >= len(es)-1 {
				break
			}
			e.Cause, e.Bystander = causeOf(e)
			unexplained = unexplained || e.Cause == "none: a live worker"
			pr.DuplicateCauses[e.Cause]++
			if len(pr.DuplicateList) < 100 {
				pr.DuplicateList = append(pr.DuplicateList, e)
			}
		}
		switch r.policy {
		case "transactional", "reconcile":
			if rec.Status != store.StatusCompleted {
				pr.violate("%s: %s, want completed", k, orDash(string(rec.Status)))
			}
			if len(es) != 1 {
				if len(es) == 0 {
					pr.Lost++
				}
				pr.violate("%s: %d effects, want exactly 1", k, len(es))
			}
		case "at_least_once":
			if rec.Status != store.StatusCompleted || len(es) == 0 {
				pr.Lost++
				pr.violate("%s: %s with %d effects, want completed", k, orDash(string(rec.Status)), len(es))
				continue
			}
			if len(es) > 1 {
				if unexplained {
					pr.violate("%s: %d effects, and a duplicate made by a worker that was neither killed, frozen, nor cut off from the store past its lease", k, len(es))
				}
				took := false
				for _, je := range rec.Journal {
					took = took || je.Takeover
				}
				if !took {
					pr.violate("%s: %d effects, and no takeover in its journal", k, len(es))
				}
			}
		case "at_most_once":
			if len(es) > 1 {
				pr.violate("%s: %d effects under at_most_once", k, len(es))
			}
			switch {
			case rec.Status == store.StatusCompleted:
				if len(es) != 1 {
					pr.Lost++
					pr.violate("%s: completed with %d effects, want 1", k, len(es))
				}
			case rec.Status == store.StatusInProgress:
				pr.Indeterminate++
				why := ""
				if kk, ok := killAttempt[rec.AttemptID]; ok {
					why = kk
				} else {
					why = cause(chaosEffect{PID: ownerPID(rec.Owner), Attempt: rec.AttemptID})
				}
				pr.IndeterminateWhy[why]++
				if why == "none: a live worker" {
					pr.violate("%s: left indeterminate by %s, a worker that was neither killed, frozen, nor cut off from the store past its lease", k, rec.Owner)
				}
				if !stuck[k] {
					pr.violate("%s: indeterminate but not listed by ls --stuck", k)
				}
			default:
				pr.Lost++
				pr.violate("%s: %s with %d effects: lost silently (neither done nor listed by ls --stuck)", k, orDash(string(rec.Status)), len(es))
			}
		}
	}
	return nil
}
