//! Container helpers of tests/container.rs: the gate (`.ci/containers.sh` sets the podman
//! configuration and VOLPREP_CONTAINERS), the image built once per test process by
//! `.ci/image.sh`, the busybox probe image, podman and a local registry.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

use super::k8s::{ROOT, describe};
pub use super::k8s::{output, run_ok as ok};

/// Panics with how to get the tools unless `.ci/containers.sh` configured this environment.
pub fn require() {
    assert!(
        std::env::var_os("VOLPREP_CONTAINERS").is_some_and(|v| v == "1"),
        "container test: source .ci/containers.sh (podman, buildah, skopeo, runc, docker-registry) first"
    );
    assert!(
        std::env::var_os("VOLPREP_STATIC_BIN").is_some_and(|v| !v.is_empty()),
        "container test: source .ci/static.sh (the static binary the image ships) first"
    );
    assert_eq!(rustix::process::geteuid().as_raw(), 0, "container test: needs root (rootful podman, loop mounts)");
}

pub fn podman() -> Command {
    Command::new("podman")
}

/// The image `.ci/image.sh` built: local tag, digest of its OCI layout, sizes.
#[derive(Debug, Clone)]
pub struct Image {
    pub tag: String,
    pub digest: String,
    /// Config and layers as a registry stores them (gzip), bytes.
    pub compressed: u64,
    /// The OCI layout (`oci:DIR:VERSION`).
    pub layout: PathBuf,
    pub version: String,
    /// The line `.ci/image.sh` printed.
    pub line: String,
}

/// Runs `.ci/image.sh OUT TAG` and reads what it printed.
pub fn build_image(out: &Path, tag: &str) -> Image {
    let line = ok(Command::new("bash").arg(Path::new(ROOT).join(".ci/image.sh")).arg(out).arg(tag));
    let line = line.lines().last().unwrap_or("").to_string();
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |w: &str| words.iter().position(|x| *x == w).map(|i| words[i + 1].to_string());
    let digest = after("digest").unwrap_or_else(|| panic!("no digest in {line:?}"));
    let compressed = after("size").and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no size in {line:?}"));
    let version = tag.rsplit(':').next().unwrap_or("").to_string();
    let version = if version.chars().next().is_some_and(|c| c.is_ascii_digit()) { version } else { "0.1.0".into() };
    Image { tag: tag.to_string(), digest, compressed, layout: out.to_path_buf(), version, line }
}

/// The volprep image, built once per test process (localhost/volprep:VERSION).
pub fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = scratch_dir("image-a");
        let version = cargo_version();
        build_image(&dir, &format!("localhost/volprep:{version}"))
    })
}

/// The crate's version, from Cargo.toml.
pub fn cargo_version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// A directory for build output that lives as long as the test process (under target/).
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("container-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The app stand-in: Debian's busybox-static alone in a FROM scratch image, its applets linked
/// into /bin, built once per process (localhost/volprep-probe:busybox).
pub fn probe_image() -> &'static str {
    static PROBE: OnceLock<String> = OnceLock::new();
    PROBE.get_or_init(|| {
        let tag = "localhost/volprep-probe:busybox".to_string();
        let ctx = scratch_dir("probe");
        std::fs::copy("/bin/busybox", ctx.join("busybox")).expect("copy /bin/busybox (busybox-static)");
        std::fs::write(
            ctx.join("Containerfile"),
            "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nENTRYPOINT [\"/bin/sh\"]\n",
        )
        .unwrap();
        ok(Command::new("buildah")
            .args(["bud", "--quiet", "--isolation", "chroot", "--pull=never", "--timestamp", "0", "-t", &tag])
            .arg(&ctx));
        tag
    })
}

/// Who a container runs as and what it may do, as the kubelet hands it to the runtime: the
/// resolved `runAsUser` and `runAsGroup`, the pod's `supplementalGroups`, and the capabilities
/// added back after `drop: [ALL]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurityContext {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub caps: Vec<String>,
}

/// `podman run --rm` with an init container's securityContext of the examples: `sc`'s user,
/// groups and capabilities (every other one dropped), a read-only root filesystem (and no
/// writable tmpfs), no-new-privileges, no network; `mounts` as volumes. The image and its args
/// are the caller's to add.
pub fn init_container_command(sc: &SecurityContext, mounts: &[(PathBuf, &str)]) -> Command {
    let mut cmd = podman();
    cmd.args(["run", "--rm", "--network=none", "--read-only", "--read-only-tmpfs=false"]);
    cmd.arg(format!("--user={}:{}", sc.uid, sc.gid));
    for gid in &sc.groups {
        cmd.arg(format!("--group-add={gid}"));
    }
    cmd.args(["--cap-drop=ALL", "--security-opt=no-new-privileges"]);
    for cap in &sc.caps {
        cmd.arg(format!("--cap-add={cap}"));
    }
    for (host, inside) in mounts {
        cmd.arg(format!("--volume={}:{inside}", host.display()));
    }
    cmd
}

/// Runs `image` with `args` under `sc` (see `init_container_command`).
pub fn run_as_init_container(image: &str, sc: &SecurityContext, mounts: &[(PathBuf, &str)], args: &[&str]) -> Output {
    output(init_container_command(sc, mounts).arg(image).args(args))
}

/// A Debian `docker-registry` on 127.0.0.1, its storage in a temp dir; killed on drop.
pub struct Registry {
    pub addr: String,
    child: Child,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry on a free port and waits until it answers `GET /v2/` with 200. The
    /// port is free when picked but another process may bind it before the registry does: the
    /// registry then exits (or someone else listens there), and it is started again on
    /// another port.
    pub fn start() -> Registry {
        let mut tries = Vec::new();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            match Registry::try_start(port) {
                Ok(reg) => return reg,
                Err(why) => tries.push(why),
            }
        }
        panic!("docker-registry did not start:\n{}", tries.join("\n"));
    }

    /// One start on `port`; `Err` when the registry exited (its log) or the port is someone
    /// else's.
    fn try_start(port: u16) -> Result<Registry, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let mut reg = Registry { addr, child, dir };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Some(status) = reg.child.try_wait().unwrap() {
                return Err(format!("on {}: {status}: {}", reg.addr, reg.log()));
            }
            if http_status(&reg.addr, "/v2/") == Some(200) {
                // A 200 from a registry another test started on the same port must not count.
                if listens(reg.child.id(), port) {
                    return Ok(reg);
                }
                return Err(format!("{} answered, but not from this registry: {}", reg.addr, reg.log()));
            }
            assert!(
                std::time::Instant::now() < deadline,
                "docker-registry did not answer GET /v2/ on {} within 30 s: {}",
                reg.addr,
                reg.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// What the registry logged.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

/// The status code of an HTTP/1.0 `GET path` to `addr`, if anything answered.
fn http_status(addr: &str, path: &str) -> Option<u16> {
    use std::io::{Read as _, Write as _};
    let timeout = Some(std::time::Duration::from_secs(2));
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(timeout).ok()?;
    s.set_write_timeout(timeout).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).ok()?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).ok()?;
    let line = String::from_utf8_lossy(&head[..n]).into_owned();
    line.strip_prefix("HTTP/1.")?.get(2..5)?.parse().ok()
}

/// Whether process `pid` holds a TCP socket listening on `port` (`/proc/net/tcp` names the
/// socket's inode, `/proc/PID/fd` the process's sockets).
fn listens(pid: u32, port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!(":{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 9 && f[1].ends_with(&local) && f[3] == "0A")
        .map(|f| format!("socket:[{}]", f[9]))
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .any(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for a container to exit; returns its exit code.
pub fn wait(container: &str) -> i32 {
    let out = ok(podman().args(["wait", container]));
    out.trim().parse().unwrap_or_else(|_| panic!("podman wait {container}: {out:?}"))
}

/// A container's logs (stdout and stderr).
pub fn logs(container: &str) -> String {
    let out = output(podman().args(["logs", container]));
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}
