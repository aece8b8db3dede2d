// Package idem is a stub of github.com/idemkit/idem for the analyzers'
// tests: the names and signatures the checks match, no behaviour.
package idem

import "context"

type OperationKey struct{ s string }

func (k OperationKey) String() string { return k.s }

func Key(parts ...any) OperationKey { return OperationKey{} }
func RawKey(s string) OperationKey  { return OperationKey{s} }

type Result struct{}
type Ledger struct{}

func (l *Ledger) Do(ctx context.Context, key OperationKey, fn func(context.Context) ([]byte, error)) (Result, error) {
	return Result{}, nil
}
