// Command skipped runs idem's tests with -short and lists the suites that
// skipped for want of a real service, one line per IDEM_TEST_* variable:
//
//	go run ./internal/cmd/skipped
//
// prints, for example,
//
//	IDEM_TEST_POSTGRES: skipped 12 suites in 5 packages (httpidem, queue/sqlqueue, ...)
//
// A suite is a top-level test that skipped, itself or in a subtest, with
// the message of internal/testenv ("set IDEM_TEST_X=... to run ..."). Its
// arguments replace the packages (default ./...); -full drops -short. It
// exits 1, after the list, if go test failed, naming the failed packages.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
)

// event is the part of a test2json event that this reads.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// skipRE matches internal/testenv's skip message.
var skipRE = regexp.MustCompile(`\bset (IDEM_TEST_[A-Z0-9_]+)=`)

const module = "github.com/idemkit/idem"

func main() {
	full := flag.Bool("full", false, "run without -short")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: go run ./internal/cmd/skipped [-full] [packages]")
		flag.PrintDefaults()
	}
	flag.Parse()
	args := []string{"test", "-json", "-count=1"}
	if !*full {
		args = append(args, "-short")
	}
	pkgs := flag.Args()
	if len(pkgs) == 0 {
		pkgs = []string{"./..."}
	}
	cmd := exec.Command("go", append(args, pkgs...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "skipped:", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "skipped:", err)
		os.Exit(2)
	}
	sum, failed, err := summarise(out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "skipped: reading go test -json:", err)
	}
	waitErr := cmd.Wait()
	fmt.Print(sum)
	if waitErr != nil || len(failed) > 0 {
		fmt.Printf("go test failed (%v): %s\n", waitErr, strings.Join(failed, ", "))
		os.Exit(1)
	}
}

// summarise reads go test -json from r and returns the summary, one line
// per variable, and the packages that failed.
func summarise(r io.Reader) (string, []string, error) {
	type suite struct{ pkg, test string }
	suites := map[string]map[suite]bool{} // variable → suites it skipped
	var failed []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // a build error's plain text
		}
		switch {
		case e.Action == "fail" && e.Test == "":
			failed = append(failed, short(e.Package))
		case e.Action == "output" && e.Test != "":
			for _, m := range skipRE.FindAllStringSubmatch(e.Output, -1) {
				top, _, _ := strings.Cut(e.Test, "/")
				if suites[m[1]] == nil {
					suites[m[1]] = map[suite]bool{}
				}
				suites[m[1]][suite{e.Package, top}] = true
			}
		}
	}
	vars := make([]string, 0, len(suites))
	for v := range suites {
		vars = append(vars, v)
	}
	sort.Strings(vars)
	var b strings.Builder
	if len(vars) == 0 {
		b.WriteString("no suite skipped for want of an IDEM_TEST_* variable\n")
	}
	for _, v := range vars {
		inPkg := map[string]bool{}
		for s := range suites[v] {
			inPkg[short(s.pkg)] = true
		}
		pkgs := make([]string, 0, len(inPkg))
		for p := range inPkg {
			pkgs = append(pkgs, p)
		}
		sort.Strings(pkgs)
		fmt.Fprintf(&b, "%s: skipped %d %s in %d %s (%s)\n", v,
			len(suites[v]), plural(len(suites[v]), "suite"), len(pkgs), plural(len(pkgs), "package"), strings.Join(pkgs, ", "))
	}
	sort.Strings(failed)
	return b.String(), failed, sc.Err()
}

// short drops the module path from a package path.
func short(pkg string) string {
	if pkg == module {
		return "idem"
	}
	return strings.TrimPrefix(pkg, module+"/")
}

func plural(n int, s string) string {
	if n == 1 {
		return s
	}
	return s + "s"
}
