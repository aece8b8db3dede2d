// Package pgarray holds array parameters for pgx that cost one allocation
// an array, not one an element. The stores and queues send their batches
// as arrays (a statement a batch); pgx's own encoding of a []string or an
// []int64 boxes every element in an interface on its way out, which was
// about a tenth of a fused consumer's allocations.
package pgarray

import (
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
)

// Text returns ss as a PostgreSQL array literal, each element quoted:
// {"a","b \"c\""}. pgx sends a Go string as the text form of the
// parameter it fills, so the literal fills a text[] parameter. The
// statement must cast the parameter ($1::text[]): run without a prepared
// description (pgx.QueryExecModeExec), a parameter has no type but the
// statement's.
func Text(ss []string) string {
	n := 2
	for _, s := range ss {
		n += len(s) + 3 + strings.Count(s, `"`) + strings.Count(s, `\`)
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(s); j++ {
			if c := s[j]; c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// Int64s is a bigint[] parameter: pgx reads its elements through
// pointers, which box without an allocation. Run without a prepared
// description, a parameter goes in text form: then Int64s is its literal
// (TextValue), and the statement must cast it ($1::bigint[]).
type Int64s []int64

// TextValue implements [pgtype.TextValuer]: the array's literal.
func (a Int64s) TextValue() (pgtype.Text, error) {
	b := make([]byte, 0, 2+len(a)*8)
	b = append(b, '{')
	for i, n := range a {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, n, 10)
	}
	return pgtype.Text{String: string(append(b, '}')), Valid: true}, nil
}

// Dimensions implements [pgtype.ArrayGetter].
func (a Int64s) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

// Index implements [pgtype.ArrayGetter].
func (a Int64s) Index(i int) any { return (*int64Elem)(&a[i]) }

// IndexType implements [pgtype.ArrayGetter].
func (a Int64s) IndexType() any { return (*int64Elem)(nil) }

type int64Elem int64

// Int64Value implements [pgtype.Int64Valuer].
func (e *int64Elem) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*e), Valid: true}, nil
}
