package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/idemkit/idem/idemvet"
	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/analysis/unitchecker"
	"golang.org/x/tools/go/packages"
)

var vetCmd = &command{
	name:     "vet",
	synopsis: "[--json] [--tests=false] [--CHECK=false ...] [PACKAGES]",
	summary:  "find keys that cannot recognise a repeat and handlers that swallow failures",
	help: `
Vet loads the Go packages named (default ./..., with their tests, as go vet
does) and reports, one line each as file:line:col: message [check]:

  nondetkey     a dedup or idempotency key derived from time.Now, math/rand,
                crypto/rand, a uuid/ksuid/xid/ulid generator or a counter
  deliveryid    an operation key built from a broker's delivery or message id
                (SQS MessageId, AMQP DeliveryTag, JetStream sequence, ...)
  bodyhash      a key that is a hash of a whole payload
  swallowed     an HTTP or Lambda handler that logs an error, then answers 2xx
  partialbatch  an events.SQSEvent handler that returns only error
  unusedallow   an //idem:allow comment that silences nothing

A finding is silenced by "//idem:allow CHECK reason" on its line or the
line before. --CHECK=false turns a check off. --json prints the findings
as a JSON array of {"file","line","column","check","message","fixes"}.
Vet never opens the store. The same checks run under go vet:

  go vet -vettool=$(command -v idem) ./...

docs/vet.md describes each check, its fix and its limits.`,
	exits: `  0    no findings
  1    findings, or packages that do not load
  2    usage error`,
	run: runVet,
}

// vetFinding is one finding as --json prints it.
type vetFinding struct {
	File    string   `json:"file"`
	Line    int      `json:"line"`
	Column  int      `json:"column"`
	Check   string   `json:"check"`
	Message string   `json:"message"`
	Fixes   []string `json:"fixes,omitempty"` // the suggested fixes' descriptions
}

func runVet(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	asJSON := fs.Bool("json", false, "print the findings as a JSON array")
	tests := fs.Bool("tests", true, "also check the packages' test files")
	enabled := map[string]*bool{}
	for _, an := range idemvet.Analyzers() {
		enabled[an.Name] = fs.Bool(an.Name, true, "run the "+an.Name+" check")
	}
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		pos = []string{"./..."}
	}
	var analyzers []*analysis.Analyzer
	for _, an := range idemvet.Analyzers() {
		if *enabled[an.Name] {
			analyzers = append(analyzers, an)
		}
	}
	findings, loadErr := vet(ctx, pos, *tests, analyzers)
	if *asJSON {
		if findings == nil {
			findings = []vetFinding{}
		}
		if err := writeJSONIndent(a.stdout, findings); err != nil {
			return err
		}
	} else {
		for _, f := range findings {
			fmt.Fprintf(a.stdout, "%s:%d:%d: %s [%s]\n", f.File, f.Line, f.Column, f.Message, f.Check)
		}
	}
	if loadErr != nil {
		return loadErr
	}
	if len(findings) > 0 {
		return &codeError{code: exitError}
	}
	return nil
}

// maxLoadErrors is how many load errors vet prints: the first ones say
// what is wrong (a module not downloaded, a build tag), the rest repeat it.
const maxLoadErrors = 10

// vet loads the packages that patterns name and runs analyzers on them.
// A package that does not load is reported in the error, and the others
// are still checked.
func vet(ctx context.Context, patterns []string, tests bool, analyzers []*analysis.Analyzer) ([]vetFinding, error) {
	cfg := &packages.Config{
		Context: ctx,
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedCompiledGoFiles | packages.NeedImports |
			packages.NeedTypes | packages.NeedTypesSizes | packages.NeedSyntax | packages.NeedTypesInfo | packages.NeedModule,
		Tests: tests,
	}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		return nil, err
	}
	var loadErrs []string
	var good []*packages.Package
	for _, p := range pkgs {
		if len(p.Errors) > 0 {
			for _, e := range p.Errors {
				loadErrs = append(loadErrs, e.Error())
			}
			continue
		}
		good = append(good, p)
	}
	var out []vetFinding
	if len(analyzers) > 0 && len(good) > 0 {
		g, err := checker.Analyze(analyzers, good, nil)
		if err != nil {
			return nil, err
		}
		cwd, _ := os.Getwd()
		seen := map[string]bool{} // a file is in a package and in its test variant
		for _, act := range g.Roots {
			if act.Err != nil {
				loadErrs = append(loadErrs, fmt.Sprintf("%s: %v", act, act.Err))
				continue
			}
			for _, d := range act.Diagnostics {
				p := act.Package.Fset.Position(d.Pos)
				f := vetFinding{File: relPath(cwd, p), Line: p.Line, Column: p.Column, Check: act.Analyzer.Name, Message: d.Message}
				for _, fix := range d.SuggestedFixes {
					f.Fixes = append(f.Fixes, fix.Message)
				}
				k := fmt.Sprintf("%s:%d:%d:%s:%s", f.File, f.Line, f.Column, f.Check, f.Message)
				if !seen[k] {
					seen[k] = true
					out = append(out, f)
				}
			}
		}
	}
	slices.SortFunc(out, func(x, y vetFinding) int {
		if c := strings.Compare(x.File, y.File); c != 0 {
			return c
		}
		if x.Line != y.Line {
			return x.Line - y.Line
		}
		if x.Column != y.Column {
			return x.Column - y.Column
		}
		return strings.Compare(x.Check, y.Check)
	})
	if len(loadErrs) > 0 {
		slices.Sort(loadErrs)
		loadErrs = slices.Compact(loadErrs)
		if n := len(loadErrs); n > maxLoadErrors {
			loadErrs = append(loadErrs[:maxLoadErrors], fmt.Sprintf("and %d more", n-maxLoadErrors))
		}
		return out, &codeError{code: exitError, err: errors.New("packages that do not load:\n  " + strings.Join(loadErrs, "\n  "))}
	}
	return out, nil
}

// relPath returns p's file relative to dir when it is under it.
func relPath(dir string, p token.Position) string {
	if dir != "" {
		if r, err := filepath.Rel(dir, p.Filename); err == nil && !strings.HasPrefix(r, "..") {
			return r
		}
	}
	return p.Filename
}

// isVetTool reports whether args are go vet's calls to a -vettool: -V=full
// and -flags to describe the tool, then flags and one .cfg file per
// package.
func isVetTool(args []string) bool {
	if len(args) == 0 {
		return false
	}
	if args[0] == "-V=full" || args[0] == "-flags" {
		return true
	}
	return strings.HasSuffix(args[len(args)-1], ".cfg")
}

// vetTool hands the process over to unitchecker, which speaks go vet's
// protocol, and does not return.
func vetTool() {
	flag.CommandLine.SetOutput(os.Stderr)
	unitchecker.Main(idemvet.Analyzers()...)
}
