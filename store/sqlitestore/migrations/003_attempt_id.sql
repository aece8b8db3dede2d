-- 003: the id of a record's latest attempt (store.Record.AttemptID): while
-- the record is in_progress, the attempt that holds the key; '' once an
-- abandon gave it up. Rows written before this migration have '': no
-- attempt of a new build can finish or extend them (their fence names no
-- attempt id), so they lapse and are taken over or resolved as usual. An
-- empty journal (the implicit one) means the entry the row's columns say,
-- this one's attempt id included.
ALTER TABLE idem_records ADD COLUMN attempt_id TEXT NOT NULL DEFAULT '';
