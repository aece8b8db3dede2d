// Package migrations reads a package's embedded schema migrations: files
// named NNN_description.sql, numbered from 1 without gaps.
package migrations

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one migration file.
type Migration struct {
	Version int    // NNN
	Name    string // the file's base name, NNN_description.sql
	SQL     string // its contents
}

// Load returns the migrations in dir of fsys in version order. component
// prefixes its errors ("sqlitestore", "sqlqueue"). A file whose name is not
// NNN_description.sql, or versions that do not run 1, 2, 3... without gaps
// or repeats, are an error.
func Load(fsys fs.FS, dir, component string) ([]Migration, error) {
	names, err := fs.Glob(fsys, path.Join(dir, "*.sql"))
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, n := range names {
		base := path.Base(n)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("%s: migration %s: name must be NNN_description.sql", component, base)
		}
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: base, SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := range ms {
		if ms[i].Version != i+1 {
			return nil, fmt.Errorf("%s: migration %s: versions must be 1, 2, 3... without gaps", component, ms[i].Name)
		}
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("%s: no migrations in %s", component, dir)
	}
	return ms, nil
}
