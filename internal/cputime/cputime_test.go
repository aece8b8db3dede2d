package cputime

import (
	"os"
	"runtime"
	"testing"
	"time"
)

// spin works until Self has grown by d, or fails the test after 10 s of
// wall time (a loaded machine gives a spinning goroutine a share only).
func spin(t *testing.T, d time.Duration) {
	t.Helper()
	start := Self()
	for deadline := time.Now().Add(10 * time.Second); Self()-start < d; {
		if time.Now().After(deadline) {
			t.Fatalf("Self grew by %v in 10 s of spinning; want %v", Self()-start, d)
		}
	}
}

func TestSelfGrowsWithWork(t *testing.T) {
	before := Self()
	spin(t, 30*time.Millisecond)
	if after := Self(); after-before < 30*time.Millisecond || after-before > 5*time.Second {
		t.Fatalf("Self grew by %v for 30 ms of work", after-before)
	}
}

func TestOfFindsThisProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc is Linux's")
	}
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	name := string(comm[:len(comm)-1])
	spin(t, 50*time.Millisecond)
	got, ok := Of(name)
	// /proc counts in ticks of 10 ms; other processes may share the name
	// (go test's binaries), which only adds.
	if !ok || got < 40*time.Millisecond {
		t.Fatalf("Of(%q) = %v, %v; want this process's CPU (at least the 50 ms it spun)", name, got, ok)
	}
	if _, ok := Of("no-such-process-name"); ok {
		t.Fatal("Of found a process that does not exist")
	}
}
