-- 003: a key's first attempt keeps its journal implicit. journal is NULL
-- when the journal is the one entry the row's own columns say (the first
-- attempt and, once it ended, its outcome; see implicitJournalSQL in
-- sql.go), with that attempt's correlation id in the new column
-- correlation. A claim of a new key then builds and writes no jsonb, and
-- its row is less than half the size. Rows written before keep their
-- journal as it is. Adding a column with a constant default and dropping
-- NOT NULL rewrite nothing and take the table's lock only for a moment.
ALTER TABLE {{table}} ADD COLUMN correlation text NOT NULL DEFAULT '';
ALTER TABLE {{table}} ALTER COLUMN journal DROP NOT NULL;
