# Sourced by .ci/run (which defines wait_for and $tmp). Checks the service,
# starts it if down, and exports its IDEM_TEST_* variable; fails if unreachable.
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
fi
wait_for PostgreSQL 60 pg_isready -q -h 127.0.0.1 -p 5432
psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" | grep -q 1 \
  || psql -h 127.0.0.1 -U postgres -d postgres -c 'CREATE DATABASE test'
export IDEM_TEST_POSTGRES="postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
echo "PostgreSQL: $(psql "$IDEM_TEST_POSTGRES" -tAc 'SHOW server_version')"
