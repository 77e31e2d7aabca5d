//! Helpers of the tests of the Kubernetes examples (tests/examples.rs, tests/fleet.rs): the tool
//! gate (helm, kubectl, kubernetes-validate, yamllint from `.ci/k8s-tools.sh`), running them,
//! reading YAML, and what every volprep container and its pod must look like (least privilege,
//! Pod Security Standard baseline, the CLI contract's flags).
//!
//! A test that needs a tool is `#[ignore = "needs ..."]`: a plain `cargo test` lists it as
//! ignored, and run with `--include-ignored` (`.ci/run`) without the tool it fails.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde::Deserialize;
use serde_norway::Value;

pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Kubernetes versions the manifests must validate against: the kubectl the tooling ships
/// (v1.33) and the newest schema kubernetes-validate bundles.
pub const K8S_VERSIONS: &[&str] = &["1.33.0", "1.37.0"];

/// What the volprep init container adds back after `drop: [ALL]`, and why: CHOWN (change the
/// group), FOWNER (chmod/chown entries of other users), FSETID (keep setgid on directories of
/// a group the caller is not in), DAC_OVERRIDE (enter other users' 0700 directories).
pub const VOLPREP_CAPS: &[&str] = &["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID"];

/// Pod Security Standards, baseline: the capabilities a container may add.
pub const BASELINE_CAPS: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The flags of `volprep apply` the manifests may use (the CLI contract).
pub const APPLY_FLAGS: &[&str] = &[
    "--fs-group",
    "--owner",
    "--read-only",
    "--modes",
    "--app-uid",
    "--rule",
    "--sticky",
    "--threads",
    "--load",
    "--max-ops",
    "--max-errors",
    "--report",
    "--log-format",
    "--termination-log",
    "--shard",
    "--unprivileged",
    "--allow-foreign",
    "--volume",
    "--verify",
    "--reverify-after",
];

/// The flags of APPLY_FLAGS that take no value; the others are written `--name=VALUE`, one arg.
pub const SWITCHES: &[&str] = &["--read-only", "--unprivileged", "--allow-foreign"];

/// Pod Security Standards, restricted: the only volume types a pod may use.
pub const RESTRICTED_VOLUME_TYPES: &[&str] =
    &["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"];

// ---------------------------------------------------------------------------------------------
// Tools and processes

/// Writes past libtest's output capture, so a skip shows in a plain `cargo test`.
pub fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// The tool an env var names. The tests that need one are `#[ignore = "needs ..."]` in a plain
/// `cargo test`; run (`--include-ignored`, as `.ci/run` does) without it, they fail, saying how
/// to get it. (Option-returning for the callers' `let Some(..) else` shape: never None.)
pub fn tool(var: &str, test: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(path) if !path.is_empty() => {
            let path = PathBuf::from(path);
            assert!(path.is_file(), "{var}={} is not a file", path.display());
            Some(path)
        }
        _ => panic!("{test}: {var} is not set: source .ci/k8s-tools.sh (helm, kubectl, kubernetes-validate, yamllint)"),
    }
}

pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

pub fn output(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {}: {e}", describe(cmd)))
}

/// Runs `cmd`, panics with its output unless it succeeds, returns stdout.
#[track_caller]
pub fn run_ok(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        describe(cmd),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// helm with its cache, config and data dirs inside `home` (nothing read from or written to
/// the user's).
pub fn helm(helm: &Path, home: &Path) -> Command {
    let mut cmd = Command::new(helm);
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    cmd
}

// ---------------------------------------------------------------------------------------------
// YAML

/// The documents of a multi-document YAML stream, empty ones left out.
pub fn docs(yaml: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("bad YAML: {e}\n{yaml}")))
        .filter(|v| !v.is_null())
        .collect()
}

pub fn read(rel: &str) -> String {
    fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

pub fn strs(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| s.iter().map(|x| scalar(x).unwrap_or_else(|| panic!("not a scalar: {x:?}"))).collect())
        .unwrap_or_default()
}

pub fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

pub fn has_key(v: &Value, key: &str) -> bool {
    v.as_mapping().is_some_and(|m| m.contains_key(key))
}

/// The pod spec of a workload (or of a Pod).
pub fn pod_spec(obj: &Value) -> &Value {
    match obj["kind"].as_str() {
        Some("Pod") => &obj["spec"],
        _ => &obj["spec"]["template"]["spec"],
    }
}

pub fn workloads(all: &[Value]) -> Vec<&Value> {
    all.iter()
        .filter(|o| matches!(o["kind"].as_str(), Some("StatefulSet" | "Deployment" | "DaemonSet" | "Job" | "Pod")))
        .collect()
}

/// Every container's volumeMounts name a volume of the pod (or a volumeClaimTemplate).
pub fn check_mount_refs(obj: &Value, at: &str) {
    let spec = pod_spec(obj);
    let mut volumes: BTreeSet<String> =
        spec["volumes"].as_sequence().into_iter().flatten().filter_map(|v| scalar(&v["name"])).collect();
    for t in obj["spec"]["volumeClaimTemplates"].as_sequence().into_iter().flatten() {
        volumes.extend(scalar(&t["metadata"]["name"]));
    }
    for c in all_containers(spec) {
        for m in c["volumeMounts"].as_sequence().into_iter().flatten() {
            let name = scalar(&m["name"]).unwrap_or_default();
            assert!(
                volumes.contains(&name),
                "{at}: container {:?} mounts volume {name:?}, not in {volumes:?}",
                c["name"]
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What every volprep init container and its pod must look like

/// The parts of a volprep container's args.
#[derive(Debug, Default, PartialEq)]
pub struct VolprepArgs {
    pub fs_group: Option<u64>,
    pub owner: Option<String>,
    pub shard: Option<String>,
    pub report: Option<String>,
    pub sticky: Vec<String>,
    pub paths: Vec<String>,
    /// `--unprivileged`: the container runs as the app's user with no capability.
    pub unprivileged: bool,
}

/// Checks one volprep container (least privilege, resources, mounts of every path it names,
/// flags of the CLI contract) and returns its parsed args. Root with four capabilities, or with
/// `--unprivileged` the app's user with none.
pub fn check_volprep_container(c: &Value, at: &str) -> VolprepArgs {
    let sc = &c["securityContext"];
    let unprivileged = strs(&c["args"]).iter().any(|a| a == "--unprivileged");
    if unprivileged {
        // Every field of the "restricted" standard that a container sets, explicitly.
        let uid = sc["runAsUser"].as_u64();
        assert!(uid.is_some_and(|u| u != 0), "{at}: unprivileged volprep runs as the app's uid, not 0: {uid:?}");
        assert_eq!(sc["runAsNonRoot"].as_bool(), Some(true), "{at}: runAsNonRoot: true");
        assert!(sc["capabilities"]["add"].is_null(), "{at}: unprivileged volprep adds no capability");
    } else {
        assert_eq!(sc["runAsUser"].as_u64(), Some(0), "{at}: volprep runs as root");
        assert_eq!(sc["runAsNonRoot"].as_bool(), Some(false), "{at}: runAsNonRoot: false (overrides a pod-level true)");
        let mut add = strs(&sc["capabilities"]["add"]);
        add.sort();
        assert_eq!(add, VOLPREP_CAPS, "{at}: capabilities.add");
    }
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false), "{at}: allowPrivilegeEscalation");
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true), "{at}: readOnlyRootFilesystem");
    assert_ne!(sc["privileged"].as_bool(), Some(true), "{at}: privileged");
    assert_eq!(strs(&sc["capabilities"]["drop"]), ["ALL"], "{at}: capabilities.drop");
    assert_eq!(sc["seccompProfile"]["type"].as_str(), Some("RuntimeDefault"), "{at}: seccompProfile");
    for kind in ["requests", "limits"] {
        for res in ["cpu", "memory"] {
            assert!(scalar(&c["resources"][kind][res]).is_some(), "{at}: resources.{kind}.{res}");
        }
    }
    assert!(c["command"].is_null(), "{at}: the image's ENTRYPOINT is /volprep; set args only");

    let args = strs(&c["args"]);
    assert_eq!(args.first().map(String::as_str), Some("apply"), "{at}: args start with the subcommand: {args:?}");
    let mut parsed = VolprepArgs { unprivileged, ..VolprepArgs::default() };
    for arg in &args[1..] {
        if let Some(flag) = arg.strip_prefix("--") {
            let (name, value) = flag.split_once('=').map_or((flag, None), |(n, v)| (n, Some(v)));
            assert!(APPLY_FLAGS.contains(&format!("--{name}").as_str()), "{at}: unknown flag {arg}");
            let switch = SWITCHES.contains(&format!("--{name}").as_str());
            assert_eq!(value.is_none(), switch, "{at}: {arg}: write --{name}=VALUE as one arg, a switch alone");
            match (name, value) {
                ("fs-group", Some(v)) => parsed.fs_group = Some(v.parse().expect("numeric --fs-group")),
                ("owner", Some(v)) => parsed.owner = Some(v.to_owned()),
                ("shard", Some(v)) => parsed.shard = Some(v.to_owned()),
                ("report", Some(v)) => parsed.report = Some(v.to_owned()),
                ("sticky", Some(v)) => parsed.sticky.push(v.to_owned()),
                // `--volume=PATH,fs-group=GID[,read-only]` (what `volprep inject` writes).
                ("volume", Some(v)) => {
                    let mut parts = v.split(',');
                    parsed.paths.push(parts.next().unwrap_or_default().to_owned());
                    for p in parts {
                        if let Some(gid) = p.strip_prefix("fs-group=") {
                            parsed.fs_group = Some(gid.parse().expect("numeric fs-group"));
                        }
                    }
                }
                _ => {}
            }
        } else {
            parsed.paths.push(arg.clone());
        }
    }
    assert!(!parsed.paths.is_empty(), "{at}: no volume path in {args:?}");
    if unprivileged {
        assert!(parsed.owner.is_none(), "{at}: --owner needs root");
        assert!(parsed.sticky.is_empty(), "{at}: --sticky of an emptyDir needs root");
        assert!(parsed.fs_group.is_some(), "{at}: unprivileged volprep needs --fs-group");
    }
    let mounts: Vec<String> = c["volumeMounts"]
        .as_sequence()
        .map(|m| m.iter().filter_map(|m| m["mountPath"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    for path in parsed.paths.iter().chain(&parsed.sticky) {
        let mounted = mounts.iter().any(|m| Path::new(path).starts_with(m));
        assert!(mounted, "{at}: {path} is not on a volume mounted into the volprep container (mounts: {mounts:?})");
    }
    parsed
}

/// Checks a pod that runs volprep: volprep first, the group via supplementalGroups (or
/// runAsGroup), no fsGroup, and the Pod Security Standard the docs claim: baseline, not
/// restricted. Returns volprep's args.
pub fn check_volprep_pod(spec: &Value, at: &str) -> VolprepArgs {
    let inits = spec["initContainers"].as_sequence().unwrap_or_else(|| panic!("{at}: no initContainers"));
    assert_eq!(inits[0]["name"].as_str(), Some("volprep"), "{at}: volprep must be the first init container");
    let args = check_volprep_container(&inits[0], at);
    let psc = &spec["securityContext"];
    assert!(
        psc["fsGroup"].is_null(),
        "{at}: with fsGroup the kubelet walks the volume itself before any init container"
    );
    assert!(psc["fsGroupChangePolicy"].is_null(), "{at}: fsGroupChangePolicy without fsGroup");
    if let Some(gid) = args.fs_group {
        let groups: Vec<u64> = psc["supplementalGroups"]
            .as_sequence()
            .map(|g| g.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        assert!(
            groups.contains(&gid) || psc["runAsGroup"].as_u64() == Some(gid),
            "{at}: the app must get group {gid} (supplementalGroups or runAsGroup): {psc:?}"
        );
    }
    if args.unprivileged {
        check_restricted_pod(spec, &inits[0], at);
        return args;
    }
    let baseline = baseline_violations(spec);
    assert!(baseline.is_empty(), "{at}: violates Pod Security Standard baseline: {baseline:?}");
    assert!(!restricted_violations(spec).is_empty(), "{at}: meets restricted? then the docs saying baseline are wrong");
    args
}

/// A pod with unprivileged volprep meets Pod Security Standard **restricted**, and volprep runs
/// as the user of the app's containers (the owner of the files it may fix), holding the group.
pub fn check_restricted_pod(spec: &Value, volprep: &Value, at: &str) {
    let restricted = restricted_violations(spec);
    assert!(restricted.is_empty(), "{at}: violates Pod Security Standard restricted: {restricted:?}");
    let psc = &spec["securityContext"];
    let uid = volprep["securityContext"]["runAsUser"].as_u64();
    for c in spec["containers"].as_sequence().into_iter().flatten() {
        let app_uid = c["securityContext"]["runAsUser"].as_u64().or(psc["runAsUser"].as_u64());
        assert_eq!(uid, app_uid, "{at}: volprep runs as the app's uid (container {:?})", c["name"]);
    }
}

/// Checks a pod whose own container is volprep (a Job's, examples/fleet): volprep the only
/// container, no init containers, never restarted in place (podFailurePolicy needs
/// `restartPolicy: Never`), no fsGroup, its summary as the termination message, and the Pod
/// Security Standard baseline, not restricted. Returns volprep's args.
pub fn check_volprep_job(spec: &Value, at: &str) -> VolprepArgs {
    assert!(spec["initContainers"].is_null(), "{at}: a volprep Job has no init containers");
    let cs = spec["containers"].as_sequence().unwrap_or_else(|| panic!("{at}: no containers"));
    assert_eq!(cs.len(), 1, "{at}: volprep is the only container");
    let c = &cs[0];
    assert_eq!(c["name"].as_str(), Some("volprep"), "{at}: the container is named volprep");
    let args = check_volprep_container(c, at);
    assert_eq!(spec["restartPolicy"].as_str(), Some("Never"), "{at}: restartPolicy: Never");
    assert_eq!(
        c["terminationMessagePolicy"].as_str(),
        Some("FallbackToLogsOnError"),
        "{at}: terminationMessagePolicy: FallbackToLogsOnError"
    );
    assert_eq!(spec["automountServiceAccountToken"].as_bool(), Some(false), "{at}: no service account token");
    let psc = &spec["securityContext"];
    assert!(psc["fsGroup"].is_null(), "{at}: with fsGroup the kubelet walks the volume itself before volprep starts");
    assert!(psc["fsGroupChangePolicy"].is_null(), "{at}: fsGroupChangePolicy without fsGroup");
    let baseline = baseline_violations(spec);
    assert!(baseline.is_empty(), "{at}: violates Pod Security Standard baseline: {baseline:?}");
    assert!(!restricted_violations(spec).is_empty(), "{at}: meets restricted? then the docs saying baseline are wrong");
    args
}

pub fn all_containers(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|k| spec[*k].as_sequence().into_iter().flatten())
        .collect()
}

/// Pod Security Standards, baseline level (the controls that a pod spec shows).
pub fn baseline_violations(spec: &Value) -> Vec<String> {
    let mut v = Vec::new();
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[key].as_bool() == Some(true) {
            v.push(format!("{key}: true"));
        }
    }
    for vol in spec["volumes"].as_sequence().into_iter().flatten() {
        if has_key(vol, "hostPath") {
            v.push(format!("hostPath volume {:?}", vol["name"]));
        }
    }
    let safe_sysctls = [
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    ];
    for s in spec["securityContext"]["sysctls"].as_sequence().into_iter().flatten() {
        if !safe_sysctls.contains(&s["name"].as_str().unwrap_or("")) {
            v.push(format!("unsafe sysctl {:?}", s["name"]));
        }
    }
    let mut contexts = vec![("pod".to_owned(), &spec["securityContext"])];
    for c in all_containers(spec) {
        let name = c["name"].as_str().unwrap_or("?").to_owned();
        let sc = &c["securityContext"];
        if sc["privileged"].as_bool() == Some(true) {
            v.push(format!("{name}: privileged"));
        }
        for cap in strs(&sc["capabilities"]["add"]) {
            if !BASELINE_CAPS.contains(&cap.as_str()) {
                v.push(format!("{name}: adds capability {cap}"));
            }
        }
        if sc["procMount"].as_str().is_some_and(|p| p != "Default") {
            v.push(format!("{name}: procMount"));
        }
        for port in c["ports"].as_sequence().into_iter().flatten() {
            if port["hostPort"].as_u64().is_some_and(|p| p != 0) {
                v.push(format!("{name}: hostPort"));
            }
        }
        contexts.push((name, sc));
    }
    for (name, sc) in contexts {
        if sc["windowsOptions"]["hostProcess"].as_bool() == Some(true) {
            v.push(format!("{name}: hostProcess"));
        }
        if sc["seccompProfile"]["type"].as_str() == Some("Unconfined") {
            v.push(format!("{name}: seccomp Unconfined"));
        }
        if sc["appArmorProfile"]["type"].as_str() == Some("Unconfined") {
            v.push(format!("{name}: AppArmor Unconfined"));
        }
        let se = &sc["seLinuxOptions"];
        let se_types = ["container_t", "container_init_t", "container_kvm_t", "container_engine_t"];
        if se["type"].as_str().is_some_and(|t| !t.is_empty() && !se_types.contains(&t))
            || !se["user"].is_null()
            || !se["role"].is_null()
        {
            v.push(format!("{name}: seLinuxOptions"));
        }
    }
    v
}

/// Pod Security Standards, restricted level: baseline and every control restricted adds
/// (volume types, privilege escalation, running as non-root, a non-root user, seccomp,
/// capabilities).
pub fn restricted_violations(spec: &Value) -> Vec<String> {
    let mut v = baseline_violations(spec);
    let psc = &spec["securityContext"];
    if psc["runAsUser"].as_u64() == Some(0) {
        v.push("pod: runAsUser 0".to_string());
    }
    for vol in spec["volumes"].as_sequence().into_iter().flatten() {
        let kinds: Vec<&str> = vol.as_mapping().into_iter().flatten().filter_map(|(k, _)| k.as_str()).collect();
        if let Some(kind) = kinds.iter().find(|k| **k != "name" && !RESTRICTED_VOLUME_TYPES.contains(k)) {
            v.push(format!("volume {:?}: type {kind}", vol["name"]));
        }
    }
    for c in all_containers(spec) {
        let name = c["name"].as_str().unwrap_or("?");
        let sc = &c["securityContext"];
        let non_root = sc["runAsNonRoot"].as_bool().or(psc["runAsNonRoot"].as_bool());
        if non_root != Some(true) {
            v.push(format!("{name}: runAsNonRoot is not true"));
        }
        if sc["runAsUser"].as_u64().or(psc["runAsUser"].as_u64()) == Some(0) {
            v.push(format!("{name}: runAsUser 0"));
        }
        if sc["allowPrivilegeEscalation"].as_bool() != Some(false) {
            v.push(format!("{name}: allowPrivilegeEscalation is not false"));
        }
        if !strs(&sc["capabilities"]["drop"]).iter().any(|c| c == "ALL") {
            v.push(format!("{name}: does not drop ALL capabilities"));
        }
        if strs(&sc["capabilities"]["add"]).iter().any(|c| c != "NET_BIND_SERVICE") {
            v.push(format!("{name}: adds capabilities beyond NET_BIND_SERVICE"));
        }
        let seccomp = sc["seccompProfile"]["type"].as_str().or(psc["seccompProfile"]["type"].as_str());
        if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
            v.push(format!("{name}: seccompProfile not set"));
        }
    }
    v
}

// ---------------------------------------------------------------------------------------------
// Tools on files

/// kubernetes-validate --strict on files, for every version in K8S_VERSIONS. Any warning (an
/// unknown kind has no schema and only warns) is a failure, and so is a file with no resource.
pub fn k8s_validate(kv: &Path, files: &[PathBuf]) {
    for version in K8S_VERSIONS {
        let mut cmd = Command::new(kv);
        cmd.args(["--strict", "-k", version]).args(files);
        let out = output(&mut cmd);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let bad: Vec<&str> = text.lines().filter(|l| !l.starts_with("INFO")).collect();
        assert!(out.status.success() && bad.is_empty(), "{} ({}):\n{text}", describe(&cmd), out.status);
        for f in files {
            let name = f.display().to_string();
            assert!(
                text.lines().any(|l| l.starts_with(&format!("INFO {name} passed"))),
                "{name}: no resource validated against {version}:\n{text}"
            );
        }
    }
}

pub fn yamllint(yl: &Path, files: &[PathBuf]) {
    let mut cmd = Command::new(yl);
    cmd.current_dir(ROOT).args(["--strict", "-f", "parsable", "-c", ".yamllint"]).args(files);
    run_ok(&mut cmd);
}

pub fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("mkdir");
    for entry in fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if src.is_dir() {
            if entry.file_name() != "charts" {
                copy_dir(&src, &dst);
            }
        } else if entry.file_name() != "Chart.lock" {
            fs::copy(&src, &dst).expect("copy");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Argo CD config management plugins

/// What Argo CD's cmp-server adds to the sidecar's environment when it runs a plugin's `init`
/// and `generate` for an Application: its build environment (ARGOCD_APP_*, KUBE_VERSION,
/// KUBE_API_VERSIONS), the Application's `spec.source.plugin.env` as ARGOCD_ENV_*, and its
/// parameters as JSON.
pub fn argocd_env(app: &str, namespace: &str, plugin_env: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("ARGOCD_APP_NAME", app),
        ("ARGOCD_APP_NAMESPACE", namespace),
        ("ARGOCD_APP_PROJECT_NAME", "default"),
        ("ARGOCD_APP_REVISION", "4a3c2d1e0f9b8a7c6d5e4f3a2b1c0d9e8f7a6b5c"),
        ("ARGOCD_APP_REVISION_SHORT", "4a3c2d1"),
        ("ARGOCD_APP_REVISION_SHORT_8", "4a3c2d1e"),
        ("ARGOCD_APP_SOURCE_PATH", "apps/chart"),
        ("ARGOCD_APP_SOURCE_REPO_URL", "https://git.example.com/platform.git"),
        ("ARGOCD_APP_SOURCE_TARGET_REVISION", "main"),
        ("ARGOCD_APP_PARAMETERS", "[]"),
        ("KUBE_VERSION", "1.33.0"),
        ("KUBE_API_VERSIONS", "v1,apps/v1,batch/v1,policy/v1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    env.extend(plugin_env.iter().map(|(k, v)| (format!("ARGOCD_ENV_{k}"), v.to_string())));
    env
}

/// A plugin step's argv (`spec.init` or `spec.generate`: `command` then `args`), as the
/// cmp-server executes it (no shell of its own).
pub fn cmp_step(plugin: &Value, step: &str) -> Vec<String> {
    let s = &plugin["spec"][step];
    let mut argv = strs(&s["command"]);
    argv.extend(strs(&s["args"]));
    assert!(!argv.is_empty(), "plugin has no {step} command");
    argv
}
