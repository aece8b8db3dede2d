package dynamostore

import (
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// expr builds expressions with placeholders for every attribute name (many
// of ours, such as status and key, are DynamoDB reserved words) and value.
// DynamoDB refuses placeholders that no expression uses, so names and
// values are registered as the expressions use them.
type expr struct {
	names  map[string]string
	byName map[string]string
	values map[string]types.AttributeValue
	set    []string
	remove []string
}

func newExpr() *expr {
	return &expr{names: map[string]string{}, byName: map[string]string{}, values: map[string]types.AttributeValue{}}
}

// n returns the placeholder of a document path: names separated by '.'.
func (e *expr) n(path ...string) string {
	parts := make([]string, len(path))
	for i, name := range path {
		p, ok := e.byName[name]
		if !ok {
			p = "#n" + strconv.Itoa(len(e.byName))
			e.byName[name] = p
			e.names[p] = name
		}
		parts[i] = p
	}
	return strings.Join(parts, ".")
}

// v returns the placeholder of a value.
func (e *expr) v(val types.AttributeValue) string {
	p := ":v" + strconv.Itoa(len(e.values))
	e.values[p] = val
	return p
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
	return e.values
}

// Names returns the name placeholders, nil if there are none.
func (e *expr) Names() map[string]string {
	if len(e.names) == 0 {
		return nil
	}
	return e.names
}
