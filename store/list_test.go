package store

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestPrefixEnd(t *testing.T) {
	for prefix, want := range map[string]string{
		"":                     "",
		"a":                    "b",
		"order-":               "order.",
		"é":                    "ê",
		"x\U0010FFFF":          "y",
		"\U0010FFFF\U0010FFFF": "",
		"\uD7FF":               "\uE000", // the surrogates are skipped
		"a\xff":                "b",      // not UTF-8: bytes
		"a\xfe":                "a\xff",
		"\xff":                 "",
	} {
		got := PrefixEnd(prefix)
		if got != want {
			t.Errorf("PrefixEnd(%q) = %q, want %q", prefix, got, want)
		}
		if utf8.ValidString(prefix) && !utf8.ValidString(got) {
			t.Errorf("PrefixEnd(%q) = %q, not UTF-8", prefix, got)
		}
		// Every key that begins with the prefix is below the bound.
		for _, tail := range []string{"", "\x00", "z", "\U0010FFFF", "\xff\xff"} {
			if k := prefix + tail; got != "" && k >= got {
				t.Errorf("PrefixEnd(%q) = %q, not above the key %q", prefix, got, k)
			}
		}
		if got != "" && strings.HasPrefix(got, prefix) {
			t.Errorf("PrefixEnd(%q) = %q begins with the prefix", prefix, got)
		}
	}
}

func TestListQueryMatches(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := func(key string, s Status, p Policy, lease, updated time.Duration) *Record {
		return &Record{Key: key, Status: s, Policy: p, LeaseUntil: now.Add(lease), ExpiresAt: now.Add(time.Hour), UpdatedAt: now.Add(updated)}
	}
	indet := rec("a-1", StatusInProgress, AtMostOnce, -time.Second, -time.Minute)
	lapsed := rec("a-2", StatusInProgress, AtLeastOnce, -time.Second, -time.Minute)
	running := rec("b-1", StatusInProgress, AtMostOnce, time.Second, -time.Second)
	done := rec("b-2", StatusCompleted, AtMostOnce, -time.Hour, -time.Hour)
	expired := rec("a-0", StatusCompleted, AtLeastOnce, -time.Hour, -time.Hour)
	expired.ExpiresAt = now
	all := []*Record{expired, indet, lapsed, running, done}
	for _, c := range []struct {
		q    ListQuery
		want string
	}{
		{ListQuery{}, "a-1 a-2 b-1 b-2"},
		{ListQuery{Stuck: true}, "a-1 a-2"},
		{ListQuery{Indeterminate: true}, "a-1"},
		{ListQuery{Status: StatusInProgress}, "a-1 a-2 b-1"},
		{ListQuery{Status: StatusCompleted, Indeterminate: true}, ""},
		{ListQuery{Prefix: "b-"}, "b-1 b-2"},
		{ListQuery{Prefix: "a", After: "a-1"}, "a-2"},
		{ListQuery{UpdatedAfter: now.Add(-time.Minute)}, "b-1"},
		{ListQuery{UpdatedBefore: now.Add(-time.Minute)}, "b-2"},
		{ListQuery{UpdatedAfter: now.Add(-2 * time.Minute), UpdatedBefore: now}, "a-1 a-2 b-1"},
	} {
		var got []string
		for _, r := range all {
			if c.q.Matches(r, now) {
				got = append(got, r.Key)
			}
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("%+v matches %q, want %q", c.q, got, c.want)
		}
	}
	if err := (ListQuery{Status: "lapsed"}).Check(); err == nil {
		t.Error(`ListQuery{Status: "lapsed"}.Check() = nil, want ErrInvalid`)
	}
}
