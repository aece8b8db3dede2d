-- 002: vacuum does not give the table's emptied end back to the file
-- system. The space is reused by the next claims anyway; vacuum then takes
-- no ACCESS EXCLUSIVE lock to truncate the table (a stall for every call
-- on it, and on replicas); and a table that was once large never looks
-- tiny to the planner again, whose cached plans would then scan it as it
-- grows back (see plans.go).
ALTER TABLE {{table}} SET (vacuum_truncate = false);
