# Sourced by .ci/run (which defines wait_for and $tmp). Checks the service,
# starts it if down, and exports its IDEM_TEST_* variable; fails if unreachable.
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
fi
wait_for Redis 40 redis-cli -h 127.0.0.1 -p 6379 ping
export IDEM_TEST_REDIS="redis://127.0.0.1:6379/0"
echo "Redis: $(redis-cli -h 127.0.0.1 -p 6379 info server | grep -m1 redis_version | tr -d '\r')"
