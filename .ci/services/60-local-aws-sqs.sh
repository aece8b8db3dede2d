# Sourced by .ci/run (which defines wait_for and $tmp). Installs local-aws-sqs
# (an SQS emulator, npm) into a cache directory once, starts it on 127.0.0.1
# if nothing answers there, and exports IDEM_TEST_SQS; fails if unreachable.
# IDEM_SQS_PORT (default 9324) and IDEM_CACHE (default ~/.cache/idem) move it.
sqs_port="${IDEM_SQS_PORT:-9324}"
sqs_dir="${IDEM_CACHE:-${HOME:-/root}/.cache/idem}/local-aws-sqs"
# An SQS endpoint answers a JSON-protocol ListQueues with a queue list.
sqs_up() {
  curl -sf -m 2 -X POST "http://127.0.0.1:$sqs_port/" \
    -H 'Content-Type: application/x-amz-json-1.0' -H 'X-Amz-Target: AmazonSQS.ListQueues' \
    -d '{}' | grep -q '"QueueUrls"\|^{}'
}
if ! sqs_up 2>/dev/null; then
  if [ ! -f "$sqs_dir/node_modules/local-aws-sqs/package.json" ]; then
    echo "installing local-aws-sqs into $sqs_dir"
    mkdir -p "$sqs_dir"
    (cd "$sqs_dir" && { [ -f package.json ] || echo '{"private":true}' > package.json; } &&
      npm install --no-audit --no-fund --loglevel=error local-aws-sqs@2.0.2) || return 1
  fi
  cat > "$sqs_dir/server.js" <<'EOF'
const { createSqsServer } = require("local-aws-sqs");
createSqsServer({
  port: Number(process.env.IDEM_SQS_PORT || 9324),
  hostname: "127.0.0.1",
  emulateQueueCreationLifecycle: false,
});
EOF
  echo "starting local-aws-sqs on 127.0.0.1:$sqs_port"
  (cd "$sqs_dir" && IDEM_SQS_PORT="$sqs_port" nohup node server.js > "$sqs_dir/server.log" 2>&1 &)
fi
wait_for local-aws-sqs 40 sqs_up || { cat "$sqs_dir/server.log" 2>/dev/null; return 1; }
export IDEM_TEST_SQS="http://127.0.0.1:$sqs_port"
echo "local-aws-sqs: up at $IDEM_TEST_SQS"
