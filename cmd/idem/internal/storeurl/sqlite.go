package storeurl

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/sqlitestore"
)

// SQLitePath returns the database file a sqlite URL names: "sqlite:PATH",
// "sqlite://PATH" (relative) or "sqlite:///PATH" (absolute).
func SQLitePath(rest string) string {
	if p, ok := strings.CutPrefix(rest, "//"); ok {
		return p
	}
	return rest
}

func openSQLite(_ *Openers, ctx context.Context, raw, rest string, o Options) (store.Store, error) {
	path := SQLitePath(rest)
	if path == "" {
		return nil, fmt.Errorf("store %q: no database file; write sqlite:PATH", raw)
	}
	var opts []sqlitestore.Option
	if o.MustExist {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("store %q: no database file %s (name the workers' store with --store or IDEM_STORE)", raw, path)
		}
		// Neither create the tables in a file that has none (another
		// program's database, a mistyped path) nor migrate the workers'
		// store: older builds among them would refuse it.
		opts = append(opts, sqlitestore.WithMigrate(false))
	}
	s, err := sqlitestore.Open(ctx, path, opts...)
	if errors.Is(err, sqlitestore.ErrNotMigrated) {
		return nil, fmt.Errorf("store %q: %w (this command neither creates nor migrates a store: name the workers' store with --store or IDEM_STORE, or let a worker of this build migrate it)", raw, err)
	}
	if err != nil {
		return nil, fmt.Errorf("store %q: %w", raw, err)
	}
	return s, nil
}
