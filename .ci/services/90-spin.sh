# Sourced by .ci/run. Not a service: the model checker that
# internal/model's test runs the protocol model with (spin, with the C
# compiler it builds its verifier with). Installs spin from Debian if
# missing and exports IDEM_TEST_SPIN, so that the test runs rather than
# skips; fails if spin cannot be had.
if ! command -v spin >/dev/null 2>&1; then
  echo "installing spin (apt-get)"
  (apt-get install -y -q spin || { apt-get update -q && apt-get install -y -q spin; }) >"$tmp/spin-install.log" 2>&1 \
    || { cat "$tmp/spin-install.log"; echo "CI: spin could not be installed"; return 1; }
fi
command -v gcc >/dev/null 2>&1 || command -v cc >/dev/null 2>&1 \
  || { echo "CI: spin needs a C compiler (gcc or cc) for its verifier"; return 1; }
export IDEM_TEST_SPIN="$(command -v spin)"
echo "spin: $IDEM_TEST_SPIN ($(spin -V 2>&1 | head -1))"
