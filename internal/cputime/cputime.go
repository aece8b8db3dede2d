// Package cputime reads CPU time for benchmarks: this process's own, and
// that of the servers a benchmark talks to (redis-server, nats-server,
// RabbitMQ's beam.smp), so that a figure can say where a message's CPU went
// (the client, the broker, the ledger's store) rather than only how fast
// two shared cores moved it.
package cputime

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Self is the user and system CPU time this process has used.
func Self() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Of is the user and system CPU time used so far by every process whose
// command name (Linux's /proc/PID/comm, at most 15 bytes) is name, and
// false when there is none or /proc cannot be read (not Linux). A server
// run as several processes (PostgreSQL's backends) is summed; a process
// that exited between two readings drops out of the second, so compare
// readings of long-lived servers only.
func Of(name string) (time.Duration, bool) {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var total time.Duration
	found := false
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // exited since the glob
		}
		// "PID (comm) state ppid ...": comm may hold spaces and
		// parentheses, so it ends at the last ')'.
		open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if open < 0 || end < open || string(b[open+1:end]) != name || end+2 > len(b) {
			continue
		}
		// After the comm: state is field 3 of the line, utime field 14,
		// stime field 15, in clock ticks.
		f := bytes.Fields(b[end+2:])
		if len(f) < 13 {
			continue
		}
		ut, err1 := strconv.ParseInt(string(f[11]), 10, 64)
		st, err2 := strconv.ParseInt(string(f[12]), 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		total += time.Duration(ut+st) * time.Second / clockTicks
		found = true
	}
	return total, found
}

// clockTicks is USER_HZ, the unit of /proc's times: 100 on every Linux
// architecture Go supports (the kernel fixes it for user space).
const clockTicks = 100
