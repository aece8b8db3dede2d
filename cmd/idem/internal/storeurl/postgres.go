package storeurl

import (
	"context"
	"fmt"
	"strings"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/pgstore"
)

// openPostgres opens "postgres://..." or "postgresql://...": store/pgstore
// on the database the URL names. The URL is handed to pgstore.Open, so it
// takes pgx's parameters (sslmode, pool_max_conns, ...) and pgstore's
// (idem_schema, idem_table, idem_migrate).
//
// With MustExist the table is neither created nor migrated: Open connects
// and checks that the record table exists, so that an operator's command
// on a mistyped database, schema or table fails instead of reporting an
// empty store. Otherwise (the demo) the table is created if missing, unless
// the URL says idem_migrate=false.
func openPostgres(_ *Openers, ctx context.Context, raw, rest string, o Options) (store.Store, error) {
	scheme, _, _ := strings.Cut(raw, ":")
	// pgx recognises the scheme in lower case only.
	u := strings.ToLower(scheme) + ":" + rest
	if !strings.HasPrefix(rest, "//") {
		return nil, fmt.Errorf("store %q: not a URL; write %s://USER:PASSWORD@HOST:PORT/DATABASE", Redact(raw), strings.ToLower(scheme))
	}
	var opts []pgstore.Option
	if o.MustExist {
		opts = append(opts, pgstore.WithMigrate(false))
	}
	s, err := pgstore.Open(ctx, u, opts...)
	if err != nil {
		return nil, fmt.Errorf("store %q: %w", Redact(raw), err)
	}
	if o.MustExist {
		var exists bool
		if err := s.Pool().QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", s.Table()).Scan(&exists); err != nil {
			s.Close()
			return nil, fmt.Errorf("store %q: %w", Redact(raw), err)
		}
		if !exists {
			s.Close()
			return nil, fmt.Errorf("store %q: no table %s in the database (name the workers' store with --store or IDEM_STORE, with %s and %s as they use them; their pgstore.Open creates the table)",
				Redact(raw), s.Table(), pgstore.ParamSchema, pgstore.ParamTable)
		}
	}
	return s, nil
}
