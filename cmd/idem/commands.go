package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/explain"
	"github.com/idemkit/idem/cmd/idem/internal/storeurl"
	"github.com/idemkit/idem/store"
)

// command is one subcommand: its documentation and its run function. A run
// function defines its flags with a.flagSet, parses with a.parse (which
// answers --help) and returns an error that a.exit turns into an exit code.
type command struct {
	name     string
	synopsis string // after "idem NAME"
	summary  string // one line, for the command list
	help     string // what it does, for `idem NAME --help`
	exits    string // its exit codes
	run      func(ctx context.Context, a *app, args []string) error
}

// allCommands lists the subcommands in the order help shows them. It is a
// function, not a variable, because the commands' run functions refer back
// to this list (help).
func allCommands() []*command {
	return []*command{inspectCmd, lsCmd, releaseCmd, resolveCmd, deleteCmd, sweepCmd, queueCmd, explainCmd, serveCmd, demoCmd, chaosCmd, vetCmd, versionCmd, completionCmd}
}

func lookup(name string) *command {
	for _, c := range allCommands() {
		if c.name == name {
			return c
		}
	}
	return nil
}

// storeFlagHelp is the --store flag's help, naming each backend's short
// form.
var storeFlagHelp = func() string {
	var forms []string
	for _, b := range storeurl.Backends() {
		forms = append(forms, b.Short)
	}
	last := len(forms) - 1
	return "the store `URL`: " + strings.Join(forms[:last], ", ") + " or " + forms[last] +
		" (default $IDEM_STORE, else " + defaultStore + ")"
}()

// flagSet returns a FlagSet for c with the flags every command takes; the
// command adds its own.
func (c *command) flagSet(a *app) *flag.FlagSet {
	fs := flag.NewFlagSet("idem "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&a.storeURL, "store", a.storeURL, storeFlagHelp)
	return fs
}

// parse parses args with fs, allowing flags after positional arguments
// (`idem inspect KEY --json`); "--" ends the flags. It prints the help and
// returns errHelpShown for -h/--help.
func (a *app) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	if a.flagSink != nil {
		a.flagSink(fs)
		return nil, errHelpShown
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				a.cmd.printHelp(a.stdout, fs)
				return nil, errHelpShown
			}
			return nil, usagef("%v", err)
		}
		fs.Visit(func(f *flag.Flag) { a.storeExplicit = a.storeExplicit || f.Name == "store" })
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// keyArg checks that pos is exactly one key.
func keyArg(pos []string) (string, error) {
	switch len(pos) {
	case 0:
		return "", usagef("missing KEY")
	case 1:
	default:
		return "", usagef("takes one KEY, got %d arguments: %s", len(pos), strings.Join(pos, " "))
	}
	if err := idem.RawKey(pos[0]).Err(); err != nil {
		return "", usagef("%v", err)
	}
	return pos[0], nil
}

func noArgs(pos []string) error {
	if len(pos) > 0 {
		return usagef("takes no arguments, got: %s", strings.Join(pos, " "))
	}
	return nil
}

// printHelp writes c's help: synopsis, description, flags, exit codes.
func (c *command) printHelp(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: idem [--store URL] %s %s\n\n%s\n", c.name, c.synopsis, strings.TrimSpace(c.help))
	fmt.Fprintf(w, "\nFlags:\n")
	var rows [][2]string
	width := 0
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		left := "--" + f.Name
		if name != "" {
			left += " " + name
		}
		if def := f.DefValue; def != "" && def != "false" && def != "0" && f.Name != "store" {
			usage += fmt.Sprintf(" (default %s)", def)
		}
		rows = append(rows, [2]string{left, usage})
		width = max(width, len(left))
	})
	for _, r := range rows {
		fmt.Fprintf(w, "  %-*s  %s\n", width, r[0], r[1])
	}
	fmt.Fprintf(w, "\nExit codes:\n%s\n", strings.TrimRight(c.exits, "\n"))
}

func (a *app) topHelp(w io.Writer) {
	fmt.Fprint(w, `idem makes side effects happen once in systems that deliver at least once.
This command inspects and repairs the records of an idem store, explains
what happened to a key, serves the ledger over HTTP, and runs a demo.

Usage:
  idem [--store URL] COMMAND [flags] [arguments]

Commands:
`)
	width := 0
	for _, c := range allCommands() {
		width = max(width, len(c.name))
	}
	for _, c := range allCommands() {
		fmt.Fprintf(w, "  %-*s %s\n", width, c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-*s %s\n", width, "help", "show help for a command: idem help COMMAND")
	fmt.Fprintf(w, `
Global flags:
  --store URL  %s
               (also accepted after the command)
  -h, --help   show help

Stores:
%s
Exit codes:
%s
Run 'idem help COMMAND' (or 'idem COMMAND --help') for a command's flags.
`, wrap(strings.ReplaceAll(storeFlagHelp, "`", ""), 62, "\n               "), storesDoc, exitCodesDoc)
}

// storesDoc lists the store URLs: storesText, then what the commands do
// with a store that is missing.
var storesDoc = storesText("  ") + `  Commands other than demo never create or migrate a store: a missing
  database file or table, or a SQLite file without idem's tables or at an
  older schema version, is an error.
`

// storesText lists the backends of storeurl.Backends, one per entry: its
// URL forms in a column, then what it opens, wrapped, each line after
// indent. The help shows it, and doc.go holds it (TestStoreDocs).
func storesText(indent string) string {
	const col, width = 29, 76 // the forms' column and the line, after indent
	var b strings.Builder
	for _, be := range storeurl.Backends() {
		left := []string{strings.Join(be.Forms, ", ")}
		if len(left[0]) > col-2 {
			left = be.Forms
		}
		lines := strings.Split(wrap(be.Store, width-col, "\n"), "\n")
		for i, l := range left {
			if i < len(left)-1 || len(l) > col-2 {
				fmt.Fprintf(&b, "%s%s\n", indent, l)
				continue
			}
			fmt.Fprintf(&b, "%s%-*s%s\n", indent, col, l, lines[0])
			lines = lines[1:]
		}
		for _, l := range lines {
			fmt.Fprintf(&b, "%s%*s%s\n", indent, col, "", l)
		}
	}
	return b.String()
}

// wrap breaks s into lines of at most width bytes (a longer word has a line
// to itself), joined by sep.
func wrap(s string, width int, sep string) string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	return strings.Join(append(lines, line), sep)
}

const exitCodesDoc = `  0    ok
  1    operation error: the store failed, or the command refused
  2    usage error
  3    key not found
  4    refused because the key's lease is live (use --force)
  130  interrupted (Ctrl-C)
`

// operator names who resolves or releases a key, for the journal.
func operator() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = "operator"
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		name += "@" + h
	}
	return "idem-cli:" + name
}

// storeNow returns the store's clock.
func storeNow(ctx context.Context, s store.Store) (time.Time, error) {
	now, err := s.Now(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading the store's clock: %w", err)
	}
	return now, nil
}

// getRecord reads key, turning "absent" into exit 3.
// keyedRecord parses "[--json] KEY", opens the store and reads KEY's record:
// the preamble of the commands that show one key.
func keyedRecord(ctx context.Context, a *app, args []string, jsonUsage string) (rec idem.Record, now time.Time, asJSON bool, err error) {
	fs := a.cmd.flagSet(a)
	j := fs.Bool("json", false, jsonUsage)
	pos, err := a.parse(fs, args)
	if err != nil {
		return rec, now, false, err
	}
	key, err := keyArg(pos)
	if err != nil {
		return rec, now, false, err
	}
	s, err := a.open(ctx)
	if err != nil {
		return rec, now, false, err
	}
	rec, now, err = getRecord(ctx, s, key)
	return rec, now, *j, err
}

func getRecord(ctx context.Context, s store.Store, key string) (idem.Record, time.Time, error) {
	rec, err := s.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return rec, time.Time{}, notFound(key)
	}
	if err != nil {
		return rec, time.Time{}, err
	}
	now, err := storeNow(ctx, s)
	return rec, now, err
}

// durationValue is a flag.Value for durations that also takes days ("7d",
// "1d12h").
type durationValue struct{ d *time.Duration }

func (v durationValue) String() string {
	if v.d == nil {
		return ""
	}
	return explain.Dur(*v.d)
}

func (v durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

func parseDuration(s string) (time.Duration, error) {
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		var n int
		if _, err := fmt.Sscanf(s[:i], "%d", &n); err != nil || fmt.Sprint(n) != s[:i] {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		days = time.Duration(n) * 24 * time.Hour
		s = s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (write 30s, 15m, 36h or 7d)", s)
	}
	return days + d, nil
}
