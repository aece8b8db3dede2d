# Sourced by .ci/run. Names the directory of PostgreSQL's initdb and pg_ctl,
# with which a test starts (and restarts) a private server of its own
# (idem chaos's store-restart fault); fails if they are not installed.
IDEM_TEST_POSTGRES_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
if [ -z "$IDEM_TEST_POSTGRES_BIN" ] || [ ! -x "$IDEM_TEST_POSTGRES_BIN/initdb" ]; then
  echo "CI: PostgreSQL's initdb is not installed (/usr/lib/postgresql/*/bin)"; return 1
fi
export IDEM_TEST_POSTGRES_BIN
echo "PostgreSQL binaries: $IDEM_TEST_POSTGRES_BIN"
