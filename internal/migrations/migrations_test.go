package migrations

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestLoad(t *testing.T) {
	fsys := fstest.MapFS{
		"m/002_more.sql":  {Data: []byte("two")},
		"m/001_first.sql": {Data: []byte("one")},
		"m/README":        {Data: []byte("not a migration")},
	}
	ms, err := Load(fsys, "m", "x")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Version != 1 || ms[0].Name != "001_first.sql" || ms[0].SQL != "one" || ms[1].Version != 2 {
		t.Fatalf("Load = %+v", ms)
	}
	for name, bad := range map[string]fstest.MapFS{
		"gap":     {"m/001_a.sql": {}, "m/003_c.sql": {}},
		"repeat":  {"m/001_a.sql": {}, "m/001_b.sql": {}},
		"no num":  {"m/first.sql": {}},
		"zero":    {"m/000_a.sql": {}},
		"nothing": {},
	} {
		if _, err := Load(bad, "m", "x"); err == nil || !strings.HasPrefix(err.Error(), "x: ") {
			t.Errorf("%s: Load = %v, want an error naming the component", name, err)
		}
	}
}
