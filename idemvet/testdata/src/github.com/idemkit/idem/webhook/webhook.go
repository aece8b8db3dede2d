// Package webhook is a stub of github.com/idemkit/idem/webhook.
package webhook

import "github.com/idemkit/idem"

func Key(source, id string) idem.OperationKey { return idem.Key(source, id) }
