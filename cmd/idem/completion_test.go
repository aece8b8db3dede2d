package main

import (
	"github.com/idemkit/idem/internal/testenv"

	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The flags completion finds are the ones each command defines: a new
// flag or command is in the script without more work.
func TestCompletionFlags(t *testing.T) {
	got := map[string][]string{}
	for _, c := range commandFlags() {
		for _, f := range c.flags {
			got[c.name] = append(got[c.name], f.name)
		}
	}
	for cmd, flags := range map[string][]string{
		"ls":            {"store", "status", "stuck", "limit", "after", "json"},
		"resolve":       {"done", "not-done", "result", "result-file", "retention", "fence", "force", "reason", "by"},
		"serve":         {"listen", "token-file", "max-body", "hash-keys", "metrics"},
		"queue stats":   {"queue", "schema", "json"},
		"queue redrive": {"queue", "limit", "schema", "json"},
		"completion":    {"store"},
	} {
		for _, f := range flags {
			if !strings.Contains(" "+strings.Join(got[cmd], " ")+" ", " "+f+" ") {
				t.Errorf("%s: flags %q lack %s", cmd, got[cmd], f)
			}
		}
	}
	for _, c := range allCommands() {
		if _, ok := got[c.name]; !ok && c != queueCmd {
			t.Errorf("no flags found for %s", c.name)
		}
	}
}

func TestCompletionScript(t *testing.T) {
	ctx := context.Background()
	for _, shell := range []string{"bash", "zsh"} {
		r := idemRun(ctx, "completion", shell)
		r.expect(t, 0, "complete -F _idem idem", "stats redrive")
		for _, c := range commandFlags() {
			for _, f := range c.flags {
				if !strings.Contains(r.stdout, "--"+f.name) {
					t.Errorf("%s: the script lacks %s's --%s", shell, c.name, f.name)
				}
			}
		}
		for _, c := range allCommands() {
			if !strings.Contains(r.stdout, "\t"+c.name+") words=") && c != queueCmd {
				t.Errorf("%s: the script has no case for %s", shell, c.name)
			}
		}
	}
	idemRun(ctx, "completion").expectErr(t, 2, "takes one shell")
	idemRun(ctx, "completion", "fish").expectErr(t, 2, `unknown shell "fish"`)
	idemRun(ctx, "completion", "bash", "zsh").expectErr(t, 2, "takes one shell")
}

// completionCases are command lines (the word under the cursor last) and
// the words the script offers there.
var completionCases = []struct{ line, want string }{
	{"idem ", "inspect ls release resolve delete sweep queue explain serve demo chaos vet version completion help --store --help"},
	{"idem q", "queue"},
	{"idem queue ", "stats redrive --help"},
	{"idem queue redrive --l", "--limit"},
	{"idem --store x.db l", "ls"},
	{"idem ls --limit 5 --st", "--status --store --stuck"},
	{"idem --store mem: queue --queue q st", "stats"},
	{"idem help se", "serve"},
	{"idem completion ", "bash zsh --store --help"},
	{"idem resolve k --re", "--reason --result --result-file --retention"},
	{"idem ls --limit ", ""},
	{"idem resolve k --result-file idem-compl", "idem-completion-file"},
}

// TestCompletionBash runs the script in bash, as bash runs it on Tab.
func TestCompletionBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash here")
	}
	script := completionScript(t, "bash")
	for _, tc := range completionCases {
		out, err := exec.Command(bash, "--norc", "--noprofile", "-c", `
source "$1"
read -ra COMP_WORDS <<<"$2"
[[ $2 == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
_idem
echo "${COMPREPLY[*]}"`, "bash", script, tc.line).CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v\n%s", tc.line, err, out)
		}
		if got := strings.TrimSpace(string(out)); got != tc.want {
			t.Errorf("%q: bash offers %q, want %q", tc.line, got, tc.want)
		}
	}
}

// TestCompletionZsh sources the zsh script after compinit and runs its
// function as bashcompinit does (sh emulation). zsh itself then keeps the
// words that start with the one under the cursor, so only the command
// lines that end in a space are checked word for word.
func TestCompletionZsh(t *testing.T) {
	zsh, err := exec.LookPath("zsh")
	if err != nil {
		zsh = testenv.Require(t, testenv.Zsh, "the zsh completion test")
	}
	script := completionScript(t, "zsh")
	for _, tc := range completionCases {
		if !strings.HasSuffix(tc.line, " ") {
			continue
		}
		out, err := exec.Command(zsh, "-f", "-c", `
autoload -U compinit && compinit -u -d "$3"
source "$1"
t() {
	emulate -L sh
	setopt kshglob noshglob braceexpand
	COMP_WORDS=($1 "") # split on spaces: sh emulation
	COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
	_idem
	echo "${COMPREPLY[*]}"
}
t "$2"`, "zsh", script, tc.line, filepath.Join(t.TempDir(), "zcompdump")).CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v\n%s", tc.line, err, out)
		}
		if got := strings.TrimSpace(string(out)); got != tc.want {
			t.Errorf("%q: zsh offers %q, want %q", tc.line, got, tc.want)
		}
	}
}

// completionScript writes `idem completion SHELL` to a file in a new
// directory, made the working directory for file-name completion, and
// returns the file's path.
func completionScript(t *testing.T, shell string) string {
	t.Helper()
	r := idemRun(context.Background(), "completion", shell)
	r.expect(t, 0)
	dir := t.TempDir()
	path := filepath.Join(dir, "idem-completion-file")
	if err := os.WriteFile(path, []byte(r.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	return path
}
