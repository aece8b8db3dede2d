package pgarray

import "testing"

func TestText(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
	}{
		{nil, `{}`},
		{[]string{}, `{}`},
		{[]string{""}, `{""}`},
		{[]string{"a", "NULL"}, `{"a","NULL"}`},
		{[]string{`q"uote`, `back\slash`, "{b,r}", " sp ", "é\n"}, `{"q\"uote","back\\slash","{b,r}"," sp ","é` + "\n" + `"}`},
	} {
		if got := Text(c.in); got != c.want {
			t.Errorf("Text(%q) = %s, want %s", c.in, got, c.want)
		}
	}
}
