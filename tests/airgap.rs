//! The operations guide's commands, run as written: the air-gap block of docs/operations.md
//! (image and library chart mirrored, a user chart depending on the mirrored chart, rendered
//! with the image pinned by digest and a pull secret) against Debian's docker-registry on
//! 127.0.0.1, and its `podman run` line on a directory.
//!
//! Both need podman, skopeo, docker-registry, helm and the static binary: `#[ignore]`d in a plain
//! `cargo test`; `.ci/run` runs them with `--include-ignored`, where they fail if they can't run.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::containers::{self, ok, podman};
use common::k8s::{self, ROOT};

/// The fenced block after `<!-- MARK -->` in docs/operations.md.
fn doc_block(mark: &str) -> String {
    block_in("docs/operations.md", mark)
}

/// The fenced block after `<!-- MARK -->` in `file` (relative to the checkout).
fn block_in(file: &str, mark: &str) -> String {
    let doc = k8s::read(file);
    let at = doc.find(&format!("<!-- {mark} -->\n```sh\n")).unwrap_or_else(|| panic!("{file}: {mark}"));
    let body = &doc[at..];
    let body = &body[body.find("```sh\n").unwrap() + "```sh\n".len()..];
    body[..body.find("\n```").expect("end of block")].to_string() + "\n"
}

fn tool(var: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(var).unwrap_or_else(|| panic!("{var} is not set: source .ci/k8s-tools.sh")))
}

/// A `helm` that adds `--plain-http` to the commands that talk to a registry, and a `skopeo`
/// that turns TLS verification off (the local registry has no TLS), in `dir`, which must come
/// first on PATH.
fn shims(dir: &Path, helm: &Path) {
    let skopeo = dir.join("skopeo");
    fs::write(
        &skopeo,
        "#!/bin/sh\nPATH=\"${PATH#*:}\"\ncmd=\"$1\"; shift\ncase \"$cmd\" in\n  copy) exec skopeo copy --dest-tls-verify=false \"$@\" ;;\n  inspect) exec skopeo inspect --tls-verify=false \"$@\" ;;\nesac\nexec skopeo \"$cmd\" \"$@\"\n",
    )
    .unwrap();
    fs::set_permissions(&skopeo, fs::Permissions::from_mode(0o755)).unwrap();
    let shim = dir.join("helm");
    fs::write(
        &shim,
        format!(
            "#!/bin/sh\ncase \"$1\" in push|pull|dependency) exec '{}' \"$@\" --plain-http ;; esac\nexec '{}' \"$@\"\n",
            helm.display(),
            helm.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&shim, fs::Permissions::from_mode(0o755)).unwrap();
}

/// What the outside step carries in (the image as an OCI archive, the packaged chart) in a work
/// dir, next to a registry to mirror into and helm's own directories.
struct AirGap {
    helm: PathBuf,
    image: &'static containers::Image,
    registry: containers::Registry,
    dir: tempfile::TempDir,
}

/// How a block's `helm` and `skopeo` talk to the plain-HTTP test registry.
#[derive(Clone, Copy, PartialEq)]
enum Tls {
    /// As written (the plain-HTTP variant).
    AsWritten,
    /// Through `shims` (the TLS variant, whose commands expect TLS).
    Wrapped,
}

impl AirGap {
    fn new() -> AirGap {
        containers::require();
        let helm = tool("VOLPREP_HELM");
        let image = containers::image();
        let registry = containers::Registry::start();
        let dir = tempfile::tempdir().unwrap();
        let air = AirGap { helm, image, registry, dir };
        fs::create_dir_all(air.work()).unwrap();
        air.carry();
        air
    }

    /// The README's two lines that make the files to carry in, as written, in a work dir that
    /// looks like the checkout after `.ci/image.sh image`: `image` (the layout the tests built)
    /// and `examples`.
    fn carry(&self) {
        let work = self.work();
        std::os::unix::fs::symlink(&self.image.layout, work.join("image")).unwrap();
        std::os::unix::fs::symlink(Path::new(ROOT).join("examples"), work.join("examples")).unwrap();
        let block = block_in("README.md", "install carry: tested");
        let home = self.home();
        // The helm of the tests, as `helm`, first on PATH.
        let bin = self.dir.path().join("bin");
        fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(&self.helm, bin.join("helm")).unwrap();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let mut cmd = Command::new("bash");
        cmd.args(["-euo", "pipefail", "-c", &block]).current_dir(&work).env("PATH", path);
        cmd.env("HELM_CACHE_HOME", home.join("cache")).env("HELM_CONFIG_HOME", home.join("config"));
        let out = containers::output(cmd.env("HELM_DATA_HOME", home.join("data")));
        assert_ran(&out, &block, "the README's install carry block");
        for f in ["volprep-image.tar", "volprep-0.1.0.tgz"] {
            assert!(work.join(f).is_file(), "{f} after the README's block");
        }
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("helm-home")
    }

    /// The doc blocks `marks`, in order, in one `bash` (`-euo pipefail` when `strict`, else like
    /// lines pasted into a shell, which go on after a failed command) in the work dir, with
    /// `MIRROR` set to `mirror`.
    fn run(&self, marks: &[&str], tls: Tls, mirror: &str, strict: bool) -> (std::process::Output, String) {
        let block: String = marks.iter().map(|m| doc_block(m)).collect();
        // The helm of the tests, first on PATH (wrapped or not).
        let bin = self.dir.path().join(if tls == Tls::Wrapped { "shims" } else { "bin" });
        fs::create_dir_all(&bin).unwrap();
        match tls {
            Tls::Wrapped => shims(&bin, &self.helm),
            Tls::AsWritten => {
                let link = bin.join("helm");
                if !link.exists() {
                    std::os::unix::fs::symlink(&self.helm, link).unwrap();
                }
            }
        }
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let home = self.home();
        let mut cmd = Command::new("bash");
        if strict {
            cmd.args(["-euo", "pipefail"]);
        }
        cmd.args(["-c", &block])
            .current_dir(self.work())
            .env("MIRROR", mirror)
            .env("PATH", path)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"));
        if tls == Tls::Wrapped {
            // The wrapped skopeo's registry: insecure, as the flags it adds say.
            let conf = self.dir.path().join("registries.conf");
            let reg = &self.registry.addr;
            let text =
                format!("unqualified-search-registries = []\n[[registry]]\nlocation = \"{reg}\"\ninsecure = true\n");
            fs::write(&conf, text).unwrap();
            cmd.env("CONTAINERS_REGISTRIES_CONF", conf);
        }
        (containers::output(&mut cmd), block)
    }

    /// The blocks ran: the mirror serves the digest that was built, the render pins it, with
    /// the pull secret, and the library chart came from the mirror.
    fn check_rendered(&self, what: &str) {
        let reg = &self.registry.addr;
        let work = self.work();
        let rendered = fs::read_to_string(work.join("my-app.yaml")).unwrap();
        let docs = k8s::docs(&rendered);
        let sts = docs.iter().find(|d| d["kind"] == "StatefulSet").expect("a StatefulSet");
        let spec = k8s::pod_spec(sts);
        let want = format!("{reg}/volprep/volprep:0.1.0@{}", self.image.digest);
        assert_eq!(spec["initContainers"][0]["image"].as_str(), Some(want.as_str()), "{what}: {rendered}");
        assert_eq!(spec["imagePullSecrets"][0]["name"].as_str(), Some("mirror-pull"), "{what}: {rendered}");
        assert_eq!(k8s::strs(&spec["securityContext"]["supplementalGroups"]), ["1000"], "{what}: {rendered}");
        assert!(
            work.join("my-app/charts/volprep-0.1.0.tgz").is_file(),
            "{what}: the library chart pulled from the mirror"
        );
        k8s::check_volprep_pod(spec, what);
        k8s::say(&format!("{what}: mirror {reg}, {want}, pull secret mirror-pull"));
    }
}

/// Panics with the block and its output unless it succeeded.
fn assert_ran(out: &std::process::Output, block: &str, what: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed:\n{block}\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
    k8s::say(stdout.trim_end());
}

/// The TLS variant: the first block (its `helm` and `skopeo` wrapped for the plain-HTTP test
/// registry) and the chart block.
#[test]
#[ignore = "needs podman, skopeo, docker-registry, helm (source .ci/containers.sh, .ci/static.sh and .ci/k8s-tools.sh, then --include-ignored)"]
fn air_gap_commands_of_the_operations_guide_run_as_written() {
    let air = AirGap::new();
    let (out, block) = air.run(&["air-gap: tested", "air-gap chart: tested"], Tls::Wrapped, &air.registry.addr, true);
    assert_ran(&out, &block, "the air-gap blocks");
    air.check_rendered("air gap");
}

/// The plain-HTTP variant and the chart block exactly as written, against a registry without
/// TLS; and pasted into a shell that does not stop on errors, with a mirror that serves
/// nothing, the block stops at the empty digest (no chart is made with an unpinned image).
#[test]
#[ignore = "needs podman, skopeo, docker-registry, helm (source .ci/containers.sh, .ci/static.sh and .ci/k8s-tools.sh, then --include-ignored)"]
fn air_gap_plain_http_commands_run_as_written_and_stop_without_a_digest() {
    let air = AirGap::new();
    let blocks = ["air-gap plain-http: tested", "air-gap chart: tested"];
    let (out, block) = air.run(&blocks, Tls::AsWritten, &air.registry.addr, true);
    assert_ran(&out, &block, "the plain-HTTP air-gap blocks");
    air.check_rendered("air gap, plain HTTP");

    fs::remove_dir_all(air.work().join("my-app")).unwrap();
    fs::remove_file(air.work().join("my-app.yaml")).unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let (out, block) = air.run(&blocks, Tls::AsWritten, &closed, false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ran on without a digest:\n{block}\n{stderr}");
    assert!(stderr.contains("DIGEST: no digest from the mirror"), "{stderr}");
    assert!(!air.work().join("my-app").exists(), "nothing after the digest line ran:\n{stderr}");
}

#[test]
#[ignore = "needs podman, runc and the static binary: source .ci/containers.sh and .ci/static.sh, then --include-ignored"]
fn podman_run_line_of_the_operations_guide_prepares_a_directory() {
    containers::require();
    let image = containers::image();
    // The guide names the published image: tag the local build so.
    ok(podman().args(["tag", &image.tag, "ghcr.io/volprep/volprep:0.1.0"]));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    fs::create_dir_all(data.join("sub")).unwrap();
    fs::write(data.join("sub/f"), b"x").unwrap();
    let block = doc_block("podman-run: tested").replace("/srv/data", &data.display().to_string());
    let out = containers::output(Command::new("bash").args(["-euo", "pipefail", "-c", &block]));
    assert!(
        out.status.success(),
        "{block}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for p in [data.clone(), data.join("sub"), data.join("sub/f")] {
        let m = fs::metadata(&p).unwrap();
        assert_eq!(m.gid(), 2000, "{}", p.display());
    }
    assert_eq!(fs::metadata(data.join("sub/f")).unwrap().mode() & 0o660, 0o660);
}

/// A figure "about N MB" that follows `what` in docs/operations.md, in bytes.
fn documented_mb(doc: &str, what: &str) -> f64 {
    let at = doc.find(what).unwrap_or_else(|| panic!("docs/operations.md: {what:?}"));
    let n = doc[at + what.len()..].split_whitespace().next().unwrap();
    n.parse::<f64>().unwrap_or_else(|_| panic!("{what:?} {n:?}")) * 1e6
}

/// The sizes docs/operations.md and the README give are those of the image this commit builds (within 5 %).
#[test]
#[ignore = "needs buildah, skopeo and the static binary: source .ci/containers.sh and .ci/static.sh, then --include-ignored"]
fn documented_sizes_match_the_build() {
    containers::require();
    let image = containers::image();
    let words: Vec<&str> = image.line.split_whitespace().collect();
    let binary: f64 = words[words.iter().position(|w| *w == "binary").unwrap() + 1].parse().unwrap();
    let doc = k8s::read("docs/operations.md");
    for (what, built) in [("The binary is about", binary), ("the image about", image.compressed as f64)] {
        let said = documented_mb(&doc, what);
        assert!(
            (said - built).abs() / built < 0.05,
            "docs/operations.md: {what} {said} bytes, built {built}: {}",
            image.line
        );
    }
    // Whitespace collapsed: the README wraps its lines.
    let readme = k8s::read("README.md").split_whitespace().collect::<Vec<_>>().join(" ");
    let said = format!("{:.1} MB compressed", image.compressed as f64 / 1e6);
    assert!(readme.contains(&said), "README.md should say {said:?}: {}", image.line);
}
