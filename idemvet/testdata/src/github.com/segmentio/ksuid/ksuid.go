// Package ksuid is a stub of github.com/segmentio/ksuid.
package ksuid

type KSUID [20]byte

func (k KSUID) String() string { return "" }
func New() KSUID               { return KSUID{} }
