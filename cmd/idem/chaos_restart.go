package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The store-restart fault: the harness runs the user's command
// (--restart-store CMD, through /bin/sh -c) that restarts the store's
// server, a few times during the run. It is off unless the command is
// given: restarting a server is the user's call, not the tool's.

// chaosRestartTimeout bounds one run of the restart command.
const chaosRestartTimeout = 2 * time.Minute

// chaosPatience is how long a worker or a relay keeps trying to open the
// store and queue, and the producer to publish a message, while the store
// restarts.
const chaosPatience = time.Minute

// chaosRestartReport is the store restarts' figures in a policy's report.
type chaosRestartReport struct {
	Restarts int `json:"restarts"`
	// Longest is the longest run of the restart command: the store was
	// down for at most that long each time.
	Longest string `json:"longest"`
	Failed  int    `json:"failed"`
}

// chaosRestartState is the harness's side of the store-restart fault.
type chaosRestartState struct {
	done    int
	failed  int
	longest time.Duration
}

// chaosRestartEvery is the pause before each restart: a third of the
// duration, between 2 s and 30 s, so that a short run restarts the store
// twice and the workers have time to ride each restart out.
func chaosRestartEvery(d time.Duration) time.Duration {
	return min(max(d/3, 2*time.Second), 30*time.Second)
}

// restartLoop runs the restart command every chaosRestartEvery until ctx
// ends; a restart under way when it does is let finish. The command's
// output goes to restart.log in the run's directory; a command that fails
// is counted (a violation: the run did not restart the store as asked).
func (r *chaosScenario) restartLoop(ctx context.Context) {
	for sleepCtx(ctx, chaosRestartEvery(r.o.duration)) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), chaosRestartTimeout)
		start := time.Now()
		cmd := exec.CommandContext(cctx, "/bin/sh", "-c", r.o.restartStore)
		logf, err := openAppend(r.dir, "restart.log")
		if err == nil {
			cmd.Stdout, cmd.Stderr = logf, logf
			_ = appendLine(logf, "# %s: restarting the store", start.UTC().Format(time.RFC3339Nano))
			err = cmd.Run()
			logf.Close()
		}
		cancel()
		took := time.Since(start)
		r.mu.Lock()
		if err != nil {
			r.restart.failed++
		} else {
			r.restart.done++
			r.restart.longest = max(r.restart.longest, took)
		}
		r.mu.Unlock()
		r.noteFault(time.Now())
	}
}

// checkRestarts fills pr.Restart: a restart command that failed is a
// violation, and so is a run with the fault on and no restart done.
func (r *chaosScenario) checkRestarts(pr *chaosPolicyReport) {
	if !r.has(faultStoreRestart) {
		return
	}
	r.mu.Lock()
	st := r.restart
	r.mu.Unlock()
	pr.Restart = &chaosRestartReport{Restarts: st.done, Failed: st.failed, Longest: st.longest.Round(10 * time.Millisecond).String()}
	pr.FaultsInjected[faultStoreRestart] = st.done
	if st.failed > 0 {
		pr.violate("the restart command failed %d times (see %s)", st.failed, filepath.Join(r.dir, "restart.log"))
	}
}

// checkRestartFlag checks --faults against --restart-store: the
// store-restart fault needs the command, and a server to restart.
func checkRestartFlag(o *chaosOptions, faultsGiven bool) error {
	if o.restartStore == "" {
		for _, f := range o.faults {
			if f == faultStoreRestart {
				return usagef("--faults: %s needs --restart-store CMD, the command that restarts the store's server", faultStoreRestart)
			}
		}
		return nil
	}
	if strings.TrimSpace(o.restartStore) == "" {
		return usagef("--restart-store: empty command")
	}
	if o.pgURL == "" && o.redisURL == "" {
		return usagef("--restart-store: chaos restarts a PostgreSQL or Redis store (--store postgres://... or redis://...), not the embedded store or DynamoDB")
	}
	if !faultsGiven {
		o.faults = append(o.faults, faultStoreRestart)
	}
	return nil
}

// openChaosBackendPatiently opens t in a worker or a relay, trying again
// for up to chaosPatience while the store is down (a process started
// during a store restart).
func openChaosBackendPatiently(ctx context.Context, t *chaosTarget, dir string) (chaosBackend, error) {
	deadline := time.Now().Add(chaosPatience)
	for {
		be, err := openChaosBackend(ctx, t, dir, false)
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			if err != nil {
				return nil, fmt.Errorf("opening the store and queue: %w", err)
			}
			return be, nil
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
}

// chaosReadyWait bounds how long the harness waits for the first worker
// to connect before the messages and the faults begin.
const chaosReadyWait = time.Minute

// markReady notes in the run's directory that the worker pid has opened
// the store and the queue.
func markReady(dir string, pid int) {
	if f, err := openAppend(dir, "ready"); err == nil {
		_ = appendLine(f, "%d", pid)
		f.Close()
	}
}

// awaitReady waits until the first workers have opened the store and the
// queue (markReady), so that the faults' --duration is spent on a pipeline
// that runs: on a loaded machine starting the worker processes takes
// seconds, and a store cut or restart before any worker has connected
// proves nothing. It waits for all --workers at most chaosReadyWait, and
// fails if by then not one has connected.
func (r *chaosScenario) awaitReady(ctx context.Context) error {
	deadline := time.Now().Add(chaosReadyWait)
	for {
		b, _ := os.ReadFile(filepath.Join(r.dir, "ready"))
		n := bytes.Count(b, []byte("\n"))
		if n >= r.o.workers || (n > 0 && time.Now().After(deadline)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no worker opened the store and the queue within %s (worker output: %s)", chaosReadyWait, filepath.Join(r.dir, "worker.out"))
		}
		if !sleepCtx(ctx, 20*time.Millisecond) {
			return ctx.Err()
		}
	}
}
