# Sourced by .ci/run (which defines wait_for and $tmp). Installs dynalite (a
# DynamoDB emulator, npm) into a cache directory that later runs reuse,
# starts it on 127.0.0.1 if nothing answers there, and exports
# IDEM_TEST_DYNAMODB; fails if it stays unreachable.
# dynalite lacks TTL, transactions and ReturnValuesOnConditionCheckFailure;
# store/dynamostore depends on none of them.
dynalite_port=${IDEM_DYNALITE_PORT:-4567}
dynalite_dir=${IDEM_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/idem-ci}/dynalite
# dynalite answers any HTTP request; an unsigned POST gets a JSON error.
dynalite_up() { curl -s -m 2 -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$dynalite_port/" | grep -qE '^[1-5][0-9][0-9]$'; }
if ! dynalite_up; then
  if [ ! -x "$dynalite_dir/node_modules/.bin/dynalite" ]; then
    echo "installing dynalite into $dynalite_dir"
    mkdir -p "$dynalite_dir"
    (cd "$dynalite_dir" && npm install --no-audit --no-fund --loglevel=error dynalite@4 >"$dynalite_dir/npm.log" 2>&1) \
      || { cat "$dynalite_dir/npm.log"; echo "CI: npm install dynalite failed"; return 1; }
  fi
  # dynalite's own command exits when a client drops a request halfway
  # (it rethrows the request's error); this launcher logs it and serves on.
  # Always 127.0.0.1: dynalite's default binds every interface.
  cat >"$dynalite_dir/serve.js" <<'JS'
const dynalite = require('dynalite');
const [port, host] = [Number(process.argv[2]), '127.0.0.1'];
process.on('uncaughtException', (err) => console.error('dynalite: ignored:', err && err.message));
dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 }).listen(port, host, () =>
  console.log(`dynalite listening at http://${host}:${port}`));
JS
  echo "starting dynalite on 127.0.0.1:$dynalite_port"
  (cd "$dynalite_dir" && nohup node serve.js "$dynalite_port" >"$dynalite_dir/dynalite.log" 2>&1 </dev/null &)
fi
wait_for dynalite 40 dynalite_up || { cat "$dynalite_dir/dynalite.log" 2>/dev/null; return 1; }
export IDEM_TEST_DYNAMODB="http://127.0.0.1:$dynalite_port"
echo "dynalite: up at $IDEM_TEST_DYNAMODB"
