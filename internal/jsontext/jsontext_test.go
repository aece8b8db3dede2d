package jsontext

import "testing"

func TestLoneSurrogate(t *testing.T) {
	for in, want := range map[string]bool{
		`"a"`:                    false,
		`"\ud83d\ude00"`:         false, // a pair
		`"\u00e9\\ud800"`:        false, // an escaped backslash, then text
		`"\udc80"`:               true,  // a low one alone
		`"\ud800"`:               true,  // a high one at the end
		`"\ud800x"`:              true,  // a high one not followed by an escape
		`"\ud800\u0041"`:         true,  // followed by a non-low escape
		`{"k":"\ud83d\ude00\n"}`: false,
	} {
		if got := LoneSurrogate([]byte(in)); got != want {
			t.Errorf("LoneSurrogate(%s) = %v, want %v", in, got, want)
		}
	}
}
