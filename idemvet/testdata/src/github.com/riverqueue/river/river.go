// Package river is a stub of github.com/riverqueue/river.
package river

import "github.com/riverqueue/river/rivertype"

type Job[T any] struct {
	*rivertype.JobRow
	Args T
}
