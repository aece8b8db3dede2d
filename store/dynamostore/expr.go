package dynamostore

import (
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// expr builds expressions with placeholders for every attribute name (many
// of ours, such as status and key, are DynamoDB reserved words) and value.
// DynamoDB refuses placeholders that no expression uses, so names and
// values are registered as the expressions use them. They are kept in
// slices, and the maps the request needs are made once at their final
// size: a finishing write names about 15 attributes, and maps grown one
// entry at a time cost that hot path more than the lookups.
type expr struct {
	names  []string // the attribute name of placeholder #n<i>
	values []types.AttributeValue
	set    []string
	remove []string
}

func newExpr() *expr { return &expr{} }

// n returns the placeholder of a document path: names separated by '.'.
func (e *expr) n(path ...string) string {
	if len(path) == 1 {
		return namePH(e.name(path[0]))
	}
	var b strings.Builder
	for i, name := range path {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(namePH(e.name(name)))
	}
	return b.String()
}

// name returns the index of name's placeholder, registering it.
func (e *expr) name(name string) int {
	if i := slices.Index(e.names, name); i >= 0 {
		return i
	}
	e.names = append(e.names, name)
	return len(e.names) - 1
}

// v returns the placeholder of a value.
func (e *expr) v(val types.AttributeValue) string {
	e.values = append(e.values, val)
	return valuePH(len(e.values) - 1)
}

// Placeholders of the first names and values, made once.
var (
	namePHs, valuePHs = placeholders("#n"), placeholders(":v")
)

func placeholders(prefix string) (ps [24]string) {
	for i := range ps {
		ps[i] = prefix + strconv.Itoa(i)
	}
	return ps
}

func namePH(i int) string {
	if i < len(namePHs) {
		return namePHs[i]
	}
	return "#n" + strconv.Itoa(i)
}

func valuePH(i int) string {
	if i < len(valuePHs) {
		return valuePHs[i]
	}
	return ":v" + strconv.Itoa(i)
}

// Set adds "path = value" to the update's SET clause.
func (e *expr) Set(val types.AttributeValue, path ...string) {
	e.set = append(e.set, e.n(path...)+" = "+e.v(val))
}

// Remove adds path to the update's REMOVE clause.
func (e *expr) Remove(path ...string) { e.remove = append(e.remove, e.n(path...)) }

// SetS sets a string, or removes the attribute if s is empty.
func (e *expr) SetS(s string, path ...string) {
	if s == "" {
		e.Remove(path...)
		return
	}
	e.Set(str(s), path...)
}

// Update returns the update expression.
func (e *expr) Update() string {
	var b strings.Builder
	if len(e.set) > 0 {
		b.WriteString("SET " + strings.Join(e.set, ", "))
	}
	if len(e.remove) > 0 {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("REMOVE " + strings.Join(e.remove, ", "))
	}
	return b.String()
}

// Values returns the value placeholders, nil if there are none (DynamoDB
// refuses an empty map).
func (e *expr) Values() map[string]types.AttributeValue {
	if len(e.values) == 0 {
		return nil
	}
	m := make(map[string]types.AttributeValue, len(e.values))
	for i, v := range e.values {
		m[valuePH(i)] = v
	}
	return m
}

// Names returns the name placeholders, nil if there are none.
func (e *expr) Names() map[string]string {
	if len(e.names) == 0 {
		return nil
	}
	m := make(map[string]string, len(e.names))
	for i, n := range e.names {
		m[namePH(i)] = n
	}
	return m
}
