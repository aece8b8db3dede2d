package main

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// chaosProcs is one kind of the harness's child processes (the workers,
// the relays): this binary again, told what to be by env. Its fields are
// guarded by the scenario's mu. The zero value has none, and stops.
type chaosProcs struct {
	name     string            // "worker", "relay": its output goes to name.out
	label    string            // how a failure names a process: "pid", "relay pid"
	env      string            // NAME=JSON: the process's config
	procs    map[int]*exec.Cmd // alive, by pid
	exited   map[int]chan struct{}
	killed   map[int]bool // by a scheduled kill (SIGKILL)
	started  int
	stopping bool
}

func newChaosProcs(name, label, env string) chaosProcs {
	return chaosProcs{name: name, label: label, env: env,
		procs: map[int]*exec.Cmd{}, exited: map[int]chan struct{}{}, killed: map[int]bool{}}
}

// startProc starts one of p's processes; a goroutine waits for it and,
// unless the run is stopping, starts another in its place (a killed
// process is replaced).
func (r *chaosScenario) startProc(p *chaosProcs) error {
	cmd := exec.Command(r.o.exe)
	cmd.Env = append(os.Environ(), p.env)
	logf, err := openAppend(r.dir, p.name+".out")
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting a %s: %w", p.name, err)
	}
	pid := cmd.Process.Pid
	done := make(chan struct{})
	r.mu.Lock()
	if p.stopping { // stopProcs has taken its list: a process started now would outlive the run
		r.mu.Unlock()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		return nil
	}
	p.procs[pid] = cmd
	p.exited[pid] = done
	p.started++
	r.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		close(done)
		r.mu.Lock()
		delete(p.procs, pid)
		stopping := p.stopping
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				p.killed[pid] = true
				if time.Now().After(r.lastFault) {
					r.lastFault = time.Now()
				}
			} else if !stopping {
				r.failed = append(r.failed, fmt.Sprintf("%s %d: %v (see %s)", p.label, pid, err, filepath.Join(r.dir, p.name+".out")))
			}
		}
		r.mu.Unlock()
		if !stopping {
			if err := r.startProc(p); err != nil {
				r.mu.Lock()
				r.failed = append(r.failed, err.Error())
				r.mu.Unlock()
			}
		}
	}()
	return nil
}

// stopProcs ends p's processes: SIGCONT (a frozen worker; nothing to one
// running), SIGTERM, then SIGKILL after 10 s.
func (r *chaosScenario) stopProcs(p *chaosProcs) {
	r.mu.Lock()
	p.stopping = true
	procs := maps.Clone(p.procs)
	var waits []chan struct{}
	for pid, cmd := range procs {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		waits = append(waits, p.exited[pid])
	}
	r.mu.Unlock()
	timeout := time.After(10 * time.Second)
	for _, w := range waits {
		select {
		case <-w:
		case <-timeout:
			for _, cmd := range procs {
				_ = cmd.Process.Kill()
			}
			<-w
		}
	}
}
