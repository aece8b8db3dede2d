// Package rivertype is a stub of River's rivertype package.
package rivertype

type JobRow struct {
	ID      int64
	Attempt int
}
