# Shared by tools/versitygw/build.sh and tools/helm/build.sh: builds one pinned command of a
# Go module from the module proxy (verified against the wrapper module's go.sum) into a cache
# outside the repository keyed by version, once at a time, and prints the binary's path last.
# Source it, then call:
#
#   go_tool_build NAME VERSION MODULE PACKAGE WRAPPER_DIR CACHE_ROOT LDFLAGS ESTIMATE
#
# PACKAGE is the command's path inside MODULE (cmd/helm), WRAPPER_DIR holds the go.mod that
# pins MODULE at VERSION, ESTIMATE is shown while building ("2 minutes").

go_tool_build() {
  local name="$1" version="$2" module="$3" package="$4" here="$5" cache_root="$6" ldflags="$7" estimate="$8"
  local bin_dir="$cache_root/$version/bin"
  local binary="$bin_dir/$name"
  log() { printf '[%s %s] %s\n' "$name" "$(date +%H:%M:%S)" "$*" >&2; }
  die() { log "error: $*"; exit 1; }

  if [[ -x "$binary" ]]; then
    log "$name $version already built"
    echo "$binary"
    return 0
  fi

  command -v go >/dev/null 2>&1 || die "Go is not installed (need Go >= 1.26 on PATH to build $name)"
  mkdir -p "$bin_dir"

  # One build at a time: parallel test binaries, tools/test.sh and `devctl dev up` may all ask.
  exec 9>"$cache_root/.build.lock"
  if ! flock -n 9; then
    log "another build holds $cache_root/.build.lock; waiting for it"
    flock 9
  fi
  if [[ -x "$binary" ]]; then # built by whoever held the lock
    log "$name $version already built"
    echo "$binary"
    return 0
  fi

  # versions.env is the pin everything reads; go.mod must agree with it.
  local required
  required="$(awk -v m="$module" '$1 == m { print $2 }' "$here/go.mod")"
  [[ "$required" == "$version" ]] \
    || die "$here/go.mod requires $module $required but versions.env pins $version; run: (cd $here && go get -tool $module/$package@$version && go mod tidy)"

  export CGO_ENABLED=0
  export GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"

  # Fail fast and clearly when the module proxy is unreachable (instead of a wall of go errors).
  local proxy
  proxy="$(go env GOPROXY | cut -d, -f1)"
  if [[ "$proxy" == http* ]] && ! curl -fsS -m 20 -o /dev/null "$proxy/$module/@v/$version.info"; then
    die "the Go module proxy $proxy is unreachable (tried $proxy/$module/@v/$version.info)"
  fi

  log "building $name $version (about $estimate cold on 2 cores)"
  local start=$SECONDS
  local tmp
  tmp="$(mktemp -d "$bin_dir/.tmp.XXXXXX")"
  (cd "$here" && go build -ldflags "$ldflags" -o "$tmp/$name" "$module/$package") \
    || { rm -rf "$tmp"; die "go build of $module/$package@$version failed"; }
  mv "$tmp/$name" "$binary"
  rm -rf "$tmp"
  log "built $name in $((SECONDS - start)) s"
  echo "$binary"
}
