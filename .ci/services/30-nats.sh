# Sourced by .ci/run (which defines wait_for and $tmp). Checks the service,
# starts it if down, and exports its IDEM_TEST_* variable; fails if unreachable.
nats_up() { exec 3<>/dev/tcp/127.0.0.1/4222 && head -c 4 <&3 | grep -q INFO; local rc=$?; exec 3<&- 3>&-; return $rc; }
if ! nats_up 2>/dev/null; then
  echo "starting NATS (JetStream)"
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log || true
fi
wait_for NATS 40 nats_up
export IDEM_TEST_NATS="nats://127.0.0.1:4222"
echo "NATS: up at $IDEM_TEST_NATS"
