# Sourced by .ci/run. Not a service: the headless browser that the console's
# browser test (cmd/idem, TestConsoleBrowser) drives with chromedp. Installs
# Debian's chromium if missing and exports IDEM_TEST_CHROMIUM, so that the
# test runs rather than skips; fails if chromium cannot be had.
if ! command -v chromium >/dev/null 2>&1; then
  echo "installing chromium (apt-get, about a minute)"
  (apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }) >"$tmp/chromium-install.log" 2>&1 \
    || { cat "$tmp/chromium-install.log"; echo "CI: chromium could not be installed"; return 1; }
fi
export IDEM_TEST_CHROMIUM="$(command -v chromium)"
echo "chromium: $IDEM_TEST_CHROMIUM ($("$IDEM_TEST_CHROMIUM" --version 2>/dev/null || echo 'version unknown'))"
