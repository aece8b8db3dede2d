package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemkit/idem/cmd/idem/internal/storeurl"
	"github.com/idemkit/idem/store"
)

// Exit codes (documented in doc.go and the top-level help).
const (
	exitOK          = 0
	exitError       = 1 // the store failed, or the command refused
	exitUsage       = 2
	exitNotFound    = 3
	exitLeaseLive   = 4
	exitInterrupted = 130
)

// defaultStore is the store when neither --store nor IDEM_STORE names one.
const defaultStore = "sqlite:idem.db"

func main() {
	if cfg := os.Getenv(chaosWorkerEnv); cfg != "" {
		os.Exit(chaosWorkerMain(cfg)) // a worker of idem chaos
	}
	if cfg := os.Getenv(chaosRelayEnv); cfg != "" {
		os.Exit(chaosRelayMain(cfg)) // an outbox relay of idem chaos
	}
	if isVetTool(os.Args[1:]) {
		vetTool() // go vet -vettool=idem
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, storeurl.New(), os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// app is one run of the command: where output goes and which store it
// works on.
type app struct {
	stdout, stderr io.Writer
	stores         *storeurl.Openers // opens --store
	storeURL       string
	storeExplicit  bool        // --store was given (IDEM_STORE and the default are not)
	store          store.Store // opened on first use, or given (the demo)
	ownsStore      bool
	cmd            *command
	stderrTTY      bool
	// flagSink, when set, is handed the command's FlagSet by a.parse,
	// which then stops the command (errHelpShown): how completion learns
	// each command's flags.
	flagSink func(*flag.FlagSet)
}

// run is the whole command, in process: it parses args (without the
// program name), runs the command on the store stores opens and returns
// the exit code.
func run(ctx context.Context, stores *storeurl.Openers, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr, stores: stores, stderrTTY: isTerminal(stderr)}
	a.storeURL = os.Getenv("IDEM_STORE")
	if a.storeURL == "" {
		a.storeURL = defaultStore
	}
	gfs := flag.NewFlagSet("idem", flag.ContinueOnError)
	gfs.SetOutput(io.Discard)
	gfs.Usage = func() {}
	gfs.StringVar(&a.storeURL, "store", a.storeURL, "")
	if err := gfs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			a.topHelp(stdout)
			return exitOK
		}
		fmt.Fprintf(stderr, "idem: %v\nRun 'idem help' for usage.\n", err)
		return exitUsage
	}
	gfs.Visit(func(f *flag.Flag) { a.storeExplicit = a.storeExplicit || f.Name == "store" })
	rest := gfs.Args()
	if len(rest) == 0 {
		a.topHelp(stderr)
		return exitUsage
	}
	name, cargs := rest[0], rest[1:]
	if name == "help" {
		return a.help(cargs)
	}
	c := lookup(name)
	if c == nil {
		fmt.Fprintf(stderr, "idem: unknown command %q\nRun 'idem help' for the commands.\n", name)
		return exitUsage
	}
	a.cmd = c
	err := c.run(ctx, a, cargs)
	if a.ownsStore && a.store != nil {
		if cerr := a.store.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing the store: %w", cerr)
		}
	}
	return a.exit(err)
}

// help runs `idem help [COMMAND]`.
func (a *app) help(args []string) int {
	switch len(args) {
	case 0:
		a.topHelp(a.stdout)
		return exitOK
	case 1:
		c := lookup(args[0])
		if c == nil {
			fmt.Fprintf(a.stderr, "idem help: unknown command %q\nRun 'idem help' for the commands.\n", args[0])
			return exitUsage
		}
		a.cmd = c
		// A command prints its help while parsing, before anything else.
		return a.exit(c.run(context.Background(), a, []string{"--help"}))
	}
	fmt.Fprintln(a.stderr, "idem help: takes at most one command name")
	return exitUsage
}

// exit turns a command's error into its message on stderr and an exit code.
func (a *app) exit(err error) int {
	if err == nil {
		return exitOK
	}
	name := "idem"
	if a.cmd != nil {
		name += " " + a.cmd.name
	}
	var (
		ue *usageError
		ce *codeError
	)
	switch {
	case errors.Is(err, errHelpShown):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(a.stderr, "%s: %s\nRun '%s --help' for usage.\n", name, ue.msg, name)
		return exitUsage
	case errors.As(err, &ce):
		if ce.err != nil {
			fmt.Fprintf(a.stderr, "%s: %v\n", name, ce.err)
		}
		return ce.code
	case errors.Is(err, store.ErrNotFound):
		fmt.Fprintf(a.stderr, "%s: %v\n", name, err)
		return exitNotFound
	case errors.Is(err, context.Canceled):
		fmt.Fprintf(a.stderr, "%s: interrupted\n", name)
		return exitInterrupted
	}
	fmt.Fprintf(a.stderr, "%s: %v\n", name, err)
	return exitError
}

// open returns the store, opening it from --store on first use. Commands
// that read or repair records never create a store that does not exist.
func (a *app) open(ctx context.Context) (store.Store, error) {
	if a.store != nil {
		return a.store, nil
	}
	s, err := a.stores.Open(ctx, a.storeURL, storeurl.Options{MustExist: true})
	if err != nil {
		if errors.Is(err, storeurl.ErrUnknownScheme) || errors.Is(err, storeurl.ErrNoScheme) {
			return nil, usagef("%v", err)
		}
		return nil, err
	}
	a.store, a.ownsStore = s, true
	return s, nil
}

// usageError is a mistake in the command line (exit 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// codeError exits with code, after printing err if it is not nil.
type codeError struct {
	code int
	err  error
}

func (e *codeError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func (e *codeError) Unwrap() error { return e.err }

// leaseLive refuses to act on a key whose lease is running (exit 4).
func leaseLive(format string, args ...any) error {
	return &codeError{exitLeaseLive, fmt.Errorf(format, args...)}
}

// refused refuses an action the operator did not force (exit 1).
func refused(format string, args ...any) error {
	return &codeError{exitError, fmt.Errorf(format, args...)}
}

// notFound reports a key without a record (exit 3).
func notFound(key string) error {
	return &codeError{exitNotFound, fmt.Errorf("no record for %q (never claimed, or expired or swept after its retention): %w", key, store.ErrNotFound)}
}

// errHelpShown: --help printed the command's help (exit 0).
var errHelpShown = errors.New("help shown")

// isTerminal reports whether w is a terminal (a character device), for
// progress lines. TERM=dumb turns progress lines off.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("TERM") == "dumb" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
