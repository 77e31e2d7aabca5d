//! Getting the binary where `inject` runs (a CI runner, Argo CD's repo-server, an air-gapped
//! host), each way the README's Install section gives: `cargo install --locked --path .`, the
//! binary copied out of the image (`podman create` + `podman cp`), the release's static binary
//! and its checksum (.ci/release-binary.sh, what the release workflow runs), and the Argo CD
//! sidecar image with helm and volprep (examples/inject/argocd/Containerfile), which runs the
//! plugin as Argo CD does.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::containers;
use common::k8s::*;
use serde_norway::Value;

fn version_line() -> String {
    format!("volprep {}", env!("CARGO_PKG_VERSION"))
}

/// `cargo install --locked --path .`, into a temp root, offline (the dependencies are in
/// cargo's cache from the build that runs this test). Debug profile and its own target dir:
/// the same command, faster, and without the lock of the running build's target dir.
#[test]
#[ignore = "builds volprep from source again (a minute or two): --include-ignored"]
fn cargo_install_locked_path() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["install", "--locked", "--offline", "--debug", "--path", ROOT, "--root"]).arg(dir.path().join("root"));
    cmd.arg("--target-dir").arg(dir.path().join("target"));
    say(&format!("cargo_install_locked_path: {}", describe(&cmd)));
    run_ok(&mut cmd);
    let bin = dir.path().join("root/bin/volprep");
    assert_eq!(run_ok(Command::new(&bin).arg("--version")).trim(), version_line());
    let out = run_ok(
        Command::new(&bin)
            .args(["inject", "--emit", "patches"])
            .arg(Path::new(ROOT).join("tests/charts/official/atlantis.yaml")),
    );
    assert!(out.contains("path: /spec/template/spec/initContainers"), "{out}");
}

/// The binary copied out of the image: `podman create`, `podman cp`, `podman rm`.
#[test]
#[ignore = "needs podman, buildah and the static binary: source .ci/containers.sh and .ci/static.sh, then --include-ignored"]
fn binary_copied_out_of_the_image() {
    containers::require();
    let image = containers::image();
    let name = format!("volprep-copy-{}", std::process::id());
    let created = containers::ok(containers::podman().args(["create", "--name", &name, &image.tag]));
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("volprep");
    let cp = containers::output(containers::podman().args(["cp", &format!("{name}:/volprep")]).arg(&dest));
    let _ = containers::podman().args(["rm", "--force", &name]).output();
    assert!(cp.status.success() && !created.trim().is_empty(), "{}", String::from_utf8_lossy(&cp.stderr));
    assert_eq!(run_ok(Command::new(&dest).arg("--version")).trim(), version_line());
    assert_eq!(
        fs::read(&dest).unwrap(),
        fs::read(std::env::var("VOLPREP_STATIC_BIN").unwrap()).unwrap(),
        "the image's binary is the static build"
    );
}

/// The release's static binary and its checksum, as the release workflow makes them.
#[test]
#[ignore = "needs the static binary: source .ci/static.sh, then --include-ignored"]
fn release_binary_and_checksum() {
    assert!(std::env::var_os("VOLPREP_STATIC_BIN").is_some(), "source .ci/static.sh first");
    let dir = tempfile::tempdir().unwrap();
    let path = run_ok(Command::new("bash").arg(Path::new(ROOT).join(".ci/release-binary.sh")).arg(dir.path()));
    let bin = PathBuf::from(path.trim());
    let name = format!("volprep-{}-x86_64-linux", env!("CARGO_PKG_VERSION"));
    assert_eq!(bin, dir.path().join(&name));
    let sum = fs::read_to_string(dir.path().join(format!("{name}.sha256"))).unwrap();
    assert!(sum.ends_with(&format!("  {name}\n")) && sum.len() == 64 + 2 + name.len() + 1, "{sum}");
    run_ok(Command::new("sha256sum").arg("-c").arg(format!("{name}.sha256")).current_dir(dir.path()));
    assert_eq!(run_ok(Command::new(&bin).arg("--version")).trim(), version_line());
    let workflow = read(".github/workflows/release.yml");
    assert!(
        workflow.contains("bash .ci/release-binary.sh dist") && workflow.contains("gh release upload"),
        "the release workflow attaches them"
    );
}

/// The Argo CD sidecar image: built from examples/inject/argocd/Containerfile with local files
/// only (FROM scratch), then the plugin baked into it is run in it as Argo CD's cmp-server runs
/// it (its user 999, the app's directory as working directory, Argo CD's environment): init,
/// then generate prints the injected manifests of the test chart.
#[test]
#[ignore = "needs podman, buildah, busybox-static, helm and the static binary: source .ci/containers.sh, .ci/static.sh and .ci/k8s-tools.sh"]
fn argocd_sidecar_image_runs_the_plugin() {
    let test = "argocd_sidecar_image_runs_the_plugin";
    containers::require();
    let helm = tool("VOLPREP_HELM", test).unwrap();
    let tag = format!("localhost/volprep-argocd-cmp:{}", env!("CARGO_PKG_VERSION"));
    let mut build = Command::new("sh");
    build.arg(Path::new(ROOT).join("examples/inject/argocd/build-sidecar.sh")).arg(&tag);
    build.env("VOLPREP", std::env::var("VOLPREP_STATIC_BIN").unwrap()).env("HELM", &helm);
    say(&format!("{test}: {}", describe(&build)));
    run_ok(&mut build);
    let plugin: Value = serde_norway::from_str(&run_ok(containers::podman().args([
        "run",
        "--rm",
        "--network=none",
        &tag,
        "cat",
        "/home/argocd/cmp-server/config/plugin.yaml",
    ])))
    .unwrap();
    assert_eq!(plugin, serde_norway::from_str::<Value>(&read("examples/inject/argocd/plugin.yaml")).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("app");
    copy_dir(&Path::new(ROOT).join("tests/charts/thirdparty"), &app);
    run_ok(Command::new("chmod").args(["-R", "a+rwX"]).arg(dir.path()));
    let run = |step: &str, env: &[(&str, &str)]| {
        let mut cmd = containers::podman();
        cmd.args([
            "run",
            "--rm",
            "--network=none",
            "--read-only",
            "--tmpfs",
            "/tmp:mode=1777",
            "--user",
            "999:999",
            "-w",
            "/app",
        ]);
        cmd.arg("-v").arg(format!("{}:/app", app.display()));
        for (k, v) in argocd_env("rel", "apps", env) {
            cmd.arg("-e").arg(format!("{k}={v}"));
        }
        cmd.arg(&tag).args(cmp_step(&plugin, step));
        cmd
    };
    run_ok(&mut run("init", &[]));
    let mut generate = run("generate", &[("HELM_ARGS", "--set runner.enabled=false --set reader.enabled=false")]);
    say(&format!("{test}: {}", describe(&generate)));
    let text = run_ok(&mut generate);
    let all = docs(&text);
    let pg = all.iter().find(|d| d["kind"].as_str() == Some("StatefulSet")).expect("a StatefulSet");
    check_volprep_pod(pod_spec(pg), test);
    say(&format!(
        "{test}: {} documents; the StatefulSet's init container: {}",
        all.len(),
        serde_norway::to_string(&pod_spec(pg)["initContainers"][0]["args"]).unwrap()
    ));
    let refused = containers::output(&mut run("generate", &[]));
    assert_eq!(refused.status.code(), Some(5), "{}", String::from_utf8_lossy(&refused.stderr));
    let _ = containers::podman().args(["rmi", "--force", &tag]).output();
}
