# Sourced by .ci/run (which defines wait_for and $tmp). Installs Mailpit (an
# SMTP server with an HTTP API, Go) into a cache directory once with
# `go install` (about 2 minutes), starts it on 127.0.0.1 if nothing answers
# there, and exports IDEM_TEST_SMTP and IDEM_TEST_MAILPIT_API; fails if it
# stays unreachable. IDEM_MAILPIT_SMTP_PORT (default 1025) and
# IDEM_MAILPIT_HTTP_PORT (default 8025) move it.
# --enable-chaos lets effect's tests make SMTP answer 451 on demand
# (PUT /api/v1/chaos). --disable-version-check: Mailpit otherwise looks up
# api.github.com (and so does `mailpit version`, which this never runs).
mailpit_version=v1.33.1
mailpit_smtp_port=${IDEM_MAILPIT_SMTP_PORT:-1025}
mailpit_http_port=${IDEM_MAILPIT_HTTP_PORT:-8025}
mailpit_dir=${IDEM_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/idem-ci}/mailpit
mailpit_up() { curl -sf -m 2 -o /dev/null "http://127.0.0.1:$mailpit_http_port/readyz"; }
if ! mailpit_up; then
  if [ ! -x "$mailpit_dir/bin/mailpit" ] || [ "$(cat "$mailpit_dir/version" 2>/dev/null)" != "$mailpit_version" ]; then
    echo "installing mailpit $mailpit_version into $mailpit_dir (go install, about 2 minutes)"
    mkdir -p "$mailpit_dir/bin"
    # -buildvcs=false from .ci/run's GOFLAGS is harmless here.
    (cd "$mailpit_dir" && GOBIN="$mailpit_dir/bin" go install "github.com/axllent/mailpit@$mailpit_version" >"$mailpit_dir/install.log" 2>&1) \
      || { cat "$mailpit_dir/install.log"; echo "CI: go install mailpit failed"; return 1; }
    echo "$mailpit_version" >"$mailpit_dir/version"
  fi
  echo "starting mailpit on 127.0.0.1:$mailpit_smtp_port (SMTP) and 127.0.0.1:$mailpit_http_port (API)"
  # Always both addresses: the defaults bind every interface. exec: no
  # shell stays behind holding .ci/run's output open; setsid: Mailpit
  # leaves .ci/run's process group.
  (cd "$mailpit_dir" && exec setsid "$mailpit_dir/bin/mailpit" \
    -l "127.0.0.1:$mailpit_http_port" -s "127.0.0.1:$mailpit_smtp_port" \
    -d "$mailpit_dir/mail.db" --disable-version-check --enable-chaos \
    >"$mailpit_dir/mailpit.log" 2>&1 </dev/null) &
fi
wait_for mailpit 40 mailpit_up || { cat "$mailpit_dir/mailpit.log" 2>/dev/null; return 1; }
export IDEM_TEST_SMTP="127.0.0.1:$mailpit_smtp_port"
export IDEM_TEST_MAILPIT_API="http://127.0.0.1:$mailpit_http_port"
echo "mailpit: up, SMTP at $IDEM_TEST_SMTP, API at $IDEM_TEST_MAILPIT_API"
