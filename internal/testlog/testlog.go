// Package testlog holds what tests use to read the logs of code that logs
// from several goroutines.
package testlog

import (
	"strings"
	"sync"
)

// Buffer collects log output written from several goroutines: an
// io.Writer for a slog handler, safe for concurrent use, whose String
// returns everything written so far. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
