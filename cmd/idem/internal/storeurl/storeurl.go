// Package storeurl opens an idem.Store named by a URL, the one place where
// the idem command turns `--store` into a store. A scheme registers an
// [Opener]; adding a backend (postgres://, redis://, dynamodb://) is one more
// file that calls [Register].
//
//	sqlite:PATH, sqlite://PATH   store/sqlitestore on the database file PATH
//	mem:, mem:NAME               store/memstore; NAME shares one store per process
package storeurl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/idemkit/idem"
)

// Options say how a store is being opened.
type Options struct {
	// MustExist refuses to create a store that does not exist yet (an
	// operator's command on a mistyped path must not make an empty
	// database and report "not found").
	MustExist bool
}

// Opener opens the store that rest names; rest is the URL after
// "scheme:" (for "sqlite:///var/idem.db", "///var/idem.db"), and raw the
// whole URL for schemes that parse it themselves.
type Opener func(ctx context.Context, raw, rest string, o Options) (idem.Store, error)

var (
	mu      sync.RWMutex
	openers = map[string]Opener{}
)

// planned are schemes the design names whose stores are not built yet.
var planned = []string{"postgres", "postgresql", "redis", "rediss", "dynamodb"}

// Register makes scheme (lower case, without ':') open with o. It panics if
// the scheme is registered twice.
func Register(scheme string, o Opener) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := openers[scheme]; dup {
		panic("storeurl: scheme registered twice: " + scheme)
	}
	openers[scheme] = o
}

// Schemes returns the registered schemes, sorted.
func Schemes() []string {
	mu.RLock()
	defer mu.RUnlock()
	s := make([]string, 0, len(openers))
	for k := range openers {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}

// Has reports whether scheme is registered.
func Has(scheme string) bool {
	mu.RLock()
	defer mu.RUnlock()
	_, ok := openers[scheme]
	return ok
}

// ErrUnknownScheme is wrapped by the error for a URL whose scheme no
// opener handles, ErrNoScheme by the error for a URL without a scheme.
var (
	ErrUnknownScheme = errors.New("unknown store scheme")
	ErrNoScheme      = errors.New("no scheme")
)

// Open opens the store raw names.
func Open(ctx context.Context, raw string, o Options) (idem.Store, error) {
	scheme, rest, ok := strings.Cut(raw, ":")
	if !ok || scheme == "" || strings.ContainsAny(scheme, "/\\.") {
		return nil, fmt.Errorf("store %q: %w; name a store as sqlite:PATH (e.g. sqlite:%s) or one of the schemes: %s",
			Redact(raw), ErrNoScheme, raw, strings.Join(Schemes(), ", "))
	}
	scheme = strings.ToLower(scheme)
	mu.RLock()
	op := openers[scheme]
	mu.RUnlock()
	if op == nil {
		if slices.Contains(planned, scheme) {
			return nil, fmt.Errorf("store %q: %w %q: its store is not built into this idem yet (available: %s)",
				Redact(raw), ErrUnknownScheme, scheme, strings.Join(Schemes(), ", "))
		}
		return nil, fmt.Errorf("store %q: %w %q (available: %s)", Redact(raw), ErrUnknownScheme, scheme, strings.Join(Schemes(), ", "))
	}
	return op(ctx, raw, rest, o)
}

// Redact returns raw with a password in its user info replaced by "xxxxx",
// for messages.
func Redact(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	host, path, _ := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(host, '@'); at >= 0 {
		if user, _, hasPass := strings.Cut(host[:at], ":"); hasPass {
			host = user + ":xxxxx" + host[at:]
		}
	}
	out := scheme + "://" + host
	if path != "" || strings.Contains(rest, "/") {
		out += "/" + path
	}
	return out
}
