// Command compare runs idem and its anchors (River, asynq, DBOS) side by
// side in one process and prints a table of rates and ratios.
//
// Every comparison runs each side in turn, several rounds interleaved (the
// order reverses every round), so that a ratio compares two figures taken a
// few seconds apart on the same machine. The load average is printed with each
// figure. See ../../README.md for what each comparison measures.
//
//	IDEM_TEST_POSTGRES=postgres://postgres@127.0.0.1:5432/test?sslmode=disable \
//	IDEM_TEST_REDIS=redis://127.0.0.1:6379/0 \
//	go run ./cmd/compare -only pg,redis,e2e-sqlite,e2e-pg
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"
)

// config is what the flags set.
type config struct {
	only         map[string]bool
	rounds       int
	duration     time.Duration
	warmup       time.Duration
	callers      []int
	pgURL        string
	redisURL     string
	idemDB       int
	asynqDB      int
	e2eN         int // idem's messages in the end-to-end runs
	riverLiteN   int
	pgE2EN       int
	consumers    int
	receivers    int
	riverWorkers int           // River's MaxWorkers in the e2e runs
	dbos         bool          // whether e2e-pg runs DBOS too
	dbosWorkers  int           // DBOS queue worker concurrency in e2e-pg
	dbosPoll     time.Duration // DBOS queue polling interval in e2e-pg
	e2eDB        string        // the database e2e-pg makes and runs in, "" for -pg's own
	coalesce     int           // idem.WithCoalescing of the e2e runs' ledgers
	pgConns      int
	prefill      int
	batch        int
	queue        string // idem's queue in the end-to-end runs: sqlqueue or memqueue
	fused        bool   // sqlqueue.WithLedger: the fused queue+ledger path
	keep         bool
	profile      string
	out          io.Writer
	log          *slog.Logger
}

var comparisons = []string{"pg", "redis", "e2e-sqlite", "e2e-pg"}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	only := fs.String("only", strings.Join(comparisons, ","), "comparisons to run: "+strings.Join(comparisons, ","))
	cfg := &config{out: os.Stdout}
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds of each comparison (sides interleaved, order flipped each round)")
	fs.DurationVar(&cfg.duration, "duration", 3*time.Second, "measured time of each side of a throughput comparison")
	fs.DurationVar(&cfg.warmup, "warmup", 500*time.Millisecond, "unmeasured time before each throughput measurement")
	callers := fs.String("callers", "8,64", "concurrent callers of the pg and redis comparisons")
	fs.StringVar(&cfg.pgURL, "pg", os.Getenv("IDEM_TEST_POSTGRES"), "PostgreSQL URL (default $IDEM_TEST_POSTGRES)")
	fs.StringVar(&cfg.redisURL, "redis", os.Getenv("IDEM_TEST_REDIS"), "Redis URL (default $IDEM_TEST_REDIS); its DB number is replaced by -idem-db and -asynq-db")
	fs.IntVar(&cfg.idemDB, "idem-db", 8, "Redis DB for idem's records (flushed before each measurement)")
	fs.IntVar(&cfg.asynqDB, "asynq-db", 9, "Redis DB for asynq (flushed before each measurement)")
	fs.IntVar(&cfg.e2eN, "n", 100000, "messages idem publishes and consumes in e2e-sqlite")
	fs.IntVar(&cfg.riverLiteN, "river-sqlite-n", 5000, "jobs River inserts and works in e2e-sqlite (River on SQLite works a few hundred to a thousand jobs a second here)")
	fs.IntVar(&cfg.pgE2EN, "pg-n", 20000, "messages (jobs) each side handles in e2e-pg")
	fs.IntVar(&cfg.consumers, "consumers", 256, "idem consumer concurrency (queue.WithConcurrency) in the e2e runs")
	fs.IntVar(&cfg.receivers, "receivers", 1, "idem consumers sharing -consumers in the e2e runs, each with its own receive loop: up to that many receives in flight at once")
	fs.IntVar(&cfg.riverWorkers, "river-workers", 2000, "River's workers (QueueConfig.MaxWorkers) in the e2e runs, as `river bench` runs it")
	fs.BoolVar(&cfg.dbos, "dbos", true, "run DBOS as a third side of e2e-pg (-dbos=false: idem and River only)")
	fs.IntVar(&cfg.dbosWorkers, "dbos-workers", 1000, "DBOS's queue worker concurrency (dbos.WithWorkerConcurrency) in e2e-pg")
	fs.DurationVar(&cfg.dbosPoll, "dbos-poll", 10*time.Millisecond, "DBOS's queue polling interval (dbos.WithQueueBasePollingInterval) in e2e-pg")
	fs.StringVar(&cfg.e2eDB, "e2e-pg-db", "idem_bench_e2e", "database e2e-pg makes on -pg's server and runs in, so that its commit counts are its own (dropped at the end unless -keep; \"\": -pg's database, commits then count every client of it)")
	fs.IntVar(&cfg.coalesce, "coalesce", 256, "idem.WithCoalescing of the ledger in e2e-pg, about the consumer concurrency (0: off; e2e-sqlite never coalesces: sqlitestore groups its writes itself)")
	fs.IntVar(&cfg.batch, "batch", 128, "idem consumer receive batch (queue.WithBatchSize) in the e2e runs")
	fs.IntVar(&cfg.prefill, "prefill", 20000, "keys (jobs) put in each side's table before the pg measurements")
	fs.IntVar(&cfg.pgConns, "pg-conns", 32, "connections of each side's pool in e2e-pg")
	fs.BoolVar(&cfg.fused, "fused", true, "give sqlqueue the ledger's store (sqlqueue.WithLedger): the consumer takes the fused queue+ledger path")
	fs.StringVar(&cfg.queue, "queue", defaultQueue, "idem's queue in the e2e runs: "+strings.Join(queueKinds(), " or "))
	fs.BoolVar(&cfg.keep, "keep", false, "keep the bench_idem and bench_river schemas after the run")
	fs.StringVar(&cfg.profile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	verbose := fs.Bool("v", false, "log the libraries' warnings and errors to stderr")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	cfg.only = map[string]bool{}
	for _, c := range strings.Split(*only, ",") {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		if !slices.Contains(comparisons, c) {
			return nil, fmt.Errorf("-only: unknown comparison %q (want %s)", c, strings.Join(comparisons, ","))
		}
		cfg.only[c] = true
	}
	for _, c := range strings.Split(*callers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-callers: %q is not a positive number", c)
		}
		cfg.callers = append(cfg.callers, n)
	}
	if !slices.Contains(queueKinds(), cfg.queue) {
		return nil, fmt.Errorf("-queue: %q is not built in (want %s)", cfg.queue, strings.Join(queueKinds(), " or "))
	}
	if cfg.rounds < 1 || cfg.duration <= 0 || cfg.e2eN < 1 || cfg.riverLiteN < 1 || cfg.pgE2EN < 1 ||
		cfg.consumers < 1 || cfg.receivers < 1 || cfg.batch < 1 || cfg.pgConns < 2 || cfg.riverWorkers < 1 || cfg.dbosWorkers < 1 || cfg.dbosPoll <= 0 {
		return nil, errors.New("-rounds, -duration, -n, -river-sqlite-n, -pg-n, -consumers, -receivers, -batch, -river-workers, -dbos-workers and -dbos-poll must be positive, -pg-conns at least 2")
	}
	level := slog.LevelError + 100
	if *verbose {
		level = slog.LevelWarn
	}
	cfg.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	return cfg, nil
}

// sample is one measured figure.
type sample struct {
	comp    string // comparison and variant, e.g. "pg claim"
	side    string // "idem" or the anchor's name
	what    string // what was run
	callers int
	round   int
	rate    float64 // keys (or messages) per second
	cpu     float64 // this process's CPU time (user+system) per key, µs
	load    string  // load averages just before the measurement
	note    string
	cost    string // row writes and commits a message, as counted (see pgCounter), or ""
}

// target is what a comparison must reach.
type target struct {
	comp     string
	anchor   string  // the side ratio is against; "" for any
	ratio    float64 // idem / anchor, 0 for none
	absolute float64 // idem's own rate, 0 for none
	callers  int     // the concurrency it applies at, 0 for any
}

type report struct {
	mu      sync.Mutex
	out     io.Writer
	samples []sample
	targets []target
	notes   []string
}

func (r *report) add(s sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, s)
	cost := ""
	if s.cost != "" {
		cost = "  " + s.cost + " a message"
	}
	fmt.Fprintf(r.out, "%-20s round %d callers %-3d %-6s %10.0f /s %7.1f CPU-µs%s  load %s  %s%s\n",
		s.comp, s.round, s.callers, s.side, s.rate, s.cpu, cost, s.load, s.what, noteSuffix(s.note))
}

func noteSuffix(n string) string {
	if n == "" {
		return ""
	}
	return " (" + n + ")"
}

func (r *report) target(t target) { r.targets = append(r.targets, t) }

func (r *report) note(format string, args ...any) {
	n := fmt.Sprintf(format, args...)
	r.notes = append(r.notes, n)
	fmt.Fprintln(r.out, "note:", n)
}

// print writes the summary: per comparison and concurrency, each round's
// rates of each pair of sides (idem against each anchor, then the anchors
// against each other) and their ratio, the median ratio of each pair and
// whether idem's targets are met.
func (r *report) print() {
	type group struct {
		comp    string
		callers int
	}
	var order []group
	byGroup := map[group]map[int][]sample{}
	sideOrder := map[group][]string{} // idem first, then the anchors as they first appear
	for _, s := range r.samples {
		g := group{s.comp, s.callers}
		if byGroup[g] == nil {
			byGroup[g] = map[int][]sample{}
			order = append(order, g)
		}
		byGroup[g][s.round] = append(byGroup[g][s.round], s)
		if !slices.Contains(sideOrder[g], s.side) {
			sideOrder[g] = append(sideOrder[g], s.side)
		}
	}
	for g, sides := range sideOrder {
		if i := slices.Index(sides, "idem"); i > 0 {
			sideOrder[g] = append([]string{"idem"}, slices.Delete(slices.Clone(sides), i, i+1)...)
		}
	}
	fmt.Fprintln(r.out)
	w := tabwriter.NewWriter(r.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "comparison\tcallers\tround\tside /s\tother /s\tratio\tCPU-µs side/other\tserver: rows, commits a message side / other\tload (1/5/15 min)")
	type verdict struct {
		g      group
		a, b   string // the pair: ratio is a's rate over b's
		ratios []float64
		rates  []float64 // a's
	}
	var verdicts []verdict
	for _, g := range order {
		rounds := make([]int, 0, len(byGroup[g]))
		for k := range byGroup[g] {
			rounds = append(rounds, k)
		}
		sort.Ints(rounds)
		sides := sideOrder[g]
		for i, a := range sides {
			for _, b := range sides[i+1:] {
				v := verdict{g: g, a: a, b: b}
				for _, rd := range rounds {
					sa, sb := sideOf(byGroup[g][rd], a), sideOf(byGroup[g][rd], b)
					if sa == nil || sb == nil {
						continue
					}
					ratio := sa.rate / sb.rate
					v.ratios = append(v.ratios, ratio)
					v.rates = append(v.rates, sa.rate)
					fmt.Fprintf(w, "%s\t%d\t%d\t%.0f (%s)\t%.0f (%s)\t%.2f×\t%.1f / %.1f\t%s / %s\t%s / %s\n", g.comp, g.callers, rd,
						sa.rate, a, sb.rate, b, ratio, sa.cpu, sb.cpu, orDash(sa.cost), orDash(sb.cost), sa.load, sb.load)
				}
				verdicts = append(verdicts, v)
			}
		}
	}
	w.Flush()
	fmt.Fprintln(r.out)
	for _, v := range verdicts {
		if len(v.ratios) == 0 {
			continue
		}
		med := median(v.ratios)
		line := fmt.Sprintf("%s, %d callers: median ratio %.2f× %s÷%s (min %.2f, max %.2f)", v.g.comp, v.g.callers,
			med, v.a, v.b, slices.Min(v.ratios), slices.Max(v.ratios))
		for _, t := range r.targets {
			if t.comp != v.g.comp || v.a != "idem" || (t.anchor != "" && t.anchor != v.b) || (t.callers != 0 && t.callers != v.g.callers) {
				continue
			}
			if t.ratio > 0 {
				line += fmt.Sprintf("; target ≥ %g×: %s", t.ratio, metWord(med >= t.ratio))
			}
			if t.absolute > 0 {
				mi := median(v.rates)
				line += fmt.Sprintf("; idem median %.0f/s, target ≥ %.0f/s: %s", mi, t.absolute, metWord(mi >= t.absolute))
			}
		}
		fmt.Fprintln(r.out, line)
	}
	for _, n := range r.notes {
		fmt.Fprintln(r.out, "note:", n)
	}
}

// sideOf returns the sample of side in ss, or nil.
func sideOf(ss []sample, side string) *sample {
	for i := range ss {
		if ss[i].side == side {
			return &ss[i]
		}
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func metWord(ok bool) string {
	if ok {
		return "MET"
	}
	return "NOT MET"
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// loadavg returns the 1, 5 and 15 minute load averages.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return f[0] + " " + f[1] + " " + f[2]
}

func run(ctx context.Context, cfg *config) error {
	rep := &report{out: cfg.out}
	if cfg.profile != "" {
		f, err := os.Create(cfg.profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Fprintf(cfg.out, "compare: %s, rounds %d, %s per side (after %s warm-up), load %s\n",
		time.Now().UTC().Format(time.RFC3339), cfg.rounds, cfg.duration, cfg.warmup, loadavg())
	steps := []struct {
		name string
		f    func(context.Context, *config, *report) error
	}{
		{"pg", comparePG},
		{"redis", compareRedis},
		{"e2e-sqlite", compareE2ESQLite},
		{"e2e-pg", compareE2EPG},
	}
	var errs []error
	for _, s := range steps {
		if !cfg.only[s.name] {
			continue
		}
		if err := s.f(ctx, cfg, rep); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
			fmt.Fprintf(cfg.out, "%s: %v\n", s.name, err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	rep.print()
	return errors.Join(errs...)
}

// op does one unit of work and returns how many keys (or messages) it did.
type op func(ctx context.Context) (int, error)

// throughput runs callers goroutines, each calling the op newOp made for
// it, for warmup and then for d, and returns the keys done per second
// during d.
func throughput(ctx context.Context, callers int, warmup, d time.Duration, newOp func(i int) op) (rate, cpu float64, err error) {
	var (
		done    atomic.Int64
		stop    atomic.Bool
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range callers {
		f := newOp(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				n, err := f(ctx)
				if err != nil {
					errOnce.Do(func() { first = err })
					stop.Store(true)
					cancel()
					return
				}
				done.Add(int64(n))
			}
		}()
	}
	wait := func(d time.Duration) {
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	wait(warmup)
	c0, t0, u0 := done.Load(), time.Now(), cpuTime()
	wait(d)
	c1, t1, u1 := done.Load(), time.Now(), cpuTime()
	stop.Store(true)
	wg.Wait()
	if first != nil {
		return 0, 0, first
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	if c1 == c0 {
		return 0, 0, errors.New("nothing was done in the measured time")
	}
	return float64(c1-c0) / t1.Sub(t0).Seconds(), float64((u1 - u0).Microseconds()) / float64(c1-c0), nil
}

// cpuTime returns the CPU time this process has used (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// keys makes keys unique to one measurement.
type keys struct {
	prefix string
	n      atomic.Int64
}

func newKeys(name string) *keys {
	return &keys{prefix: fmt.Sprintf("%s-%x-", name, time.Now().UnixNano())}
}

func (k *keys) next() string {
	return k.prefix + strconv.FormatInt(k.n.Add(1), 10)
}

// sides runs the sides of one round in the order the round calls for: as
// given (idem first) in odd rounds, reversed in even ones.
func sides(round int, fs ...func() error) error {
	for i := range fs {
		f := fs[i]
		if round%2 == 0 {
			f = fs[len(fs)-1-i]
		}
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}
