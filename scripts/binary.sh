# Sourced by the scripts that test a built `leasehold` (from the repository's root).
# leasehold_binary NAME [BIN]: sets $bin to BIN, else $LEASEHOLD_BIN, else
# target/debug/leasehold, and exits (saying so as NAME) when no binary is there.
leasehold_binary() {
  bin="${2:-${LEASEHOLD_BIN:-target/debug/leasehold}}"
  if [ ! -x "$bin" ]; then
    echo "$1: no leasehold binary at $bin (cargo build -p leasehold-cli --bin leasehold)" >&2
    exit 1
  fi
}
