# Shared by tools/control-plane/build.sh and tools/node/build.sh: the -ldflags that stamp the
# Kubernetes version into its commands (what `kubectl version` and the kubelet report), as
# the release build does. Source it, then: ldflags="$(kube_ldflags v1.37.2)"
kube_ldflags() {
  local version="$1" minor
  minor="${version#v1.}"; minor="${minor%%.*}"
  local flags="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  echo "$flags"
}
