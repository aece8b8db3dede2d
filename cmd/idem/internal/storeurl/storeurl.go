// Package storeurl opens an store.Store named by a URL, the one place where
// the idem command turns `--store` into a store. [Backends] lists the
// backends built into the command, their URL schemes and how their URLs
// are written; it is the one list of them: [New] opens its schemes, and
// the command's help, its --store flag, cmd/idem/doc.go and docs/cli.md
// are made from it (a test in cmd/idem keeps the last two equal to it).
// Adding a backend (a cloud store) is one more entry there.
//
// "mem:NAME" (one in-memory store per name and [Openers]) is for tests;
// the documentation lists only "mem:".
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
// whole URL as given, for schemes that parse it themselves. o holds the
// named in-memory stores.
type opener func(o *Openers, ctx context.Context, raw, rest string, opts Options) (store.Store, error)

// Backend is one kind of store the command opens, as [Backends] lists it.
type Backend struct {
	// Schemes are the URL schemes that name it, lower case, without ':'.
	Schemes []string
	// Forms are how its URLs are written, for the documentation: each of
	// Schemes begins one of them.
	Forms []string
	// Short is the form the --store flag's one line of help shows.
	Short string
	// Store says what the URL opens, for the documentation.
	Store string
	// Package is the store package, "store/sqlitestore".
	Package string

	open opener
}

// Backends returns the backends built into the command, in the order the
// documentation lists them. It is a function, not a variable, because the
// openers refer back to it ([Redact]); each call returns a new list.
func Backends() []Backend {
	return []Backend{{
		Schemes: []string{"sqlite"},
		Forms:   []string{"sqlite:PATH", "sqlite://PATH"},
		Short:   "sqlite:PATH",
		Store:   "the SQLite database file PATH",
		Package: "store/sqlitestore",
		open:    openSQLite,
	}, {
		Schemes: []string{"postgres", "postgresql"},
		Forms:   []string{"postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=...&idem_schema=S&idem_table=T", "postgresql://..."},
		Short:   "postgres://USER:PASSWORD@HOST/DB",
		Store: "the PostgreSQL table S.T (default: idem_records in the first schema of " +
			"the search_path); other parameters are pgx's",
		Package: "store/pgstore",
		open:    openPostgres,
	}, {
		Schemes: []string{"redis", "rediss"},
		Forms:   []string{"redis://USER:PASSWORD@HOST:PORT/DB?idem_prefix=P", "rediss://..."},
		Short:   "redis://HOST:PORT/DB",
		Store: "the keys under prefix P (default idem:) in a Redis database, " +
			"over TLS for rediss:; other parameters are go-redis's",
		Package: "store/redisstore",
		open:    openRedis,
	}, {
		Schemes: []string{"dynamodb"},
		Forms:   []string{"dynamodb://TABLE?region=R&endpoint=URL"},
		Short:   "dynamodb://TABLE",
		Store: "the DynamoDB table TABLE; credentials from the AWS SDK's chain; " +
			"endpoint for an emulator such as dynalite",
		Package: "store/dynamostore",
		open:    openDynamoDB,
	}, {
		Schemes: []string{"mem"},
		Forms:   []string{"mem:"},
		Short:   "mem:",
		Store:   "an empty in-memory store, for trying things",
		Package: "store/memstore",
		open:    (*Openers).openMem,
	}}
}

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
	o := &Openers{memNamed: map[string]store.Store{}, schemes: map[string]opener{}}
	for _, b := range Backends() {
		for _, s := range b.Schemes {
			o.schemes[s] = b.open
		}
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
	return op(o, ctx, raw, rest, opts)
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
	scheme = strings.ToLower(scheme)
	for _, b := range Backends() {
		if slices.Contains(b.Schemes, scheme) {
			return true
		}
	}
	return false
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
