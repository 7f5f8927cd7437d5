# Shared by the scripts: the build cache outside the clone, and system packages on demand.
# Sourced, not run.

# A warm machine rebuilds fast when the target directory outlives the clone.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/hourglass-target}"

# need_packages PKG...: installs the Debian packages that are missing (apt-get, as root or
# through sudo).
need_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing system packages: ${missing[*]}" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}
