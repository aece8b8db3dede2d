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
  sqs_js="$sqs_dir/node_modules/local-aws-sqs/dist/index.js"
  # A copy patched by an older version of this script is installed afresh.
  if [ -f "$sqs_js" ] && grep -q 'idem-patched-' "$sqs_js" && ! grep -q 'idem-patched-2 ' "$sqs_js"; then
    rm -rf "$sqs_dir/node_modules/local-aws-sqs"
  fi
  if [ ! -f "$sqs_dir/node_modules/local-aws-sqs/package.json" ]; then
    echo "installing local-aws-sqs into $sqs_dir"
    mkdir -p "$sqs_dir"
    (cd "$sqs_dir" && { [ -f package.json ] || echo '{"private":true}' > package.json; } &&
      npm install --no-audit --no-fund --loglevel=error local-aws-sqs@2.0.2) || return 1
  fi
  # local-aws-sqs 2.0.2 departs from SQS in three ways the tests depend on;
  # patch its bundle once (each pattern must match exactly once, or this fails):
  # 1. ChangeMessageVisibility bumped ApproximateReceiveCount (every
  #    heartbeat counted as a receive); SQS counts receives only.
  # 2. A long poll waited for a full batch; SQS returns as soon as it has
  #    at least one message.
  # 3. FIFO handed out a group's later messages while an earlier one was in
  #    flight (from an earlier receive); SQS holds the group back until that
  #    one is deleted or visible again.
  cat > "$sqs_dir/patch.js" <<'JS'
const fs = require("fs");
const f = require.resolve("local-aws-sqs");
let s = fs.readFileSync(f, "utf8");
const mark = "/* idem-patched-2 */";
if (s.includes(mark)) process.exit(0);
const swaps = [
  ["let n=Number(t.record.attributes.ApproximateReceiveCount)+1;t.record.attributes.ApproximateReceiveCount=String(n),n==1&&",
   "let n=Number(t.record.attributes.ApproximateReceiveCount)+(i?0:1);t.record.attributes.ApproximateReceiveCount=String(n),n==1&&!i&&"],
  ["if(r.length==e){clearInterval(c),clearTimeout(n),o();break}}},10),c.unref()",
   "if(r.length==e){clearInterval(c),clearTimeout(n),o();break}}r.length&&(clearInterval(c),clearTimeout(n),o())},10),c.unref()"],
  ["if(!y.delayed){if(y.visible){l(this,D,Wt).call(this,y,i);",
   "if(!y.delayed){if(y.visible&&!(this.FifoQueue&&y.record.attributes.MessageGroupId&&S(this,E).some(z=>z!==y&&!z.visible&&!r.some(w=>w.record.MessageId==z.record.MessageId)&&z.record.attributes.MessageGroupId==y.record.attributes.MessageGroupId))){l(this,D,Wt).call(this,y,i);"],
];
for (const [from, to] of swaps) {
  if (s.split(from).length !== 2) { console.error("local-aws-sqs: patch pattern not found exactly once: " + from); process.exit(1); }
  s = s.replace(from, () => to);
}
fs.writeFileSync(f, s + "\n" + mark + "\n");
JS
  (cd "$sqs_dir" && node patch.js) || return 1
  cat > "$sqs_dir/server.js" <<'JS'
const { createSqsServer } = require("local-aws-sqs");
createSqsServer({
  port: Number(process.env.IDEM_SQS_PORT || 9324),
  hostname: "127.0.0.1",
  emulateQueueCreationLifecycle: false,
});
JS
  echo "starting local-aws-sqs on 127.0.0.1:$sqs_port"
  # exec: no shell stays behind holding .ci/run's output open; setsid: the
  # server leaves .ci/run's process group.
  (cd "$sqs_dir" && IDEM_SQS_PORT="$sqs_port" exec setsid node server.js > server.log 2>&1 < /dev/null) &
fi
wait_for local-aws-sqs 40 sqs_up || { cat "$sqs_dir/server.log" 2>/dev/null; return 1; }
export IDEM_TEST_SQS="http://127.0.0.1:$sqs_port"
echo "local-aws-sqs: up at $IDEM_TEST_SQS"
