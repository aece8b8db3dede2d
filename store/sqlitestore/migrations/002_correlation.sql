-- 002: the correlation id of a record's latest attempt, in a column of its
-- own. It lets the journal column be empty when the journal is the one
-- entry the row's columns say (the first attempt and its outcome): no
-- JSON to write or read, and a row less than half the size. An empty journal
-- means that entry; '[]' an empty journal; anything else its JSON.
ALTER TABLE idem_records ADD COLUMN correlation TEXT NOT NULL DEFAULT '';
