package storeurl

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/redisstore"
)

// openRedis opens "redis://..." or "rediss://..." (TLS): store/redisstore
// on the server the URL names, with go-redis's parameters (db in the path,
// pool_size, dial_timeout, ...) and redisstore's (idem_prefix,
// idem_keep_expired, idem_wait_replicas, idem_wait_timeout). A Redis store
// has nothing to create, so MustExist only requires the server to answer:
// an operator's command on a mistyped prefix finds no keys rather than an
// error.
func openRedis(_ *Openers, ctx context.Context, raw, rest string, _ Options) (store.Store, error) {
	scheme, _, _ := strings.Cut(raw, ":")
	if !strings.HasPrefix(rest, "//") {
		return nil, fmt.Errorf("store %q: not a URL; write %s://USER:PASSWORD@HOST:PORT/DB", Redact(raw), strings.ToLower(scheme))
	}
	u := strings.ToLower(scheme) + ":" + rest
	s, err := redisstore.Open(ctx, u)
	var ue *url.Error
	switch {
	case errors.As(err, &ue):
		// The parser's message quotes the URL, or a piece of it (`invalid
		// port ":pa" after host` for the password "pa/ss"): leave it out.
		return nil, fmt.Errorf("store %q: not a valid URL; percent-encode a '/', '?', '#', '@' or '%%' in the user name or password", Redact(raw))
	case err != nil:
		return nil, fmt.Errorf("store %q: %s", Redact(raw), strings.ReplaceAll(err.Error(), u, Redact(raw)))
	}
	return s, nil
}
