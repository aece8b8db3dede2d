// Package storeurl opens an store.Store named by a URL, the one place where
// the idem command turns `--store` into a store. [New] returns the
// [Openers] of the schemes built into the command; adding a backend
// (a cloud store) is one more opener named in New.
//
//	sqlite:PATH, sqlite://PATH   store/sqlitestore on the database file PATH
//	postgres://..., postgresql://...
//	                             store/pgstore on the PostgreSQL database the URL names
//	redis://..., rediss://...    store/redisstore on the Redis server the URL names
//	dynamodb://TABLE?region=R&endpoint=URL
//	                             store/dynamostore on the DynamoDB table TABLE
//	mem:, mem:NAME               store/memstore; NAME shares one store per Openers
package storeurl

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/idemkit/idem/store"
)

// Options say how a store is being opened.
type Options struct {
	// MustExist refuses to create a store that does not exist yet (an
	// operator's command on a mistyped path must not make an empty
	// database and report "not found").
	MustExist bool
}

// opener opens the store that rest names; rest is the URL after
// "scheme:" (for "sqlite:///var/idem.db", "///var/idem.db"), and raw the
// whole URL as given, for schemes that parse it themselves.
type opener func(ctx context.Context, raw, rest string, o Options) (store.Store, error)

// Openers open the stores of the schemes built into the command. The
// in-memory stores named "mem:NAME" live in it: one store per name for as
// long as the Openers (the command makes one per run; tests share one
// between runs). Make one with [New]; it is safe for concurrent use.
type Openers struct {
	schemes map[string]opener

	memMu    sync.Mutex
	memNamed map[string]store.Store
}

// New returns the openers of the built-in schemes, with no named
// in-memory store yet.
func New() *Openers {
	o := &Openers{memNamed: map[string]store.Store{}}
	o.schemes = map[string]opener{
		"mem":        o.openMem,
		"sqlite":     openSQLite,
		"postgres":   openPostgres,
		"postgresql": openPostgres,
		"redis":      openRedis,
		"rediss":     openRedis,
		"dynamodb":   openDynamoDB,
	}
	return o
}

// Schemes returns the schemes o opens, sorted.
func (o *Openers) Schemes() []string {
	return slices.Sorted(maps.Keys(o.schemes))
}

// Has reports whether o opens scheme (lower case, without ':').
func (o *Openers) Has(scheme string) bool {
	_, ok := o.schemes[scheme]
	return ok
}

// ErrUnknownScheme is wrapped by the error for a URL whose scheme no
// opener handles, ErrNoScheme by the error for a URL without a scheme.
var (
	ErrUnknownScheme = errors.New("unknown store scheme")
	ErrNoScheme      = errors.New("no scheme")
)

// Open opens the store raw names.
func (o *Openers) Open(ctx context.Context, raw string, opts Options) (store.Store, error) {
	scheme, rest, ok := strings.Cut(raw, ":")
	if !ok || scheme == "" || strings.ContainsAny(scheme, "/\\.") {
		return nil, fmt.Errorf("store %q: %w; name a store as sqlite:PATH (e.g. sqlite:%s) or one of the schemes: %s",
			Redact(raw), ErrNoScheme, Redact(raw), strings.Join(o.Schemes(), ", "))
	}
	scheme = strings.ToLower(scheme)
	op := o.schemes[scheme]
	if op == nil {
		return nil, fmt.Errorf("store %q: %w %q (available: %s)", Redact(raw), ErrUnknownScheme, scheme, strings.Join(o.Schemes(), ", "))
	}
	return op(ctx, raw, rest, opts)
}

// Redact returns raw with a password replaced by "xxxxx", for messages:
// the one in its user info, and a "password" query parameter. It does not
// rely on the URL being well formed, since it is for the messages about
// URLs that are not: the user info runs to the last '@' (a password may
// hold an unencoded '/', '?', '#' or '@'), the password from the first ':'
// in it, and the "//" after the scheme may be missing
// ("postgres:alice:s3cret@db/billing"), as may the scheme itself
// ("alice:s3cret@db/billing"). A '@' in the query makes it redact more
// than the password, never less.
func Redact(raw string) string {
	prefix, rest := "", raw
	if scheme, after, ok := strings.Cut(raw, ":"); ok && knownScheme(scheme) {
		prefix, rest = scheme+":", after
		if r, ok := strings.CutPrefix(rest, "//"); ok {
			prefix, rest = prefix+"//", r
		}
	} else if scheme, after, ok := strings.Cut(raw, "://"); ok && !strings.ContainsAny(scheme, "@:/?#") {
		prefix, rest = scheme+"://", after
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if user, _, hasPass := strings.Cut(rest[:at], ":"); hasPass {
			return prefix + user + ":xxxxx@" + redactQuery(rest[at+1:])
		}
	}
	return prefix + redactQuery(rest)
}

// knownScheme reports whether scheme (any case) is one of the built-in
// store schemes, for Redact to tell "postgres:alice:s3cret@..." (scheme,
// user, password) from "alice:s3cret@..." (user, password).
func knownScheme(scheme string) bool {
	_, ok := New().schemes[strings.ToLower(scheme)]
	return ok
}

// redactQuery replaces the value of a "password" parameter in the query
// of path (after '?'), keeping the rest as written.
func redactQuery(path string) string {
	p, query, ok := strings.Cut(path, "?")
	if !ok {
		return path
	}
	params := strings.Split(query, "&")
	for i, kv := range params {
		k, _, _ := strings.Cut(kv, "=")
		if uk, err := url.QueryUnescape(k); err == nil && strings.EqualFold(uk, "password") {
			params[i] = k + "=xxxxx"
		}
	}
	return p + "?" + strings.Join(params, "&")
}
