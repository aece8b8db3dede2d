# Sourced by .ci/run. Not a service: the shell that `idem completion zsh`'s
# test runs its script in. Installs zsh from Debian if missing and exports
# IDEM_TEST_ZSH, so that the test runs rather than skips; fails if zsh
# cannot be had.
if ! command -v zsh >/dev/null 2>&1; then
  echo "installing zsh (apt-get)"
  (apt-get install -y -q zsh || { apt-get update -q && apt-get install -y -q zsh; }) >"$tmp/zsh-install.log" 2>&1 \
    || { cat "$tmp/zsh-install.log"; echo "CI: zsh could not be installed"; return 1; }
fi
export IDEM_TEST_ZSH="$(command -v zsh)"
echo "zsh: $IDEM_TEST_ZSH"
