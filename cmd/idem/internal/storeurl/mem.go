package storeurl

import (
	"context"
	"sync"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/memstore"
)

func init() { Register("mem", openMem) }

var (
	memMu    sync.Mutex
	memNamed = map[string]idem.Store{}
)

// SetMem makes "mem:NAME" open s for the rest of the process (tests put a
// memstore with a fake clock there). Closing what Open returns for it does
// not close s.
func SetMem(name string, s idem.Store) {
	memMu.Lock()
	defer memMu.Unlock()
	memNamed[name] = s
}

// openMem opens "mem:" (a new, empty store every time: it forgets
// everything when the command exits) or "mem:NAME" (one store per name and
// process).
func openMem(_ context.Context, _, rest string, _ Options) (idem.Store, error) {
	if rest == "" || rest == "//" {
		return memstore.New(), nil
	}
	memMu.Lock()
	defer memMu.Unlock()
	s, ok := memNamed[rest]
	if !ok {
		s = memstore.New()
		memNamed[rest] = s
	}
	return shared{s}, nil
}

// shared is a store that outlives the command that opened it.
type shared struct{ idem.Store }

func (shared) Close() error { return nil }
