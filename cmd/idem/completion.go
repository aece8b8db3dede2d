package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

var completionCmd = &command{
	name:     "completion",
	synopsis: "bash|zsh",
	summary:  "print a shell completion script for bash or zsh",
	help: `
Completion prints a script that completes idem's commands, the queue
subcommands and each command's flags in bash or zsh (keys are not
completed: that would read the store). The script is made from the
commands this binary has, so print it again after an upgrade.

  bash:  source <(idem completion bash)
         or idem completion bash > /etc/bash_completion.d/idem
  zsh:   source <(idem completion zsh)      (in ~/.zshrc, after compinit)

The zsh script runs the bash one through zsh's bashcompinit. It never
opens the store.`,
	exits: `  0    ok
  2    usage error`,
}

// The run function is set here: it lists allCommands, which lists
// completionCmd, an initialization cycle in completionCmd's literal.
func init() { completionCmd.run = runCompletion }

func runCompletion(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("takes one shell: bash or zsh")
	}
	switch pos[0] {
	case "bash":
		_, err = io.WriteString(a.stdout, bashCompletion())
	case "zsh":
		_, err = io.WriteString(a.stdout, "# zsh completion for idem, made by `idem completion zsh`.\n"+
			"autoload -U +X bashcompinit && bashcompinit\n"+bashCompletion())
	default:
		return usagef("unknown shell %q: want bash or zsh", pos[0])
	}
	return err
}

// cliFlag is one flag of a command, for completion.
type cliFlag struct {
	name  string
	value bool // takes a value (not a bool flag)
}

// cliCommand is a command (or a queue subcommand) and its flags.
type cliCommand struct {
	name  string // "ls", "queue stats"
	flags []cliFlag
}

// commandFlags lists each command's flags, and each queue subcommand's,
// by running the command with a.flagSink set: its a.parse hands over the
// FlagSet it made and stops, before anything else is done.
func commandFlags() []cliCommand {
	var out []cliCommand
	collect := func(c *command, args []string) {
		var flags []cliFlag
		a := &app{stdout: io.Discard, stderr: io.Discard, cmd: c, flagSink: func(fs *flag.FlagSet) {
			fs.VisitAll(func(f *flag.Flag) {
				bf, isBool := f.Value.(interface{ IsBoolFlag() bool })
				flags = append(flags, cliFlag{name: f.Name, value: !isBool || !bf.IsBoolFlag()})
			})
		}}
		_ = c.run(context.Background(), a, args)
		out = append(out, cliCommand{name: a.cmd.name, flags: flags})
	}
	for _, c := range allCommands() {
		if c == queueCmd {
			for _, sub := range queueSubcommands() {
				collect(c, []string{strings.TrimPrefix(sub.name, "queue ")})
			}
			continue
		}
		collect(c, nil)
	}
	return out
}

// queueSubcommands are the subcommands of idem queue.
func queueSubcommands() []*command { return []*command{queueStatsCmd, queueRedriveCmd} }

// fileFlags are flags whose value is a file name; the others' values are
// not completed.
var fileFlags = map[string]bool{"result-file": true, "token-file": true}

// bashCompletion is the bash completion script, made from the command
// table: commands, queue subcommands and every command's flags.
func bashCompletion() string {
	cmds := commandFlags()
	valueFlags := map[string]bool{"store": true}
	var names, subs []string
	for _, c := range allCommands() {
		names = append(names, c.name)
	}
	for _, c := range queueSubcommands() {
		subs = append(subs, strings.TrimPrefix(c.name, "queue "))
	}
	for _, c := range cmds {
		for _, f := range c.flags {
			valueFlags[f.name] = valueFlags[f.name] || f.value
		}
	}
	names = append(names, "help")
	var value, file []string
	for f, v := range valueFlags {
		if !v {
			continue
		}
		if fileFlags[f] || f == "store" {
			file = append(file, "--"+f, "-"+f)
		} else {
			value = append(value, "--"+f, "-"+f)
		}
	}
	sort.Strings(value)
	sort.Strings(file)

	var b strings.Builder
	fmt.Fprintf(&b, `# bash completion for idem, made by 'idem completion bash'.
_idem() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
	# A value of --store, --result-file or --token-file: a file name (a
	# SQLite store); of another flag: nothing to offer.
	case $prev in
	%s)
		compopt -o filenames 2>/dev/null
		COMPREPLY=($(compgen -f -- "$cur"))
		return
		;;
	%s)
		COMPREPLY=()
		return
		;;
	esac
	# The command (and queue's subcommand): the first words that are
	# neither a flag nor a flag's value.
	local i w cmd= sub=
	for ((i = 1; i < COMP_CWORD; i++)); do
		w=${COMP_WORDS[i]}
		case $w in
		%s) ((i++)) ;;
		-*) ;;
		*)
			if [[ -z $cmd ]]; then
				cmd=$w
			elif [[ $cmd == queue && -z $sub ]]; then
				sub=$w
			fi
			;;
		esac
	done
	local words
	case $cmd in
	"") words="%s --store --help" ;;
	help) words="%s" ;;
	queue)
		case $sub in
		"") words="%s --help" ;;
`, strings.Join(file, "|"), strings.Join(value, "|"), strings.Join(append(append([]string(nil), file...), value...), "|"),
		strings.Join(names, " "), strings.Join(names[:len(names)-1], " "), strings.Join(subs, " "))
	flagWords := func(c cliCommand) string {
		var w []string
		for _, f := range c.flags {
			w = append(w, "--"+f.name)
		}
		return strings.Join(append(w, "--help"), " ")
	}
	for _, c := range cmds {
		if sub, ok := strings.CutPrefix(c.name, "queue "); ok {
			fmt.Fprintf(&b, "\t\t%s) words=%q ;;\n", sub, flagWords(c))
		}
	}
	b.WriteString("\t\tesac\n\t\t;;\n")
	for _, c := range cmds {
		if c.name == "completion" {
			fmt.Fprintf(&b, "\tcompletion) words=%q ;;\n", "bash zsh "+flagWords(c))
		} else if !strings.HasPrefix(c.name, "queue ") {
			fmt.Fprintf(&b, "\t%s) words=%q ;;\n", c.name, flagWords(c))
		}
	}
	b.WriteString(`	esac
	COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -F _idem idem
`)
	return b.String()
}
