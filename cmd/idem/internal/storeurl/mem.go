package storeurl

import (
	"context"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// SetMem makes "mem:NAME" open s for as long as o lives (tests put a
// memstore with a fake clock there). Closing what Open returns for it does
// not close s.
func (o *Openers) SetMem(name string, s store.Store) {
	o.memMu.Lock()
	defer o.memMu.Unlock()
	o.memNamed[name] = s
}

// openMem opens "mem:" (a new, empty store every time: it forgets
// everything when the command exits) or "mem:NAME" (one store per name and
// Openers, which the command makes once per process).
func (o *Openers) openMem(_ context.Context, _, rest string, _ Options) (store.Store, error) {
	if rest == "" || rest == "//" {
		return memstore.New(), nil
	}
	o.memMu.Lock()
	defer o.memMu.Unlock()
	s, ok := o.memNamed[rest]
	if !ok {
		s = memstore.New()
		o.memNamed[rest] = s
	}
	return shared{s}, nil
}

// shared is a store that outlives the command that opened it.
type shared struct{ store.Store }

func (shared) Close() error { return nil }
