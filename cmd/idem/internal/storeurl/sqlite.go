package storeurl

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/idemkit/idem"
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

func openSQLite(ctx context.Context, raw, rest string, o Options) (idem.Store, error) {
	path := SQLitePath(rest)
	if path == "" {
		return nil, fmt.Errorf("store %q: no database file; write sqlite:PATH", raw)
	}
	if o.MustExist {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("store %q: no database file %s (name the workers' store with --store or IDEM_STORE)", raw, path)
		}
	}
	s, err := sqlitestore.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	return s, nil
}
