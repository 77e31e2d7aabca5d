//! examples/fleet: the Indexed Job that shards one huge RWX volume (`indexed-job.yaml`), the
//! status pod, and the migrate chart that renders one Job per PVC through the library chart's
//! `volprep.jobs`. They validate against the Kubernetes schemas and yamllint, `helm lint`
//! passes, the renderings hold exactly the Jobs and args the values ask for, the
//! podFailurePolicy matches the binary's exit codes, and the Jobs' command lines, run as their
//! pods would (as root, on a loop-mounted ext4), prepare the volumes and leave reports that
//! `volprep report merge` sums the way examples/fleet/README.md shows.
//!
//! Tools come from `.ci/k8s-tools.sh` (see tests/common/k8s.rs): a test that needs one is
//! `#[ignore = "needs ..."]` in a plain `cargo test` and fails when run without it; the tests
//! that run the binary as root are gated like the other privileged tests.

mod common;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::{self, File};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use common::k8s::*;
use common::snap::kubelet_reference;
use common::tree::{self, GenOpts};
use common::{LoopFs, Mounts, Tree, assert_same, snapshot};
use serde_norway::Value;

const INDEXED_JOB: &str = "examples/fleet/indexed-job.yaml";
const STATUS_POD: &str = "examples/fleet/status-pod.yaml";
const FLEET_README: &str = "examples/fleet/README.md";

/// How the fleet README pulls a pod's JSON report out of `kubectl logs` (stderr's JSON log
/// lines are one line each; the report is the multi-line document from `{` to `}`).
const EXTRACT_REPORT: &str = "/^{$/,/^}$/p";

/// The Jobs the migrate chart's values.yaml asks for: Job name, PVC, volprep's args.
const MIGRATE_JOBS: &[(&str, &str, &[&str])] = &[
    (
        "volprep-data-gitea-0",
        "data-gitea-0",
        &[
            "apply",
            "--fs-group=2000",
            "--log-format=json",
            "--report=-",
            "--termination-log=/dev/termination-log",
            "/volumes/data-gitea-0",
        ],
    ),
    (
        "volprep-uploads",
        "uploads",
        &[
            "apply",
            "--fs-group=2000",
            "--owner=1001:2000",
            "--log-format=json",
            "--report=-",
            "--termination-log=/dev/termination-log",
            "/volumes/uploads",
        ],
    ),
    (
        "volprep-legacy-reports",
        "legacy-reports",
        &[
            "apply",
            "--owner=1001:1001",
            "--log-format=json",
            "--report=-",
            "--termination-log=/dev/termination-log",
            "--threads=64",
            "/volumes/legacy-reports",
        ],
    ),
];

// ---------------------------------------------------------------------------------------------
// Jobs

/// The only document of a file, which must be a `kind`.
fn only_doc(rel: &str, kind: &str) -> Value {
    let mut all = docs(&read(rel));
    assert_eq!(all.len(), 1, "{rel}: one document");
    let doc = all.remove(0);
    assert_eq!(doc["kind"].as_str(), Some(kind), "{rel}");
    doc
}

/// What every volprep Job must say besides its pod: it retries a failed pod a bounded number
/// of times, fails at once on a usage error (exit 2, the only code that fails the Job), and
/// does not count a disruption as a failure. Its pods carry the fleet's label.
fn check_job_policy(job: &Value, at: &str) {
    assert_eq!(job["apiVersion"].as_str(), Some("batch/v1"), "{at}");
    assert_eq!(job["metadata"]["labels"]["app.kubernetes.io/name"].as_str(), Some("volprep"), "{at}: job label");
    let pod_labels = &job["spec"]["template"]["metadata"]["labels"];
    assert_eq!(pod_labels["app.kubernetes.io/name"].as_str(), Some("volprep"), "{at}: pod label");
    let backoff = job["spec"]["backoffLimit"].as_u64().unwrap_or_else(|| panic!("{at}: backoffLimit"));
    assert!(backoff >= 1, "{at}: a killed pod is run again (and resumes): backoffLimit {backoff}");
    let rules = job["spec"]["podFailurePolicy"]["rules"]
        .as_sequence()
        .unwrap_or_else(|| panic!("{at}: podFailurePolicy.rules"));
    let fail: Vec<&Value> = rules.iter().filter(|r| r["action"].as_str() == Some("FailJob")).collect();
    assert_eq!(fail.len(), 1, "{at}: one FailJob rule: {rules:?}");
    let codes = &fail[0]["onExitCodes"];
    assert_eq!(codes["containerName"].as_str(), Some("volprep"), "{at}: FailJob on volprep's exit code");
    assert_eq!(codes["operator"].as_str(), Some("In"), "{at}");
    let values: Vec<u64> = codes["values"].as_sequence().into_iter().flatten().filter_map(Value::as_u64).collect();
    assert_eq!(values, [2], "{at}: only a usage error (exit 2) fails the Job without a retry");
    let ignore = rules
        .iter()
        .find(|r| r["action"].as_str() == Some("Ignore"))
        .unwrap_or_else(|| panic!("{at}: an Ignore rule for disruptions"));
    let conds = ignore["onPodConditions"].as_sequence().expect("onPodConditions");
    assert!(
        conds.iter().any(|c| c["type"].as_str() == Some("DisruptionTarget") && c["status"].as_str() == Some("True")),
        "{at}: Ignore on DisruptionTarget=True: {conds:?}"
    );
    assert_eq!(pod_spec(job)["restartPolicy"].as_str(), Some("Never"), "{at}: podFailurePolicy needs Never");
}

/// The PVC a Job's `data` volume claims, and where volprep mounts it.
fn claim_and_mount(job: &Value, at: &str) -> (String, String) {
    let spec = pod_spec(job);
    let vol = spec["volumes"]
        .as_sequence()
        .and_then(|v| v.iter().find(|v| v["name"].as_str() == Some("data")))
        .unwrap_or_else(|| panic!("{at}: no volume named data"));
    let claim = vol["persistentVolumeClaim"]["claimName"].as_str().unwrap_or_else(|| panic!("{at}: not a PVC"));
    let mount = spec["containers"][0]["volumeMounts"]
        .as_sequence()
        .and_then(|m| m.iter().find(|m| m["name"].as_str() == Some("data")))
        .and_then(|m| m["mountPath"].as_str())
        .unwrap_or_else(|| panic!("{at}: volprep does not mount data"));
    (claim.to_owned(), mount.to_owned())
}

/// Every flag of `args` is in the CLI contract and in `volprep apply --help`.
fn check_flags_exist(args: &[String], at: &str) {
    let help = run_ok(Command::new(env!("CARGO_BIN_EXE_volprep")).args(["apply", "--help"]));
    for arg in args {
        if let Some(flag) = arg.strip_prefix("--") {
            let flag = format!("--{}", flag.split('=').next().unwrap_or(flag));
            assert!(APPLY_FLAGS.contains(&flag.as_str()), "{at}: {flag} is not in the CLI contract");
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "{at}: `volprep apply --help` has no {flag}:\n{help}"
            );
        }
    }
}

/// A container's args made runnable here: each volume path mapped to a local directory, the
/// termination message to a local file (never the host's /dev/termination-log).
fn localize(args: &[String], paths: &[(&str, &Path)], tlog: &Path) -> Vec<OsString> {
    args.iter()
        .map(|a| {
            if a.starts_with("--termination-log=") {
                let mut s = OsString::from("--termination-log=");
                s.push(tlog);
                s
            } else if a.starts_with("--") || a == "apply" {
                OsString::from(a)
            } else {
                let (_, local) = paths.iter().find(|(p, _)| p == a).unwrap_or_else(|| panic!("no local dir for {a}"));
                local.as_os_str().to_owned()
            }
        })
        .collect()
}

fn volprep_args(job: &Value) -> Vec<String> {
    strs(&pod_spec(job)["containers"][0]["args"])
}

// ---------------------------------------------------------------------------------------------
// The Indexed Job

/// The Indexed Job: N pods, all at once, each `--shard=auto/N` with N = completions =
/// parallelism, on the PVC shared-data mounted at /data; the report on stdout for
/// `kubectl logs`; least privilege, FailJob on a usage error.
#[test]
fn indexed_job_shards_one_volume() {
    let at = INDEXED_JOB;
    let job = only_doc(at, "Job");
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"].as_str(), Some("Indexed"), "{at}: JOB_COMPLETION_INDEX comes with Indexed");
    let n = spec["completions"].as_u64().expect("completions");
    assert!(n >= 2, "{at}: completions {n}");
    assert_eq!(spec["parallelism"].as_u64(), Some(n), "{at}: parallelism == completions: every shard at once");
    check_job_policy(&job, at);
    check_mount_refs(&job, at);
    let args = check_volprep_job(pod_spec(&job), at);
    assert_eq!(args.shard, Some(format!("auto/{n}")), "{at}: --shard=auto/N with N == completions");
    assert_eq!(args.fs_group, Some(2000), "{at}");
    assert_eq!(args.report.as_deref(), Some("-"), "{at}: the report on stdout, for kubectl logs");
    assert_eq!(args.paths, ["/data"], "{at}");
    let raw = volprep_args(&job);
    for a in ["--log-format=json", "--termination-log=/dev/termination-log"] {
        assert!(raw.contains(&a.to_owned()), "{at}: {a} in {raw:?}");
    }
    assert_eq!(claim_and_mount(&job, at), ("shared-data".to_owned(), "/data".to_owned()), "{at}");
    // Shards spread over nodes: the constraint selects this Job's own pods.
    let tsc = &pod_spec(&job)["topologySpreadConstraints"][0];
    assert_eq!(tsc["topologyKey"].as_str(), Some("kubernetes.io/hostname"), "{at}");
    assert_eq!(
        tsc["labelSelector"]["matchLabels"]["batch.kubernetes.io/job-name"].as_str(),
        job["metadata"]["name"].as_str(),
        "{at}: topologySpreadConstraints select this Job's pods"
    );
    check_flags_exist(&raw, at);
}

/// The exit codes the podFailurePolicy counts on, from the binary: with the Indexed Job's own
/// args, a missing or bad JOB_COMPLETION_INDEX is a usage error (2: FailJob at once), and a
/// volume that cannot be prepared is a failure (1: retried up to backoffLimit).
#[test]
fn indexed_job_exit_codes_match_its_pod_failure_policy() {
    let job = only_doc(INDEXED_JOB, "Job");
    let n = job["spec"]["completions"].as_u64().expect("completions");
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("not-mounted");
    let tlog = dir.path().join("termination-log");
    let mut args = localize(&volprep_args(&job), &[("/data", &missing)], &tlog);
    // Not root: the example's group is not one of this process's (exit 2 before anything else);
    // use its own, so the exit codes of the index and the missing volume are what is tested.
    if rustix::process::geteuid().as_raw() != 0 {
        let own = format!("--fs-group={}", rustix::process::getegid().as_raw());
        args.iter_mut()
            .filter(|a| a.to_string_lossy().starts_with("--fs-group="))
            .for_each(|a| *a = own.clone().into());
    }
    let code = |index: Option<&str>| {
        let mut cmd = common::volprep();
        cmd.args(&args).env_remove("JOB_COMPLETION_INDEX");
        if let Some(i) = index {
            cmd.env("JOB_COMPLETION_INDEX", i);
        }
        let run = common::run(&mut cmd);
        (run.code, run.describe())
    };
    let n_str = n.to_string();
    for (index, want) in [(None, 2), (Some(n_str.as_str()), 2), (Some("x"), 2), (Some("-1"), 2), (Some("0"), 1)] {
        let (got, out) = code(index);
        assert_eq!(got, want, "JOB_COMPLETION_INDEX={index:?}\n{out}");
    }
    // The failure's summary is the termination message (a usage error leaves none: the pod's
    // terminationMessagePolicy FallbackToLogsOnError shows its log instead).
    let msg = fs::read_to_string(&tlog).expect("termination message of the failed run");
    assert!(msg.contains("not-mounted") && msg.contains("ENOENT"), "{msg}");
}

/// The status pod reads the marker without root or capabilities: restricted, read-only.
#[test]
fn status_pod_is_restricted_and_read_only() {
    let at = STATUS_POD;
    let pod = only_doc(at, "Pod");
    check_mount_refs(&pod, at);
    let spec = pod_spec(&pod);
    let v = restricted_violations(spec);
    assert!(v.is_empty(), "{at}: meets the restricted Pod Security Standard: {v:?}");
    let c = &spec["containers"][0];
    assert_eq!(strs(&c["args"]), ["status", "--json", "/data"], "{at}");
    assert_eq!(c["volumeMounts"][0]["readOnly"].as_bool(), Some(true), "{at}");
    assert_eq!(spec["volumes"][0]["persistentVolumeClaim"]["claimName"].as_str(), Some("shared-data"), "{at}");
    let indexed = only_doc(INDEXED_JOB, "Job");
    let gid = check_volprep_job(pod_spec(&indexed), INDEXED_JOB).fs_group.expect("fs group");
    let groups: Vec<u64> = spec["securityContext"]["supplementalGroups"]
        .as_sequence()
        .map(|g| g.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    assert!(groups.contains(&gid), "{at}: group {gid} reads the prepared root: {groups:?}");
}

/// The fleet's plain files validate against the schemas and yamllint.
#[test]
#[ignore = "needs kubernetes-validate, yamllint: source .ci/k8s-tools.sh"]
fn fleet_manifests_validate() {
    let test = "fleet_manifests_validate";
    let root = Path::new(ROOT);
    if let Some(kv) = tool("VOLPREP_K8S_VALIDATE", test) {
        k8s_validate(&kv, &[root.join(INDEXED_JOB), root.join(STATUS_POD)]);
    }
    if let Some(yl) = tool("VOLPREP_YAMLLINT", test) {
        let files = [
            INDEXED_JOB,
            STATUS_POD,
            "examples/fleet/migrate-chart/Chart.yaml",
            "examples/fleet/migrate-chart/values.yaml",
        ];
        yamllint(&yl, &files.map(PathBuf::from));
    }
}

/// yamllint skips the migrate chart's Go templates (their rendering is linted), and git ignores
/// what `helm dependency build` leaves in it.
#[test]
fn yaml_config_and_gitignore_cover_the_migrate_chart() {
    assert!(read(".yamllint").contains("examples/fleet/*/templates/"), ".yamllint ignores the chart's templates");
    let gi = read("examples/.gitignore");
    assert!(gi.contains("fleet/*/charts/") && gi.contains("fleet/*/Chart.lock"), "examples/.gitignore");
}

// ---------------------------------------------------------------------------------------------
// The migrate chart

/// examples/helm/volprep and examples/fleet/migrate-chart copied to a temp dir in the same
/// layout (the chart's dependency is file://../../helm/volprep), the library packaged into
/// migrate-chart/charts by `helm dependency build`.
struct MigrateChart {
    helm: PathBuf,
    dir: tempfile::TempDir,
}

impl MigrateChart {
    fn new(helm: PathBuf) -> MigrateChart {
        let dir = tempfile::tempdir().expect("tempdir");
        for chart in ["helm/volprep", "fleet/migrate-chart"] {
            copy_dir(&Path::new(ROOT).join("examples").join(chart), &dir.path().join(chart));
        }
        let charts = MigrateChart { helm, dir };
        run_ok(charts.helm().arg("dependency").arg("build").arg(charts.chart()));
        assert!(charts.chart().join("charts/volprep-0.1.0.tgz").is_file(), "helm dependency build made no package");
        charts
    }

    fn helm(&self) -> Command {
        helm(&self.helm, &self.dir.path().join("home"))
    }

    fn chart(&self) -> PathBuf {
        self.dir.path().join("fleet/migrate-chart")
    }

    /// `helm template fleet` of the chart, with `values` (YAML) on top of its values.yaml.
    fn template(&self, name: &str, values: Option<&str>) -> Output {
        let mut cmd = self.helm();
        cmd.args(["template", "fleet"]).arg(self.chart());
        if let Some(values) = values {
            let file = self.dir.path().join(format!("{name}.values.yaml"));
            fs::write(&file, values).expect("write values");
            cmd.arg("-f").arg(file);
        }
        output(&mut cmd)
    }

    /// The Jobs of a successful `helm template`, and the rendering's file.
    fn jobs(&self, name: &str, values: Option<&str>) -> (Vec<Value>, PathBuf) {
        let out = self.template(name, values);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{name}: helm template failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let all = docs(&text);
        for obj in &all {
            assert_eq!(obj["kind"].as_str(), Some("Job"), "{name}: only Jobs:\n{text}");
        }
        let file = self.dir.path().join(format!("{name}.rendered.yaml"));
        fs::write(&file, &text).expect("write rendering");
        (all, file)
    }
}

/// `helm lint --strict` passes for the migrate chart and the library.
#[test]
#[ignore = "needs helm: source .ci/k8s-tools.sh"]
fn migrate_chart_lints() {
    let Some(helm) = tool("VOLPREP_HELM", "migrate_chart_lints") else {
        return;
    };
    let charts = MigrateChart::new(helm);
    for chart in [charts.chart(), charts.dir.path().join("helm/volprep")] {
        let out = run_ok(charts.helm().args(["lint", "--strict"]).arg(&chart));
        assert!(out.contains("0 chart(s) failed"), "helm lint {}:\n{out}", chart.display());
    }
}

/// values.yaml lists three PVCs; the chart renders exactly three Jobs, one per PVC, with the
/// args the values ask for, each a least-privilege volprep Job; the rendering validates.
#[test]
#[ignore = "needs helm, kubernetes-validate, yamllint: source .ci/k8s-tools.sh"]
fn migrate_chart_renders_one_job_per_pvc() {
    let test = "migrate_chart_renders_one_job_per_pvc";
    let Some(helm) = tool("VOLPREP_HELM", test) else {
        return;
    };
    let values = &docs(&read("examples/fleet/migrate-chart/values.yaml"))[0];
    let listed: Vec<String> = values["volumePermissions"]["jobs"]
        .as_sequence()
        .expect("volumePermissions.jobs")
        .iter()
        .map(|j| scalar(&j["pvc"]).expect("pvc"))
        .collect();
    let want: Vec<&str> = MIGRATE_JOBS.iter().map(|(_, pvc, _)| *pvc).collect();
    assert_eq!(listed, want, "values.yaml lists the three PVCs of MIGRATE_JOBS");

    let charts = MigrateChart::new(helm);
    let (jobs, file) = charts.jobs("defaults", None);
    assert_eq!(jobs.len(), 3, "one Job per PVC");
    for (job, (name, pvc, args)) in jobs.iter().zip(MIGRATE_JOBS) {
        let at = format!("migrate-chart Job {name}");
        assert_eq!(job["metadata"]["name"].as_str(), Some(*name), "{at}");
        check_job_policy(job, &at);
        check_mount_refs(job, &at);
        let parsed = check_volprep_job(pod_spec(job), &at);
        let raw = volprep_args(job);
        assert_eq!(raw, *args, "{at}: args");
        assert_eq!(parsed.paths, [format!("/volumes/{pvc}")], "{at}");
        assert_eq!(claim_and_mount(job, &at), (pvc.to_string(), format!("/volumes/{pvc}")), "{at}");
        assert_eq!(
            job["spec"]["template"]["spec"]["containers"][0]["image"].as_str(),
            Some("ghcr.io/volprep/volprep:0.1.0")
        );
        check_flags_exist(&raw, &at);
    }
    if let Some(kv) = tool("VOLPREP_K8S_VALIDATE", test) {
        k8s_validate(&kv, std::slice::from_ref(&file));
    }
    if let Some(yl) = tool("VOLPREP_YAMLLINT", test) {
        yamllint(&yl, &[file]);
    }
}

/// The Job settings and per-Job keys: a name of its own, a PVC name too long for a Job name
/// (shortened with a hash, still unique), readOnly, modes, activeDeadlineSeconds, mountDir, no report.
#[test]
#[ignore = "needs helm, kubernetes-validate: source .ci/k8s-tools.sh"]
fn migrate_chart_renders_job_options() {
    let test = "migrate_chart_renders_job_options";
    let Some(helm) = tool("VOLPREP_HELM", test) else {
        return;
    };
    let long = "a-persistent-volume-claim-name-far-too-long-for-a-job-name-0";
    let values = format!(
        r#"
volumePermissions:
  fsGroup: 3000
  report: ""
  logFormat: ""
  extraArgs: [--max-errors=5]
  image:
    tag: "0.2.0"
  job:
    backoffLimit: 1
    activeDeadlineSeconds: 7200
    mountDir: /mnt/
  jobs:
    - pvc: {long}
    - pvc: {long}1
    - pvc: shared.cache
      name: cache-permissions
      readOnly: true
      modes: app-safe
      appUid: 70
      rules: [keys/tls.key=owner-only]
"#
    );
    let charts = MigrateChart::new(helm);
    let (jobs, file) = charts.jobs("options", Some(&values));
    assert_eq!(jobs.len(), 3);
    let names: Vec<&str> = jobs.iter().map(|j| j["metadata"]["name"].as_str().expect("name")).collect();
    for name in &names[..2] {
        assert!(name.len() <= 63 && name.starts_with("volprep-a-persistent"), "{name}");
    }
    assert_ne!(names[0], names[1], "shortened names stay unique");
    assert_eq!(names[2], "cache-permissions");
    for (job, pvc) in jobs.iter().zip([long.to_owned(), format!("{long}1"), "shared.cache".to_owned()]) {
        let at = format!("options Job {pvc}");
        check_job_policy(job, &at);
        check_volprep_job(pod_spec(job), &at);
        assert_eq!(job["spec"]["backoffLimit"].as_u64(), Some(1), "{at}");
        assert_eq!(job["spec"]["activeDeadlineSeconds"].as_u64(), Some(7200), "{at}");
        assert_eq!(claim_and_mount(job, &at), (pvc.clone(), format!("/mnt/{pvc}")), "{at}");
        assert_eq!(pod_spec(job)["containers"][0]["image"].as_str(), Some("ghcr.io/volprep/volprep:0.2.0"));
    }
    assert_eq!(
        volprep_args(&jobs[2]),
        [
            "apply",
            "--fs-group=3000",
            "--read-only",
            "--modes=app-safe",
            "--app-uid=70",
            "--rule=keys/tls.key=owner-only",
            "--termination-log=/dev/termination-log",
            "--max-errors=5",
            "/mnt/shared.cache"
        ]
    );
    if let Some(kv) = tool("VOLPREP_K8S_VALIDATE", test) {
        k8s_validate(&kv, std::slice::from_ref(&file));
    }
}

/// Bad job lists fail the render with a message that names the entry.
#[test]
#[ignore = "needs helm: source .ci/k8s-tools.sh"]
fn migrate_chart_rejects_bad_jobs() {
    let Some(helm) = tool("VOLPREP_HELM", "migrate_chart_rejects_bad_jobs") else {
        return;
    };
    let charts = MigrateChart::new(helm);
    let cases = [
        ("typo", "{pvc: a, fsgroup: 1}", "volumePermissions.jobs[0].fsgroup: unknown key"),
        ("twice", "{pvc: a}, {pvc: a}", "volumePermissions.jobs[1].pvc: a is listed twice"),
        ("bad-pvc", "{pvc: Data_1}", "\"Data_1\" is not a PVC name"),
        ("no-pvc", "{owner: 1000}", "\"\" is not a PVC name"),
        ("not-a-map", "data-app-0", "volumePermissions.jobs[0]: a map"),
        ("args-string", "{pvc: a, args: --threads=8}", "volumePermissions.jobs[0].args: a list"),
        ("same-name", "{pvc: a, name: x}, {pvc: b, name: x}", "two Jobs named x"),
        ("no-spec", "{pvc: a, fsGroup: null}", "volumePermissions.jobs[0] (pvc a): set fsGroup and/or owner"),
        (
            "bad-owner",
            "{pvc: a, owner: app}",
            "volumePermissions.jobs[0].owner: \"app\" is not a numeric UID or UID:GID",
        ),
        ("bad-group", "{pvc: a, fsGroup: www}", "volumePermissions.jobs[0].fsGroup: \"www\" is not a numeric GID"),
    ];
    for (name, jobs, message) in cases {
        let values = format!("volumePermissions:\n  jobs: [{jobs}]\n");
        let out = charts.template(name, Some(&values));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: rendered although it should fail");
        assert!(stderr.contains(message), "{name}: expected {message:?} in:\n{stderr}");
    }
    let out = charts.template("job-typo", Some("volumePermissions:\n  job:\n    backofflimit: 1\n"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("volumePermissions.job.backofflimit: unknown key"), "{stderr}");
    // No jobs: nothing rendered, no error.
    let out = charts.template("none", Some("volumePermissions:\n  jobs: []\n"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(docs(&String::from_utf8_lossy(&out.stdout)).is_empty());
}

// ---------------------------------------------------------------------------------------------
// The command lines, run as the pods would run them

/// A volume of `tops` top-level directories of `per_top` generated entries each (owners,
/// modes, symlinks; no hardlinks or special bits), the root 0:0 0755.
fn volume_tree(outside: &Path, tops: usize, per_top: usize) -> Tree {
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    let opts = GenOpts { hardlinks: false, special_bits: false };
    for i in 0..tops {
        t.nest(&format!("top{i:02}"), &tree::generated(31 + i as u64, per_top, outside, opts));
    }
    t
}

/// `sed -n EXTRACT_REPORT` of a pod's log: its JSON report.
fn extract_report(log: &Path, to: &Path) {
    let report = run_ok(Command::new("sed").args(["-n", EXTRACT_REPORT]).arg(log));
    fs::write(to, report).expect("write report");
}

/// The Indexed Job's pods, one process per index at once with the manifest's args (the
/// volume and termination message made local), stdout and stderr in one log as `kubectl logs`
/// shows them: the volume ends as the kubelet's fsGroup pass leaves it, each pod's termination
/// message is its summary line, and the README's recipe (sed the report out of each log, then
/// `volprep report merge`) gives one summary whose count is the marker's and the tree's.
#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and sed"]
fn indexed_job_runs_as_its_pods_would() {
    common::privileged(&["mkfs.ext4", "sed"]);
    let readme = read(FLEET_README);
    assert!(readme.contains(&format!("sed -n '{EXTRACT_REPORT}'")), "{FLEET_README} shows the extraction tested here");
    let job = only_doc(INDEXED_JOB, "Job");
    let n = job["spec"]["completions"].as_u64().expect("completions");
    let args = volprep_args(&job);

    let fs = LoopFs::new(common::FsKind::Ext4, 64);
    let outside = fs.path().join("outside");
    fs::create_dir(&outside).expect("mkdir outside");
    let t = volume_tree(&outside, 12, 300);
    let (vol, want) = (fs.path().join("shared-data"), fs.path().join("want"));
    t.build(&vol);
    t.build(&want);
    kubelet_reference(&want, 2000, false, Mounts::Skip);
    let total = snapshot(&vol).len();

    let pods = tempfile::tempdir().expect("tempdir");
    let children: Vec<(u64, Child)> = (0..n)
        .map(|i| {
            let log = File::create(pods.path().join(format!("pod-{i}.log"))).expect("log");
            let tlog = pods.path().join(format!("pod-{i}.termination-log"));
            let mut cmd = common::volprep();
            cmd.args(localize(&args, &[("/data", &vol)], &tlog))
                .env("JOB_COMPLETION_INDEX", i.to_string())
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("dup log"))
                .stderr(log);
            (i, cmd.spawn().expect("spawn"))
        })
        .collect();
    for (i, mut child) in children {
        let status = child.wait().expect("wait");
        let log = fs::read_to_string(pods.path().join(format!("pod-{i}.log"))).unwrap_or_default();
        assert!(status.success(), "pod {i}: {status}\n{log}");
        let msg = fs::read_to_string(pods.path().join(format!("pod-{i}.termination-log"))).expect("message");
        assert_eq!(msg.lines().count(), 1, "pod {i}: one summary line: {msg:?}");
        assert!(msg.starts_with(&format!("{}: prepared ", vol.display())), "pod {i}: {msg:?}");
    }
    assert_same(&snapshot(&want), &snapshot(&vol), |m| m.attrs(), "the Indexed Job's shards vs the kubelet");

    let reports: Vec<PathBuf> = (0..n)
        .map(|i| {
            let to = pods.path().join(format!("pod-{i}.json"));
            extract_report(&pods.path().join(format!("pod-{i}.log")), &to);
            to
        })
        .collect();
    let merged = common::run(common::volprep().args(["report", "merge"]).args(&reports)).expect_code(0);
    let line = merged.stdout.trim();
    assert_eq!(line.lines().count(), 1, "one volume, one line: {line}");
    assert!(line.contains(&format!("merged from {n}")) && line.ends_with("marker done]"), "{line}");
    let merged = common::run(common::volprep().args(["report", "merge", "--json"]).args(&reports)).expect_code(0);
    assert_eq!(merged.count("entries"), total as u64, "merged entries = the tree's\n{}", merged.describe());
    assert_eq!(merged.count("errors"), 0);
    let status = common::run(common::volprep().args(["status", "--json"]).arg(&vol)).expect_code(0);
    let status: serde_json::Value = serde_json::from_str(&status.stdout).expect("status JSON");
    assert_eq!(status[0]["state"], "done", "{status}");
    assert_eq!(status[0]["marker"]["entries"].as_u64(), Some(total as u64), "{status}");
    let done: BTreeSet<u64> = status[0]["marker"]["shards"]["done"]
        .as_array()
        .expect("shards.done")
        .iter()
        .filter_map(|v| v.as_u64())
        .collect();
    assert_eq!(done, (0..n).collect(), "every shard done: {status}");
}

/// The migrate chart's Jobs as rendered, each run on its own volume (the path its PVC is
/// mounted at made local): exit 0, the volume owned and moded as the values ask, the summary
/// as termination message, the report on stdout; `report merge` of the three reports gives one
/// line per PVC (each mounted at a path of its own); a second run of each skips (the marker).
#[test]
#[ignore = "needs helm: source .ci/k8s-tools.sh"]
fn migrate_chart_jobs_run_as_rendered() {
    let Some(helm) = tool("VOLPREP_HELM", "migrate_chart_jobs_run_as_rendered") else {
        return;
    };
    common::privileged(&["mkfs.ext4"]);
    let charts = MigrateChart::new(helm);
    let (jobs, _) = charts.jobs("run", None);
    let fs = LoopFs::new(common::FsKind::Ext4, 64);
    let outside = fs.path().join("outside");
    fs::create_dir(&outside).expect("mkdir outside");
    let pods = tempfile::tempdir().expect("tempdir");
    let mut reports = Vec::new();
    let mut vols = Vec::new();
    for (job, (name, pvc, _)) in jobs.iter().zip(MIGRATE_JOBS) {
        let vol = fs.path().join(pvc);
        volume_tree(&outside, 3, 200).build(&vol);
        let tlog = pods.path().join(format!("{name}.termination-log"));
        let args = localize(&volprep_args(job), &[(&format!("/volumes/{pvc}"), &vol)], &tlog);
        let run = common::run(common::volprep().args(&args)).expect_code(0);
        let v = run.volume();
        assert_eq!((v["action"].as_str(), v["errors"].as_u64()), (Some("walked"), Some(0)), "{}", run.describe());
        let msg = fs::read_to_string(&tlog).expect("termination message");
        assert!(msg.starts_with(&format!("{}: prepared ", vol.display())) && msg.lines().count() == 1, "{msg:?}");
        let report = pods.path().join(format!("{name}.json"));
        fs::write(&report, &run.stdout).expect("write report");
        reports.push(report);
        let root = fs::metadata(&vol).expect("stat root");
        let want = match *pvc {
            "data-gitea-0" => (0, 2000, true),
            "uploads" => (1001, 2000, true),
            _ => (1001, 1001, false),
        };
        assert_eq!((root.uid(), root.gid(), root.mode() & 0o2000 != 0), want, "{pvc}: root owner, group, setgid");
        vols.push(vol);
    }
    let merged = common::run(common::volprep().args(["report", "merge"]).args(&reports)).expect_code(0);
    let lines: Vec<&str> = merged.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "one line per PVC:\n{}", merged.stdout);
    for (line, vol) in lines.iter().zip(&vols) {
        assert!(line.starts_with(&format!("{}: prepared ", vol.display())), "{line}");
    }
    for (job, (_, pvc, _)) in jobs.iter().zip(MIGRATE_JOBS) {
        let vol = fs.path().join(pvc);
        let tlog = pods.path().join("again.termination-log");
        let args = localize(&volprep_args(job), &[(&format!("/volumes/{pvc}"), &vol)], &tlog);
        let run = common::run(common::volprep().args(&args)).expect_code(0);
        assert_eq!(run.volume()["action"].as_str(), Some("skipped"), "{pvc}: a rerun skips\n{}", run.describe());
    }
}
