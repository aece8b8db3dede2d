# Sourced by .ci/run (which defines wait_for and $tmp). Checks the service,
# starts it if down, and exports its IDEM_TEST_* variable; fails if unreachable.
amqp_up() { exec 3<>/dev/tcp/127.0.0.1/5672; local rc=$?; exec 3<&- 3>&-; return $rc; }
if ! amqp_up 2>/dev/null; then
  echo "starting RabbitMQ"
  rabbitmq-server -detached || true
fi
wait_for RabbitMQ 120 amqp_up
export IDEM_TEST_AMQP="amqp://guest:guest@127.0.0.1:5672/"
echo "RabbitMQ: up at $IDEM_TEST_AMQP"
