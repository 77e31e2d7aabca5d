//! The image as users run it: built offline and reproducibly (`.ci/image.sh`), run by podman
//! with runc under the examples' init-container securityContexts on a loop-mounted ext4 volume
//! (root with four capabilities, each proven needed; restricted: the app's user with none),
//! the rendered pods played (`podman kube play`), and a delivery through a local registry
//! mirror by digest.
//!
//! Every test here is `#[ignore]`d in a plain `cargo test` (it needs podman, buildah, skopeo,
//! runc, docker-registry, helm and the static binary); `.ci/run` sources `.ci/containers.sh`,
//! `.ci/static.sh` and `.ci/k8s-tools.sh` and runs them with `--include-ignored`, where a test
//! that cannot run fails.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::containers::{self, SecurityContext, ok, podman};
use common::k8s::{self, ROOT};
use common::mixed::{self, APP, GROUP, expected_left, left_by_app, mixed_tree};
use common::play::{self, PlayOpts};
use common::snap::{Kind, ROOT as ROOT_KEY, conforms, kubelet_mode};
use common::tree::{self, GenOpts};
use common::{FsKind, LoopFs, Snapshot, snapshot, xattr};

/// A volprep init container of the examples: its image, args, the group it gives
/// (`--fs-group`) and its securityContext as the kubelet hands it to the runtime.
struct InitContainer {
    image: String,
    args: Vec<String>,
    sc: SecurityContext,
    gid: u32,
}

/// The root init container of examples/statefulset.yaml.
const STATEFULSET: &str = "examples/statefulset.yaml";
/// The restricted one: the kustomize component's patch (the Helm chart's `mode: unprivileged`
/// renders the same securityContext and args; tests/examples.rs checks both).
const RESTRICTED: &str = "examples/kustomize/component-unprivileged/patches/volprep.yaml";

/// The volprep init container of the StatefulSet in `example`.
fn init_container(example: &str) -> InitContainer {
    let docs = k8s::docs(&k8s::read(example));
    let sts = docs.iter().find(|d| d["kind"] == "StatefulSet").expect("StatefulSet");
    volprep_of(k8s::pod_spec(sts), example)
}

/// The volprep init container of `pod`, its user and groups resolved as the kubelet does: the
/// container's runAsUser/runAsGroup over the pod's, the pod's supplementalGroups.
fn volprep_of(pod: &serde_norway::Value, example: &str) -> InitContainer {
    let inits = pod["initContainers"].as_sequence().expect("initContainers");
    let c = inits.iter().find(|c| c["name"] == "volprep").expect("volprep init container");
    let sc = &c["securityContext"];
    // What init_container_command passes to podman is what this securityContext says.
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true), "{example}");
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false), "{example}");
    assert_eq!(k8s::strs(&sc["capabilities"]["drop"]), ["ALL"], "{example}");
    let id = |key: &str| {
        let v = sc[key].as_u64().or_else(|| pod["securityContext"][key].as_u64());
        v.unwrap_or_else(|| panic!("{example}: no {key}")) as u32
    };
    let groups = k8s::strs(&pod["securityContext"]["supplementalGroups"]).iter().map(|g| g.parse().unwrap()).collect();
    let args = k8s::strs(&c["args"]);
    let gid = args.iter().find_map(|a| a.strip_prefix("--fs-group=")).expect("--fs-group=").parse().unwrap();
    InitContainer {
        image: c["image"].as_str().unwrap().to_string(),
        args,
        sc: SecurityContext {
            uid: id("runAsUser"),
            gid: id("runAsGroup"),
            groups,
            caps: k8s::strs(&sc["capabilities"]["add"]),
        },
        gid,
    }
}

/// A volume an app left behind: a generated tree of mixed owners and modes, hardlinks and
/// symlinks pointing outside (to `outside`), plus setuid/setgid files and private directories
/// of other users; the root as a fresh PV's (0:0 0755). Special bits only where the fix changes
/// the mode (so that counts per inode are exact).
fn app_volume(root: &Path, outside: &Path) {
    let mut t = tree::generated(7, 1500, outside, GenOpts { hardlinks: true, special_bits: false });
    t.dir("private", 1001, 1001, 0o700)
        .dir("private/deeper", 1001, 1001, 0o700)
        .file("private/deeper/key", 1001, 1001, 0o600)
        .file("tool-setuid", 0, 0, 0o4755)
        .file("tool-setgid", 33, 33, 0o2755)
        .symlink("etc-link", "/etc", 0, 0)
        .symlink("out-link", outside.as_os_str().as_bytes(), 1001, 1001)
        .hardlink("private-hardlink", "private/deeper/key")
        .root(0, 0, 0o755);
    t.build(root);
}

/// Outside the volume: a directory the volume's symlinks point to, mounted into the container
/// at the same path (so following a link would reach it).
fn outside_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("volprep-outside-").tempdir().unwrap();
    fs::write(dir.path().join("canary-file"), "canary").unwrap();
    fs::set_permissions(dir.path().join("canary-file"), fs::Permissions::from_mode(0o600)).unwrap();
    dir
}

/// The emptyDir the kubelet makes for /tmp: root, 0777, no sticky bit.
fn empty_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("volprep-emptydir-").tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// The marker's state on a volume root (None: no marker).
fn marker_state(root: &Path) -> Option<String> {
    xattr::xattr_json(root, xattr::MARKER).map(|v| v["state"].as_str().unwrap_or("?").to_string())
}

/// Every entry of `after` is what the kubelet's fsGroup pass would make of it in `before`.
fn assert_prepared(before: &Snapshot, after: &Snapshot, gid: u32, context: &str) {
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>(), "{context}: same entries");
    for (path, b) in before {
        let a = &after[path];
        let want = (b.uid, gid, kubelet_mode(b.kind, b.mode, false));
        assert_eq!(
            (a.uid, a.gid, a.mode),
            want,
            "{context}: {} ({:?}) was {}:{} {:o}",
            common::show(path),
            b.kind,
            b.uid,
            b.gid,
            b.mode
        );
        assert!(conforms(a, gid, false), "{context}: {}", common::show(path));
    }
}

/// Inodes whose owner or group, and whose mode, differ between two snapshots of one volume.
fn changed_inodes(before: &Snapshot, after: &Snapshot) -> (usize, usize) {
    let by_ino = |s: &Snapshot| s.values().map(|m| (m.ino, *m)).collect::<BTreeMap<u64, _>>();
    let (b, a) = (by_ino(before), by_ino(after));
    let owner = b.iter().filter(|(i, m)| a.get(i).is_some_and(|n| (n.uid, n.gid) != (m.uid, m.gid))).count();
    let mode = b.iter().filter(|(i, m)| a.get(i).is_some_and(|n| n.mode != m.mode)).count();
    (owner, mode)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// JSON log lines of a run's stderr.
fn log_lines(stderr: &str) -> Vec<serde_json::Value> {
    stderr.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).collect()
}

// ---------------------------------------------------------------------------------------------
// The image

/// Two builds of this commit give the same digest; the image is small, labelled, holds only
/// /volprep (no build path inside), and carries its dependency list (cargo auditable).
#[test]
#[ignore = "needs podman, buildah, skopeo, runc and the static binary: source .ci/containers.sh and .ci/static.sh, then --include-ignored"]
fn image_builds_reproducibly_small_and_labelled() {
    containers::require();
    let first = containers::image();
    let again = containers::build_image(&containers::scratch_dir("image-b"), "localhost/volprep:rebuild");
    k8s::say(&format!("first build:  {}", first.line));
    k8s::say(&format!("second build: {}", again.line));
    k8s::say(&format!("image digest {} (twice), {} bytes compressed", first.digest, first.compressed));
    assert_eq!(first.digest, again.digest, "two builds of one commit, two digests");
    assert!(first.compressed <= 5_000_000, "image is {} bytes, over 5 MB", first.compressed);

    // Labels.
    let inspect = ok(Command::new("skopeo").args(["inspect", "--config"]).arg(format!(
        "oci:{}:{}",
        first.layout.display(),
        first.version
    )));
    let config: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    let labels = &config["config"]["Labels"];
    let revision = ok(Command::new("git").args(["-C", ROOT, "rev-parse", "HEAD"])).trim().to_string();
    assert_eq!(labels["org.opencontainers.image.version"], containers::cargo_version());
    assert_eq!(labels["org.opencontainers.image.revision"], revision.as_str());
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert!(labels["org.opencontainers.image.source"].is_string(), "{labels}");
    assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/volprep"]));

    // Content: /volprep alone, the bytes .ci/static.sh built, no path of this machine inside.
    let unpacked = containers::scratch_dir("unpacked");
    let bundle = unpacked.join("bundle");
    ok(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:{}", first.layout.display(), first.version))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    let names: Vec<String> =
        fs::read_dir(&rootfs).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["volprep"], "FROM scratch: only the binary");
    let bin = fs::read(rootfs.join("volprep")).unwrap();
    let host_bin = fs::read(std::env::var("VOLPREP_STATIC_BIN").unwrap()).unwrap();
    assert!(bin == host_bin, "the image holds the static binary .ci/static.sh built");
    // The checkout and the crates' sources (CARGO_HOME/registry/src) are remapped. (Not "/root"
    // alone: volprep's guard names /root among the system directories it refuses.)
    for needle in [ROOT, ".cargo/registry", "/home/"] {
        assert!(!contains(&bin, needle.as_bytes()), "the binary holds the build path {needle:?}");
    }
    assert!(contains(&bin, b"/cargo/registry/src/"), "crate paths remapped to /cargo");
    // cargo auditable: the dependency list, zlib-compressed JSON in the .dep-v0 section.
    let deps = auditable_deps(&rootfs.join("volprep"));
    let lock = fs::read_to_string(Path::new(ROOT).join("Cargo.lock")).unwrap();
    for dep in ["clap", "rustix", "serde_json", "tracing"] {
        let entry = deps.iter().find(|(n, _)| n == dep).unwrap_or_else(|| panic!("{dep} not in the SBOM: {deps:?}"));
        assert!(
            lock.contains(&format!("name = \"{dep}\"\nversion = \"{}\"", entry.1)),
            "{dep} {} not in Cargo.lock",
            entry.1
        );
    }
    k8s::say(&format!("SBOM (cargo auditable, in the binary): {} packages", deps.len()));
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The packages (name, version) cargo auditable recorded in `bin`.
fn auditable_deps(bin: &Path) -> Vec<(String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let section = dir.path().join("dep-v0");
    ok(Command::new("objcopy")
        .arg(format!("--dump-section=.dep-v0={}", section.display()))
        .arg(bin)
        .arg(dir.path().join("copy")));
    let json = ok(Command::new("python3")
        .args(["-c", "import sys, zlib; sys.stdout.write(zlib.decompress(open(sys.argv[1], 'rb').read()).decode())"])
        .arg(&section));
    let v: serde_json::Value = serde_json::from_str(&json).expect("auditable JSON");
    v["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["name"].as_str().unwrap().to_string(), p["version"].as_str().unwrap().to_string()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The init container, run by podman + runc

/// Under exactly the init container's securityContext, the image prepares a real volume
/// (checked from the host against the kubelet's rule), writes the termination message, makes
/// /tmp a sticky temp dir, changes nothing outside, and a second run skips.
#[test]
#[ignore = "needs podman, buildah, skopeo, runc and the static binary: source .ci/containers.sh and .ci/static.sh, then --include-ignored"]
fn image_prepares_a_volume_under_the_manifest_security_context() {
    containers::require();
    let image = containers::image();
    let init = init_container(STATEFULSET);
    assert_eq!((init.sc.uid, init.sc.gid), (0, 0), "root, with the capabilities it adds");
    let fs = LoopFs::new(FsKind::Ext4, 128);
    let outside = outside_dir();
    app_volume(fs.path(), outside.path());
    let tmp = empty_dir();
    let term = tempfile::NamedTempFile::new().unwrap();
    let before = snapshot(fs.path());
    let outside_before = snapshot(outside.path());
    let mounts = [
        (fs.path().to_path_buf(), "/data"),
        (tmp.path().to_path_buf(), "/tmp"),
        (term.path().to_path_buf(), "/dev/termination-log"),
        (outside.path().to_path_buf(), outside.path().to_str().unwrap()),
    ];
    let args: Vec<&str> = init.args.iter().map(String::as_str).collect();
    let started = std::time::Instant::now();
    let out = containers::run_as_init_container(&image.tag, &init.sc, &mounts, &args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "podman run {args:?}:\n{stderr}");
    k8s::say(&format!(
        "init container run: {:.2}s (image {} from {})",
        started.elapsed().as_secs_f64(),
        image.tag,
        init.image
    ));

    let after = snapshot(fs.path());
    assert_prepared(&before, &after, init.gid, "after the init container");
    assert_eq!(marker_state(fs.path()).as_deref(), Some("done"));
    assert_eq!(fs::metadata(tmp.path()).unwrap().permissions().mode() & 0o7777, 0o1777, "/tmp sticky");
    common::assert_same(&outside_before, &snapshot(outside.path()), |m| *m, "outside the volume");

    let message = fs::read_to_string(term.path()).unwrap();
    let lines: Vec<&str> = message.lines().collect();
    assert_eq!(lines.len(), 2, "{message}");
    assert!(lines[0].starts_with("/tmp: sticky temp dir"), "{message}");
    let entries = before.len();
    assert!(lines[1].starts_with(&format!("/data: prepared {entries} entries")), "{message}");
    assert!(lines[1].ends_with(", 0 error(s)"), "{message}");
    let logs = log_lines(&stderr);
    assert!(logs.iter().any(|l| l["decision"] == "walk"), "{stderr}");

    // Again: the marker says done, nothing is walked or changed.
    let out = containers::run_as_init_container(&image.tag, &init.sc, &mounts, &args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "second run:\n{stderr}");
    assert!(log_lines(&stderr).iter().any(|l| l["decision"] == "skip"), "{stderr}");
    let message = fs::read_to_string(term.path()).unwrap();
    assert!(message.lines().nth(1).is_some_and(|l| l.starts_with("/data: skipped")), "{message}");
    common::assert_same(&after, &snapshot(fs.path()), |m| *m, "second run (ctimes included)");
    common::assert_same(&outside_before, &snapshot(outside.path()), |m| *m, "outside the volume, second run");
}

/// Least privilege: without any one of the added capabilities the run exits 1, one ERROR line
/// names that capability, the summary is an ERROR line, no `done` marker is left, and the
/// report counts exactly the inodes whose owner and mode changed on disk.
#[test]
#[ignore = "needs podman, buildah, skopeo, runc and the static binary: source .ci/containers.sh and .ci/static.sh, then --include-ignored"]
fn image_without_each_capability_fails_naming_it() {
    containers::require();
    let image = containers::image();
    let init = init_container(STATEFULSET);
    assert_eq!(init.sc.caps, ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID"], "the documented capabilities");
    let mut results = Vec::new();
    for missing in &init.sc.caps {
        let caps: Vec<String> = init.sc.caps.iter().filter(|c| *c != missing).cloned().collect();
        // Not in the group (no supplementalGroups, as the standalone Job of examples/fleet):
        // in the pod, supplementalGroups holds the fs-group, and the kernel keeps the setgid
        // bit of a directory of a group the process is in without CAP_FSETID (README,
        // "Capabilities").
        let sc = SecurityContext { caps, groups: vec![], ..init.sc.clone() };
        let fs = LoopFs::new(FsKind::Ext4, 128);
        let outside = outside_dir();
        app_volume(fs.path(), outside.path());
        let tmp = empty_dir();
        let term = tempfile::NamedTempFile::new().unwrap();
        let before = snapshot(fs.path());
        let mounts = [
            (fs.path().to_path_buf(), "/data"),
            (tmp.path().to_path_buf(), "/tmp"),
            (term.path().to_path_buf(), "/dev/termination-log"),
        ];
        // The manifest's args, plus the report on stdout and one thread: with hardlinks, a
        // serial walk makes "changed inodes" exact.
        let mut args: Vec<&str> = init.args.iter().map(String::as_str).collect();
        args.splice(args.len() - 1..args.len() - 1, ["--report=-", "--threads=1"]);
        let out = containers::run_as_init_container(&image.tag, &sc, &mounts, &args);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        let ctx = format!("without CAP_{missing} (kept {:?}):\n--- stderr (head)\n{}", sc.caps, head(&stderr));
        assert_eq!(out.status.code(), Some(1), "{ctx}");

        let logs = log_lines(&stderr);
        let naming: Vec<&serde_json::Value> = logs
            .iter()
            .filter(|l| l["message"].as_str().is_some_and(|m| m.starts_with("missing capability")))
            .collect();
        assert_eq!(naming.len(), 1, "one line names the capability; {ctx}");
        let line = naming[0]["message"].as_str().unwrap();
        assert_eq!(naming[0]["level"], "ERROR", "{ctx}");
        assert!(line.starts_with(&format!("missing capability CAP_{missing}:")), "{line}");
        let summary = logs.iter().find(|l| l["action"] == "walked").unwrap_or_else(|| panic!("no summary; {ctx}"));
        assert_eq!(summary["level"], "ERROR", "summary of a failed run; {ctx}");
        assert_ne!(marker_state(fs.path()).as_deref(), Some("done"), "{ctx}");
        assert!(fs::read_to_string(term.path()).unwrap().contains(&format!("CAP_{missing}")), "termination message");

        let after = snapshot(fs.path());
        let report: serde_json::Value =
            serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("report: {e}\n{stdout}"));
        let data = report["volumes"].as_array().unwrap().iter().find(|v| v["path"] == "/data").expect("/data");
        let (owner, mode) = changed_inodes(&before, &after);
        let counted =
            (data["changed_owner"].as_u64().unwrap() as usize, data["changed_mode"].as_u64().unwrap() as usize);
        assert_eq!(counted, (owner, mode), "report (changed_owner, changed_mode) vs inodes changed on disk; {ctx}");
        let errors = data["errors"].as_u64().unwrap();
        assert!(errors > 0, "{ctx}");
        results.push(format!(
            "without CAP_{missing}: exit 1, \"{line}\", changed owner {} mode {} (on disk: {owner} {mode}), {errors} error(s), marker {}",
            counted.0,
            counted.1,
            marker_state(fs.path()).unwrap_or_else(|| "none".into())
        ));
    }
    for r in &results {
        k8s::say(r);
    }
}

fn head(s: &str) -> String {
    s.lines().take(12).collect::<Vec<_>>().join("\n")
}

// ---------------------------------------------------------------------------------------------
// The restricted init container (unprivileged), run by podman + runc

/// The restricted example's init container (app's uid and gid, no capability, `apply
/// --unprivileged`), with its group moved from the app's own gid (which the process always
/// holds) to `GROUP`, held only through `supplementalGroups` (`--group-add`): what makes
/// `supplementalGroups` matter. Its args also write the report to stdout.
fn restricted_init_container() -> InitContainer {
    let mut init = init_container(RESTRICTED);
    assert_eq!((init.sc.uid, init.sc.gid), (APP, APP), "{RESTRICTED}: the app's user");
    assert!(init.sc.caps.is_empty(), "{RESTRICTED}: no capability added: {:?}", init.sc.caps);
    assert_eq!(init.sc.groups, [init.gid], "{RESTRICTED}: supplementalGroups holds the --fs-group");
    assert!(init.args.iter().any(|a| a == "--unprivileged"), "{RESTRICTED}: {:?}", init.args);
    let fs_group = format!("--fs-group={}", init.gid);
    let i = init.args.iter().position(|a| *a == fs_group).expect("--fs-group");
    init.args[i] = format!("--fs-group={GROUP}");
    let last = init.args.len() - 1;
    assert_eq!(init.args[last], "/data", "{RESTRICTED}: the volume is the last arg");
    init.args.insert(last, "--report=-".into());
    (init.gid, init.sc.groups) = (GROUP, vec![GROUP]);
    init
}

/// A loop ext4 holding the mixed-owner tree (its lost+found root's), and the termination
/// message file the kubelet makes (0666: the container's user writes it).
fn restricted_volume() -> (LoopFs, tempfile::NamedTempFile) {
    let fs = LoopFs::new(FsKind::Ext4, 64);
    mixed_tree().build(fs.path());
    let term = tempfile::NamedTempFile::new().unwrap();
    fs::set_permissions(term.path(), fs::Permissions::from_mode(0o666)).unwrap();
    (fs, term)
}

fn restricted_mounts(fs: &LoopFs, term: &tempfile::NamedTempFile) -> [(PathBuf, &'static str); 2] {
    [(fs.path().to_path_buf(), "/data"), (term.path().to_path_buf(), "/dev/termination-log")]
}

/// `podman run IMAGE ARGS` under `sc` with `mounts`: the exit code, stdout, stderr and how long
/// it took.
fn timed_run(
    image: &str,
    sc: &SecurityContext,
    mounts: &[(PathBuf, &str)],
    args: &[String],
) -> (i32, String, String, f64) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = std::time::Instant::now();
    let out = containers::run_as_init_container(image, sc, mounts, &args);
    let secs = started.elapsed().as_secs_f64();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr), secs)
}

/// The report's only volume.
fn report_volume(stdout: &str, stderr: &str) -> serde_json::Value {
    let report: serde_json::Value =
        serde_json::from_str(stdout).unwrap_or_else(|e| panic!("report: {e}\n{stdout}\n--- stderr\n{stderr}"));
    let vols = report["volumes"].as_array().expect("volumes");
    assert_eq!(vols.len(), 1, "{report}");
    assert_eq!(vols[0]["path"], "/data", "{report}");
    vols[0].clone()
}

/// The restricted example's init container as `podman run --user 1000:1000 --group-add 2000
/// --cap-drop ALL --security-opt no-new-privileges --read-only`, the image run as the app's
/// user on a loop ext4 of mixed owners: exit 4, every entry of the app conforms afterwards
/// (checked from the host), every other entry is untouched and the non-conforming ones are
/// listed, the marker stays in-progress with `left`, the log says what a privileged run would
/// do; a second run changes nothing and exits 4 again.
#[test]
#[ignore = "needs podman, buildah, runc, busybox-static and the static binary: source .ci/containers.sh and .ci/static.sh, then --include-ignored"]
fn restricted_image_fixes_the_apps_entries_and_lists_the_others() {
    containers::require();
    let image = containers::image();
    let init = restricted_init_container();
    let (fs, term) = restricted_volume();
    let mounts = restricted_mounts(&fs, &term);

    // The runtime gives exactly what the securityContext says: the app's user, the group, no
    // capability in any set, no-new-privileges; and that user reaches the volume. The same
    // command, with the busybox probe image.
    let probe = containers::probe_image();
    let script = "grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status; ls -d /data/app/sub && echo REACHED";
    let out = containers::output(containers::init_container_command(&init.sc, &mounts).arg(probe).args(["-c", script]));
    let status = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "probe: {status}\n{}", text(&out.stderr));
    let field = |name: &str| -> Vec<String> {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("{name}: {status}"));
        line.split_whitespace().map(str::to_string).collect()
    };
    assert_eq!(field("Uid"), ["1000"; 4], "{status}");
    assert_eq!(field("Gid"), ["1000"; 4], "{status}");
    assert!(field("Groups").contains(&GROUP.to_string()) && !field("Groups").contains(&"0".to_string()), "{status}");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(field(set), ["0000000000000000"], "{set}: no capability\n{status}");
    }
    assert_eq!(field("NoNewPrivs"), ["1"], "{status}");
    assert!(status.contains("REACHED"), "the app's user reaches the volume: {status}");

    let before = snapshot(fs.path());
    let left = left_by_app(&before, GROUP, &[GROUP]);
    assert_eq!(left, expected_left(), "what must be left, from the host's view");
    let unread = left.iter().filter(|(_, u)| *u).count() as u64;
    let apps = before.values().filter(|m| m.uid == APP).count();
    assert!(before.values().any(|m| m.uid == APP && !conforms(m, GROUP, false)), "the app has work to do");

    let (code, stdout, stderr, first_secs) = timed_run(&image.tag, &init.sc, &mounts, &init.args);
    assert_eq!(code, 4, "exit 4: entries left for a privileged run\n{stderr}\n{stdout}");
    let v = report_volume(&stdout, &stderr);
    assert_eq!(v["unprivileged"], true, "{v}");
    assert_eq!((v["errors"].as_u64(), v["marker_after"].as_str()), (Some(0), Some("in-progress")), "{v}");
    assert_eq!(mixed::listed(&v, Path::new("/data")), left, "{v}");
    assert_eq!(
        (v["foreign_owned"].as_u64(), v["foreign_unread_dirs"].as_u64()),
        (Some(left.len() as u64), Some(unread)),
        "{v}"
    );
    mixed::assert_listed_as_they_are(&v, Path::new("/data"), &before, GROUP);
    assert!(v["changed_owner"].as_u64() > Some(0) && v["changed_mode"].as_u64() > Some(0), "{v}");

    // From the host: the app's entries conform, exactly as the kubelet would leave them; every
    // other entry is byte-for-byte as it was (ctime included).
    let after = snapshot(fs.path());
    let fixed = mixed::assert_app_fixed_others_untouched(&before, &after, GROUP, "restricted init container");
    assert_eq!(fixed, apps);
    for (path, m) in &after {
        if m.uid == APP {
            assert!(conforms(m, GROUP, false), "{}: {m:?}", common::show(path));
        }
    }
    let marker = xattr::xattr_json(fs.path(), xattr::MARKER).expect("a marker on the app's root");
    assert_eq!(
        (marker["state"].as_str(), marker["left"].as_u64()),
        (Some("in-progress"), Some(left.len() as u64)),
        "{marker}"
    );

    // The log line says what is left and what a privileged run would do; so does the
    // termination message.
    let logs = log_lines(&stderr);
    let warning = logs
        .iter()
        .find(|l| l["message"].as_str().is_some_and(|m| m.contains("entries owned by other users do not conform")))
        .unwrap_or_else(|| panic!("no log line about the entries left\n{stderr}"));
    assert_eq!(warning["level"], "WARN", "{warning}");
    let message = warning["message"].as_str().unwrap();
    for part in [
        &format!("{} entries owned by other users", left.len()),
        &format!("{unread} of them directories this user may not read"),
        &format!("A privileged run would give them group {GROUP}"),
        &format!("volprep apply --fs-group={GROUP} /data"),
    ] {
        assert!(message.contains(part.as_str()), "{part:?} missing from: {message}");
    }
    let summary = fs::read_to_string(term.path()).unwrap();
    assert!(
        summary.starts_with("/data: walked ")
            && summary.contains(&format!("left {} entries of other users", left.len())),
        "{summary}"
    );

    // Again: walked again (the marker says why), nothing changes, exit 4 again.
    common::tick();
    let (code, stdout, stderr, second_secs) = timed_run(&image.tag, &init.sc, &mounts, &init.args);
    assert_eq!(code, 4, "second run\n{stderr}\n{stdout}");
    let v = report_volume(&stdout, &stderr);
    assert_eq!((v["changed_owner"].as_u64(), v["changed_mode"].as_u64()), (Some(0), Some(0)), "{v}");
    assert_eq!(mixed::listed(&v, Path::new("/data")), left, "{v}");
    assert_eq!(v["marker_after"], "in-progress", "{v}");
    let reason = v["reason"].as_str().unwrap_or_default();
    assert!(reason.contains(&format!("left {} entries of other users", left.len())), "{reason}");
    // Nothing below the root changes, not even a ctime; the root's ctime moves only because the
    // marker (an xattr) is rewritten.
    let (mut after, mut again) = (after, snapshot(fs.path()));
    assert_eq!(after.remove(ROOT_KEY).map(|m| m.attrs()), again.remove(ROOT_KEY).map(|m| m.attrs()));
    common::assert_same(&after, &again, |m| m.attrs_ctime(), "a second restricted run changes nothing");
    k8s::say(&format!(
        "restricted init container (uid {APP}, groups {GROUP}, no capability): {} entries, {fixed} the app's fixed, {} left and listed ({unread} unread dirs), exit 4; runs {first_secs:.2}s and {second_secs:.2}s",
        before.len(),
        left.len(),
    ));
}

/// Runs the restricted init container with `args` (and `sc`) on a fresh mixed-owner volume,
/// expects exit 2 with one ERROR log line holding every one of `parts`, no report and no
/// change at all.
fn restricted_refusal(sc: &SecurityContext, args: &[String], parts: &[&str]) {
    let image = containers::image();
    let (fs, term) = restricted_volume();
    let mounts = restricted_mounts(&fs, &term);
    let before = snapshot(fs.path());
    let (code, stdout, stderr, _) = timed_run(&image.tag, sc, &mounts, args);
    assert_eq!(code, 2, "{args:?}\n{stderr}\n{stdout}");
    let logs = log_lines(&stderr);
    assert_eq!(logs.len(), 1, "one line: {stderr}");
    assert_eq!(logs[0]["level"], "ERROR", "{stderr}");
    let message = logs[0]["message"].as_str().unwrap_or_default();
    for part in parts {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
    assert!(stdout.is_empty(), "no report: nothing was done\n{stdout}");
    common::assert_same(&before, &snapshot(fs.path()), |m| m.attrs_ctime(), "a refused run changes nothing");
    assert_eq!(marker_state(fs.path()), None, "no marker");
}

/// Without the spec's group among its groups (`--group-add 3000` only), the restricted init
/// container stops before any change and says which supplementalGroups it needs.
#[test]
#[ignore = "needs podman, buildah, runc and the static binary: source .ci/containers.sh and .ci/static.sh, then --include-ignored"]
fn restricted_image_without_the_group_changes_nothing() {
    containers::require();
    let init = restricted_init_container();
    let sc = SecurityContext { groups: vec![3000], ..init.sc.clone() };
    let holds = format!("uid {APP}, groups ");
    let needs = format!("supplementalGroups: [{GROUP}]");
    restricted_refusal(
        &sc,
        &init.args,
        &[&format!("group {GROUP} is not one of this process's groups"), &holds, &needs],
    );
}

/// `--owner` in the restricted init container: a usage error (only root may give files away),
/// before any change.
#[test]
#[ignore = "needs podman, buildah, runc and the static binary: source .ci/containers.sh and .ci/static.sh, then --include-ignored"]
fn restricted_image_refuses_owner() {
    containers::require();
    let init = restricted_init_container();
    let mut args = init.args.clone();
    args.insert(args.len() - 1, format!("--owner={APP}"));
    restricted_refusal(&init.sc, &args, &["--owner needs root", "--unprivileged"]);
}

// ---------------------------------------------------------------------------------------------
// Rendered pods, played

/// The probe the app containers run as the pod's user: create, write and read in the data
/// volume, and find /tmp a sticky temp dir (Ruby's Dir.tmpdir rule: world-writable needs +t).
const PROBE: &str = r#"set -eu
data="$1"
echo "probe uid=$(id -u) gid=$(id -g) groups=$(id -G)"
mkdir -p "$data/probe-$HOSTNAME"
echo "written by $(id -u)" > "$data/probe-$HOSTNAME/file"
cat "$data/probe-$HOSTNAME/file"
ls -ln "$data/probe-$HOSTNAME/file"
if [ -d /tmp ]; then
  mode=$(stat -c %a /tmp)
  echo "tmp mode $mode"
  [ "$mode" = 1777 ]
  t=$(mktemp -p /tmp)
  echo tmp-ok > "$t"; cat "$t"; rm "$t"
fi
echo PROBE-OK"#;

/// Removes the pods and volumes (PVCs) of a play on drop, a failed assertion included; made
/// before the play too, for what a killed run left.
struct Played {
    pods: Vec<String>,
    volumes: Vec<String>,
}

impl Played {
    fn clean(&self) {
        for pod in &self.pods {
            let _ = podman().args(["pod", "rm", "--force", "--ignore", pod]).output();
        }
        for vol in &self.volumes {
            let _ = podman().args(["volume", "rm", "--force", vol]).output();
        }
    }
}

impl Drop for Played {
    fn drop(&mut self) {
        self.clean();
    }
}

/// Plays `rendered` with each PVC on its own loop-mounted ext4 volume pre-filled like an app's,
/// then asserts: every init container exits 0 (volprep first, its termination message says
/// prepared), every probe exits 0 as the pod's user and prints PROBE-OK, the files it made got
/// the group, and the volume conforms apart from them.
fn play_and_check(what: &str, rendered: &str, data_mount: &str) {
    let image = containers::image();
    let probe = containers::probe_image();
    let docs = k8s::docs(rendered);
    let dir = tempfile::tempdir().unwrap();
    let outside = outside_dir();
    let mut volumes = Vec::new();
    let mut claims = Vec::new();
    for doc in &docs {
        if doc["kind"] != "StatefulSet" {
            continue;
        }
        let sts = doc["metadata"]["name"].as_str().unwrap();
        for claim in doc["spec"]["volumeClaimTemplates"].as_sequence().unwrap() {
            let fs = LoopFs::new(FsKind::Ext4, 64);
            app_volume(fs.path(), outside.path());
            claims.push((format!("{}-{sts}-0", claim["metadata"]["name"].as_str().unwrap()), fs.path().to_path_buf()));
            volumes.push(fs);
        }
    }
    assert!(!volumes.is_empty(), "{what}: no volumeClaimTemplates");
    let term_dir = dir.path().join("termination");
    fs::create_dir(&term_dir).unwrap();
    let volprep_images: Vec<(String, String)> = docs
        .iter()
        .flat_map(|d| k8s::workloads(std::slice::from_ref(d)).into_iter().cloned().collect::<Vec<_>>())
        .flat_map(|w| k8s::pod_spec(&w)["initContainers"].as_sequence().cloned().unwrap_or_default())
        .filter(|c| c["name"] == "volprep")
        .map(|c| (c["image"].as_str().unwrap().to_string(), image.tag.clone()))
        .collect();
    assert!(!volprep_images.is_empty(), "{what}: no volprep init container");
    let opts = PlayOpts {
        images: volprep_images,
        claims,
        app: Some((
            probe.to_string(),
            vec!["/bin/sh".into(), "-c".into(), PROBE.into(), "probe".into(), data_mount.into()],
        )),
        termination_dir: term_dir,
    };
    let (yaml, pods) = play::translate(&docs, &opts);
    let yaml_path = dir.path().join("play.yaml");
    fs::write(&yaml_path, &yaml).unwrap();
    let befores: Vec<Snapshot> = volumes.iter().map(|v| snapshot(v.path())).collect();
    let played = Played {
        pods: pods.iter().map(|p| p.name.clone()).collect(),
        volumes: opts.claims.iter().map(|(name, _)| name.clone()).collect(),
    };
    played.clean();
    let started = std::time::Instant::now();
    let out = containers::output(podman().args(["kube", "play"]).arg(&yaml_path));
    if !out.status.success() {
        let logs: Vec<String> = pods
            .iter()
            .flat_map(|p| p.init_containers.iter().chain(&p.containers).map(|c| p.container(c)))
            .map(|c| format!("--- {c}\n{}", containers::logs(&c)))
            .collect();
        panic!("{what}: podman kube play failed: {}\n{}\n--- play.yaml\n{yaml}", text(&out.stderr), logs.join("\n"));
    }
    for pod in &pods {
        for (i, c) in pod.init_containers.iter().chain(&pod.containers).enumerate() {
            let name = pod.container(c);
            let code = containers::wait(&name);
            let logs = containers::logs(&name);
            assert_eq!(code, 0, "{what}: {name} exited {code}\n{logs}\n--- play.yaml\n{yaml}");
            if c == "volprep" {
                assert_eq!(i, 0, "{what}: volprep is the first init container");
                let msg = fs::read_to_string(pod.termination_file(&opts, c)).unwrap();
                assert!(msg.lines().any(|l| l.contains(": prepared ") && l.ends_with(" 0 error(s)")), "{what}: {msg}");
                assert!(msg.lines().any(|l| l.starts_with("/tmp: sticky temp dir")), "{what}: {msg}");
            } else {
                assert!(logs.contains("PROBE-OK"), "{what}: {name}:\n{logs}");
                assert!(logs.contains("probe uid=1000 "), "{what}: {name} runs as the pod's user:\n{logs}");
                if pod.containers.contains(c) {
                    assert!(logs.contains("tmp mode 1777"), "{what}: {name}: /tmp a sticky temp dir\n{logs}");
                }
            }
        }
    }
    k8s::say(&format!("{what}: played {} pod(s) in {:.1}s", pods.len(), started.elapsed().as_secs_f64()));
    for (v, before) in volumes.iter().zip(&befores) {
        let after = snapshot(v.path());
        let (mut kept, mut probe_made) = (Snapshot::new(), Snapshot::new());
        for (p, m) in after {
            if p.starts_with(b"probe-") {
                probe_made.insert(p, m);
            } else {
                kept.insert(p, m);
            }
        }
        assert_prepared(before, &kept, 1000, what);
        assert!(!probe_made.is_empty(), "{what}: the probe wrote nothing");
        for (p, m) in &probe_made {
            assert_eq!((m.uid, m.gid), (1000, 1000), "{what}: {} made by the app", common::show(p));
            if m.kind == Kind::Dir {
                assert_ne!(m.mode & libc::S_ISGID, 0, "{what}: setgid inherited");
            }
        }
        assert_eq!(marker_state(v.path()).as_deref(), Some("done"));
    }
}

fn tool(var: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(var).unwrap_or_else(|| panic!("{var} is not set: source .ci/k8s-tools.sh")))
}

/// The demo chart (library chart included by `helm dependency build`), rendered with the image
/// pointed at the local build through values.
fn render_demo(home: &Path, charts: &Path, values: &[&str]) -> String {
    let helm = tool("VOLPREP_HELM");
    for chart in ["volprep", "demo-app"] {
        k8s::copy_dir(&Path::new(ROOT).join("examples/helm").join(chart), &charts.join(chart));
    }
    ok(k8s::helm(&helm, home).arg("dependency").arg("build").arg(charts.join("demo-app")));
    let mut cmd = k8s::helm(&helm, home);
    cmd.args(["template", "demo"]).arg(charts.join("demo-app"));
    for v in values {
        cmd.args(["--set", v]);
    }
    ok(&mut cmd)
}

#[test]
#[ignore = "needs podman, runc, helm (source .ci/containers.sh, .ci/static.sh and .ci/k8s-tools.sh, then --include-ignored)"]
fn demo_chart_pod_runs_under_podman() {
    containers::require();
    let dir = tempfile::tempdir().unwrap();
    let rendered = render_demo(&dir.path().join("home"), dir.path(), &[]);
    play_and_check("helm template demo-app", &rendered, "/data");
}

#[test]
#[ignore = "needs podman, runc and the static binary: source .ci/containers.sh and .ci/static.sh, then --include-ignored"]
fn statefulset_example_pod_runs_under_podman() {
    containers::require();
    play_and_check("examples/statefulset.yaml", &k8s::read("examples/statefulset.yaml"), "/data");
}

#[test]
#[ignore = "needs podman, runc, kubectl (source .ci/containers.sh, .ci/static.sh and .ci/k8s-tools.sh, then --include-ignored)"]
fn kustomize_overlay_pod_runs_under_podman() {
    containers::require();
    let kubectl = tool("VOLPREP_KUBECTL");
    let rendered = ok(Command::new(kubectl).arg("kustomize").arg(Path::new(ROOT).join("examples/kustomize/overlay")));
    play_and_check("kubectl kustomize examples/kustomize/overlay", &rendered, "/data");
}

// ---------------------------------------------------------------------------------------------
// Air-gapped delivery

/// A mirror on 127.0.0.1: the image (skopeo, digests kept) and the charts (helm package, helm
/// push oci://) go in; then, from an empty image store and an empty helm home, the chart is
/// pulled by version and the image by digest, the chart rendered with the mirror and the digest
/// as values, and the pod played from what was pulled.
#[test]
#[ignore = "needs podman, skopeo, docker-registry, helm (source .ci/containers.sh, .ci/static.sh and .ci/k8s-tools.sh, then --include-ignored)"]
fn air_gapped_mirror_by_digest() {
    containers::require();
    let helm = tool("VOLPREP_HELM");
    let image = containers::image();
    let registry = containers::Registry::start();
    let reg = registry.addr.clone();
    let dir = tempfile::tempdir().unwrap();

    // Push: the image by its layout (digests preserved), the charts as OCI artifacts.
    ok(Command::new("skopeo")
        .args(["copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:{}", image.layout.display(), image.version))
        .arg(format!("docker://{reg}/volprep:{}", image.version)));
    let pushed = ok(Command::new("skopeo")
        .args(["inspect", "--tls-verify=false", "--format", "{{.Digest}}"])
        .arg(format!("docker://{reg}/volprep:{}", image.version)));
    assert_eq!(pushed.trim(), image.digest, "the mirror serves the digest that was built");
    let home = dir.path().join("helm-push");
    let charts = dir.path().join("charts");
    render_demo(&home, &charts, &[]);
    for chart in ["volprep", "demo-app"] {
        ok(k8s::helm(&helm, &home).arg("package").arg(charts.join(chart)).arg("-d").arg(dir.path()));
        let tgz = dir.path().join(format!("{chart}-0.1.0.tgz"));
        ok(k8s::helm(&helm, &home).arg("push").arg(&tgz).arg(format!("oci://{reg}/charts")).arg("--plain-http"));
    }

    // Pull, from nothing: a fresh helm home, a fresh image store.
    let clean_home = dir.path().join("helm-clean");
    let pulled = dir.path().join("pulled");
    for chart in ["volprep", "demo-app"] {
        ok(k8s::helm(&helm, &clean_home)
            .args([
                "pull",
                &format!("oci://{reg}/charts/{chart}"),
                "--version",
                "0.1.0",
                "--plain-http",
                "--untar",
                "-d",
            ])
            .arg(&pulled));
    }
    let store = dir.path().join("store");
    fs::create_dir_all(store.join("graph")).unwrap();
    fs::write(
        store.join("storage.conf"),
        format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            store.join("graph").display(),
            store.join("run").display()
        ),
    )
    .unwrap();
    fs::write(
        store.join("registries.conf"),
        format!("unqualified-search-registries = []\n[[registry]]\nlocation = \"{reg}\"\ninsecure = true\n"),
    )
    .unwrap();
    let clean = |cmd: &mut Command| {
        cmd.env("CONTAINERS_STORAGE_CONF", store.join("storage.conf"))
            .env("CONTAINERS_REGISTRIES_CONF", store.join("registries.conf"));
    };
    let by_digest = format!("{reg}/volprep@{}", image.digest);
    let mut images = podman();
    clean(&mut images);
    assert_eq!(ok(images.args(["images", "-q"])).trim(), "", "the clean store is empty");
    let mut pull = podman();
    clean(&mut pull);
    ok(pull.args(["pull", "--quiet", &by_digest]));

    // Render the pulled chart with the mirror and the digest, as values.
    let values = [
        format!("volumePermissions.image.registry={reg}"),
        "volumePermissions.image.repository=volprep".to_string(),
        format!("volumePermissions.image.tag={}", image.version),
        format!("volumePermissions.image.digest={}", image.digest),
    ];
    let mut template = k8s::helm(&helm, &clean_home);
    template.args(["template", "demo"]).arg(pulled.join("demo-app"));
    for v in &values {
        template.args(["--set", v]);
    }
    let rendered = ok(&mut template);
    let docs = k8s::docs(&rendered);
    let sts = docs.iter().find(|d| d["kind"] == "StatefulSet").expect("StatefulSet");
    let init = &k8s::pod_spec(sts)["initContainers"][0];
    let want = format!("{reg}/volprep:{}@{}", image.version, image.digest);
    assert_eq!(init["image"].as_str(), Some(want.as_str()), "the init container pins the digest");

    // Run what was pulled: the init container's image, from the clean store, by digest.
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let outside = outside_dir();
    app_volume(fs.path(), outside.path());
    let before = snapshot(fs.path());
    let volprep = volprep_of(k8s::pod_spec(sts), "the pulled chart");
    let tmp = empty_dir();
    let mounts = [(fs.path().to_path_buf(), "/data"), (tmp.path().to_path_buf(), "/tmp")];
    let mut run = containers::init_container_command(&volprep.sc, &mounts);
    clean(&mut run);
    run.arg("--pull=never").arg(&volprep.image).args(&volprep.args);
    let out = containers::output(&mut run);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_prepared(&before, &snapshot(fs.path()), 1000, "pulled image");
    k8s::say(&format!("mirror {reg}: pushed and pulled volprep@{} and charts volprep, demo-app 0.1.0", image.digest));
}
