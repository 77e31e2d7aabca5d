//! The static binary the Dockerfile ships (built by `.ci/static.sh`, path in
//! VOLPREP_STATIC_BIN): no ELF interpreter, no shared libraries, small, and it works where a
//! container runtime puts a FROM scratch image: an empty root holding only the binary, the
//! volume and /proc. No libc, no /etc, no shell.
//!
//! The tests of the binary are `#[ignore = "needs the static binary ..."]` in a plain `cargo
//! test` and fail when run without it (`.ci/run` sources `.ci/static.sh` and runs them with
//! `--include-ignored`). The chroot tests also need root, and fail without it, naming it.

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::ffi::CString;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The image is meant to stay under 5 MB; the binary is all of it.
const MAX_SIZE: u64 = 5 * 1000 * 1000;

/// The capabilities the manifests give the volprep init container (examples/statefulset.yaml):
/// CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID (linux/capability.h numbers).
const MANIFEST_CAPS: &[u32] = &[0, 1, 3, 4];

/// Writes past libtest's output capture, so the size shows in a plain `cargo test`.
fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// The static binary; the tests that use it are ignored in a plain `cargo test`, and fail when
/// run without it.
fn static_bin(test: &str) -> PathBuf {
    match std::env::var_os("VOLPREP_STATIC_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => panic!("{test}: VOLPREP_STATIC_BIN is not set: source .ci/static.sh"),
    }
}

/// The static binary, for a test that runs it chrooted into an empty root: it needs root too,
/// and fails without it, naming what it needs.
fn chroot_bin(test: &str) -> PathBuf {
    let bin = static_bin(test);
    assert!(rustix::process::geteuid().is_root(), "{test}: cannot run: needs root (chroot, mount)");
    bin
}

// ---------------------------------------------------------------------------------------------
// ELF

/// What the program headers say about linking.
#[derive(Debug, PartialEq)]
struct Linking {
    /// PT_INTERP: the dynamic loader the kernel would start first.
    interpreter: Option<String>,
    /// DT_NEEDED entries of PT_DYNAMIC (a static-pie has PT_DYNAMIC but needs nothing).
    needed: usize,
}

fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap()) as usize
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Parses an x86_64 ELF64 little-endian executable's program headers.
fn elf_linking(bin: &[u8]) -> Linking {
    assert!(bin.len() > 64 && &bin[..4] == b"\x7fELF", "not an ELF file");
    assert_eq!(bin[4], 2, "ELFCLASS64");
    assert_eq!(bin[5], 1, "little endian");
    assert!(matches!(u16_at(bin, 16), 2 | 3), "ET_EXEC or ET_DYN (static-pie)");
    assert_eq!(u16_at(bin, 18), 62, "EM_X86_64");
    let (phoff, phentsize, phnum) = (u64_at(bin, 32) as usize, u16_at(bin, 54), u16_at(bin, 56));
    let mut linking = Linking { interpreter: None, needed: 0 };
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let p_type = u32::from_le_bytes(bin[ph..ph + 4].try_into().unwrap());
        let (offset, filesz) = (u64_at(bin, ph + 8) as usize, u64_at(bin, ph + 32) as usize);
        let data = &bin[offset..offset + filesz];
        match p_type {
            3 => linking.interpreter = Some(String::from_utf8_lossy(data).trim_end_matches('\0').to_owned()),
            2 => {
                for entry in data.chunks_exact(16) {
                    match u64_at(entry, 0) {
                        0 => break,
                        1 => linking.needed += 1,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    linking
}

#[test]
fn elf_parser_sees_the_interpreter_of_a_dynamic_binary() {
    // This test binary is linked dynamically (no crt-static for tests): the parser must see it.
    let me = fs::read(std::env::current_exe().unwrap()).unwrap();
    let linking = elf_linking(&me);
    assert!(linking.interpreter.as_deref().is_some_and(|i| i.contains("ld-linux")), "{linking:?}");
    assert!(linking.needed > 0, "{linking:?}");
}

#[test]
#[ignore = "needs the static binary: source .ci/static.sh"]
fn static_binary_has_no_interpreter_and_no_shared_libraries() {
    let bin = static_bin("static_binary_has_no_interpreter_and_no_shared_libraries");
    let bytes = fs::read(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    assert_eq!(elf_linking(&bytes), Linking { interpreter: None, needed: 0 }, "{}", bin.display());
    let size = bytes.len() as u64;
    say(&format!("static volprep: {size} bytes ({:.2} MB), stripped, {}", size as f64 / 1e6, bin.display()));
    assert!(size < MAX_SIZE, "static binary is {size} bytes, over {MAX_SIZE}");
}

// ---------------------------------------------------------------------------------------------
// Empty chroot

/// A root holding only /volprep, an empty /proc (mounted by `run_in_chroot`) and /vol: an app's
/// volume with private directories and files of uid 1000.
struct Root {
    dir: tempfile::TempDir,
}

impl Root {
    fn new(bin: &Path) -> Root {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
        fs::copy(bin, root.join("volprep")).expect("copy the binary");
        fs::set_permissions(root.join("volprep"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::create_dir(root.join("proc")).unwrap();
        let vol = root.join("vol");
        for d in ["", "app", "app/private", "app/private/deep", "shared"] {
            fs::create_dir_all(vol.join(d)).unwrap();
        }
        for f in ["app/state.db", "app/private/key", "app/private/deep/log", "shared/readme"] {
            fs::write(vol.join(f), f).unwrap();
        }
        std::os::unix::fs::symlink("../shared", vol.join("app/link")).unwrap();
        for (path, mode) in [
            ("", 0o755),
            ("app", 0o750),
            ("app/private", 0o700),
            ("app/private/deep", 0o700),
            ("shared", 0o755),
            ("app/state.db", 0o600),
            ("app/private/key", 0o600),
            ("app/private/deep/log", 0o640),
            ("shared/readme", 0o644),
        ] {
            fs::set_permissions(vol.join(path), fs::Permissions::from_mode(mode)).unwrap();
        }
        for entry in Root::entries(&vol) {
            std::os::unix::fs::lchown(&entry, Some(1000), Some(1000)).unwrap();
        }
        Root { dir }
    }

    fn vol(&self) -> PathBuf {
        self.dir.path().join("vol")
    }

    fn entries(dir: &Path) -> Vec<PathBuf> {
        let mut out = vec![dir.to_path_buf()];
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.symlink_metadata().unwrap().is_dir() {
                out.extend(Root::entries(&p));
            } else {
                out.push(p);
            }
        }
        out
    }

    /// Runs /volprep ARGS chrooted into the root, in a private mount namespace with /proc
    /// mounted, with an empty environment; `caps`: the bounding set to keep (None: all).
    fn run(&self, args: &[&str], caps: Option<&[u32]>) -> Output {
        let root = CString::new(self.dir.path().as_os_str().as_encoded_bytes()).unwrap();
        let proc_dir = CString::new(self.dir.path().join("proc").as_os_str().as_encoded_bytes()).unwrap();
        let last_cap: u32 =
            fs::read_to_string("/proc/sys/kernel/cap_last_cap").map(|s| s.trim().parse().unwrap()).unwrap_or(40);
        let drop: Vec<u32> = match caps {
            Some(keep) => (0..=last_cap).filter(|c| !keep.contains(c)).collect(),
            None => Vec::new(),
        };
        let mut cmd = Command::new("/volprep");
        cmd.args(args).env_clear();
        // SAFETY: the closure runs in the child between fork and exec and makes only
        // async-signal-safe calls (unshare, mount, chroot, chdir, prctl) on data allocated before
        // the fork.
        unsafe {
            cmd.pre_exec(move || {
                let check = |ret: libc::c_int| {
                    if ret < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
                };
                check(libc::unshare(libc::CLONE_NEWNS))?;
                check(libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                check(libc::mount(
                    c"proc".as_ptr(),
                    proc_dir.as_ptr(),
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                ))?;
                check(libc::chroot(root.as_ptr()))?;
                check(libc::chdir(c"/".as_ptr()))?;
                if !drop.is_empty() {
                    // What a container runtime does for `capabilities: drop [ALL], add [...]`
                    // and `allowPrivilegeEscalation: false`: root's caps after exec are the
                    // bounding set (the inheritable and ambient sets are empty).
                    for &cap in &drop {
                        check(libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0))?;
                    }
                    check(libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0))?;
                    check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
                }
                Ok(())
            });
        }
        // ETXTBSY: another test thread forked while the binary's copy was still open for
        // writing here, and its child holds that fd until it execs; it goes away at once.
        for _ in 0..50 {
            match cmd.output() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                other => return other.expect("run /volprep in the chroot"),
            }
        }
        cmd.output().expect("run /volprep in the chroot")
    }
}

/// Ok when volprep exited 0 and every entry of /vol (symlinks aside) has group `gid`, g+rw,
/// and, for directories, g+xs; the owner stays 1000.
fn prepared(root: &Root, gid: u32, out: &Output) -> Result<(), String> {
    let log = format!(
        "--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(format!("volprep apply in an empty chroot: {}\n{log}", out.status));
    }
    for entry in Root::entries(&root.vol()) {
        let md = entry.symlink_metadata().unwrap();
        if md.file_type().is_symlink() {
            continue;
        }
        let mode = md.mode() & 0o7777;
        let want_mode = if md.is_dir() { 0o2070 } else { 0o060 };
        if md.gid() != gid || md.uid() != 1000 || mode & want_mode != want_mode {
            return Err(format!(
                "{}: {}:{} mode {mode:o}, want group {gid}, owner 1000, mode bits {want_mode:o}\n{log}",
                entry.display(),
                md.uid(),
                md.gid()
            ));
        }
    }
    Ok(())
}

/// The shipped binary has no test hooks: the variables that make a test build kill, stop or
/// panic itself are not in it, and setting them changes nothing (a build with the hooks would
/// refuse both set at once with exit 2, or die at the first entry).
#[test]
#[ignore = "needs the static binary: source .ci/static.sh"]
fn the_shipped_binary_has_no_test_hooks() {
    let bin = static_bin("the_shipped_binary_has_no_test_hooks");
    let bytes = fs::read(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    assert!(!bytes.windows(b"VOLPREP_TEST_".len()).any(|w| w == b"VOLPREP_TEST_"), "{}", bin.display());
    let vol = tempfile::tempdir().unwrap();
    fs::write(vol.path().join("f"), b"x").unwrap();
    fs::set_permissions(vol.path().join("f"), fs::Permissions::from_mode(0o600)).unwrap();
    // SAFETY: getegid has no preconditions.
    let gid = unsafe { libc::getegid() };
    for (var, value) in [("VOLPREP_TEST_KILL_AFTER", "1"), ("VOLPREP_TEST_KILL_AFTER", "1:stop")] {
        let out = Command::new(&bin)
            .args(["check", "--fs-group", &gid.to_string()])
            .arg(vol.path())
            .env(var, value)
            .env("VOLPREP_TEST_PANIC_AFTER", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{var}={value}: check runs to its end (3: would change)\n{stderr}");
        assert!(!stderr.contains("test hook"), "{stderr}");
    }
}

#[test]
#[ignore = "needs root and the static binary: source .ci/static.sh"]
fn static_binary_runs_in_an_empty_chroot() {
    let bin = chroot_bin("static_binary_runs_in_an_empty_chroot");
    let root = Root::new(&bin);
    let out = root.run(&["apply", "--fs-group", "2000", "/vol"], None);
    prepared(&root, 2000, &out).unwrap_or_else(|e| panic!("{e}"));
    // Nothing left to do: check agrees (exit 0, not 3).
    let again = root.run(&["check", "--fs-group", "2000", "/vol"], None);
    assert_eq!(again.status.code(), Some(0), "check after apply: {}", String::from_utf8_lossy(&again.stderr));
}

/// The four capabilities the manifests add are enough: volprep, root in an empty chroot with
/// every other capability dropped and no_new_privs set (as under the example pod spec),
/// prepares a volume of another user's private directories, setgid bits included.
#[test]
#[ignore = "needs root and the static binary: source .ci/static.sh"]
fn static_binary_needs_only_the_manifest_capabilities() {
    let bin = chroot_bin("static_binary_needs_only_the_manifest_capabilities");
    let root = Root::new(&bin);
    let out = root.run(&["apply", "--fs-group", "3000", "/vol"], Some(MANIFEST_CAPS));
    prepared(&root, 3000, &out).unwrap_or_else(|e| panic!("{e}"));
}

/// True when the volume root holds a `done` marker.
fn marker_done(vol: &Path) -> bool {
    let path = CString::new(vol.as_os_str().as_encoded_bytes()).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: `path` and the name are valid C strings; `buf` has room for `buf.len()` bytes.
    let n = unsafe { libc::lgetxattr(path.as_ptr(), c"user.volprep".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    n > 0 && String::from_utf8_lossy(&buf[..n as usize]).contains(r#""state":"done""#)
}

/// Each of the four is needed: without it, the same run fails or leaves the volume wrong
/// (without FSETID the kernel silently drops the directories' setgid bit). DAC_READ_SEARCH
/// does not replace DAC_OVERRIDE: the marker xattr on the root needs write access.
#[test]
#[ignore = "needs root and the static binary: source .ci/static.sh"]
fn static_binary_fails_without_each_manifest_capability() {
    let bin = chroot_bin("static_binary_fails_without_each_manifest_capability");
    const CAP_DAC_READ_SEARCH: u32 = 2;
    for &missing in MANIFEST_CAPS {
        let mut caps: Vec<u32> = MANIFEST_CAPS.iter().copied().filter(|&c| c != missing).collect();
        if missing == 1 {
            caps.push(CAP_DAC_READ_SEARCH);
        }
        let root = Root::new(&bin);
        let out = root.run(&["apply", "--fs-group", "3000", "/vol"], Some(&caps));
        // Prepared and marked done: with DAC_READ_SEARCH instead of DAC_OVERRIDE the entries
        // are fixed, but the marker can't be written (a warning), so every start walks again.
        let fully = prepared(&root, 3000, &out).is_ok() && marker_done(&root.vol());
        assert!(
            !fully,
            "capability {missing} dropped (kept {caps:?}): the volume was still fully prepared and marked done, so the manifests add more than needed"
        );
    }
}

/// A setgid file of another group, the only entry that needs a change: without CAP_FSETID the
/// chown clears its setgid bit and the chmod cannot set it back (the kernel drops S_ISGID when
/// the caller is not in the group), as for a directory. That is an error naming the capability,
/// with the changes that did happen counted, and no `done`; with the manifest's capabilities the
/// file keeps the bit, as the kubelet's pass leaves it.
#[test]
#[ignore = "needs root and the static binary: source .ci/static.sh"]
fn a_setgid_file_of_another_group_without_fsetid_is_an_error_naming_it() {
    let bin = chroot_bin("a_setgid_file_of_another_group_without_fsetid_is_an_error_naming_it");
    const GID: u32 = 3000;
    let without_fsetid: Vec<u32> = MANIFEST_CAPS.iter().copied().filter(|&c| c != 4).collect();
    for caps in [&without_fsetid[..], MANIFEST_CAPS] {
        let root = Root::new(&bin);
        let vol = root.vol();
        // Everything conforms already but one file: 1000:33, 2755.
        for entry in Root::entries(&vol) {
            let md = entry.symlink_metadata().unwrap();
            std::os::unix::fs::lchown(&entry, None, Some(GID)).unwrap();
            if md.file_type().is_symlink() {
                continue;
            }
            let mask = if md.is_dir() { 0o2770 } else { 0o660 };
            fs::set_permissions(&entry, fs::Permissions::from_mode(md.mode() & 0o7777 | mask)).unwrap();
        }
        let tool = vol.join("tool");
        fs::write(&tool, "#!/bin/true\n").unwrap();
        std::os::unix::fs::lchown(&tool, Some(1000), Some(33)).unwrap();
        fs::set_permissions(&tool, fs::Permissions::from_mode(0o2755)).unwrap();

        let out =
            root.run(&["apply", "--log-format=json", "--report=-", "--fs-group", &GID.to_string(), "/vol"], Some(caps));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let ctx = format!(
            "kept capabilities {caps:?}\n--- stderr\n{stderr}\n--- stdout\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let md = tool.symlink_metadata().unwrap();
        let summary: serde_json::Value = stderr
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["action"] == "walked")
            .unwrap_or_else(|| panic!("no summary; {ctx}"));
        let counted = (summary["changed_group"].as_u64(), summary["changed_mode"].as_u64(), summary["errors"].as_u64());
        assert_eq!(counted, (Some(1), Some(1), Some(u64::from(caps == &without_fsetid[..]))), "{ctx}");
        if caps == &without_fsetid[..] {
            assert_eq!(out.status.code(), Some(1), "{ctx}");
            assert!(stderr.contains("missing capability CAP_FSETID"), "{ctx}");
            let report: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}; {ctx}"));
            let errors = &report["volumes"][0]["error_list"];
            assert_eq!(
                errors,
                &serde_json::json!([{"path": "/vol/tool", "op": "chmod", "errno": "EPERM", "error": "Operation not permitted (EPERM)"}]),
                "{ctx}"
            );
            assert_eq!((md.uid(), md.gid(), md.mode() & 0o7777), (1000, GID, 0o775), "what the kernel left; {ctx}");
            assert!(!marker_done(&vol), "{ctx}");
        } else {
            assert_eq!(out.status.code(), Some(0), "{ctx}");
            assert_eq!((md.uid(), md.gid(), md.mode() & 0o7777), (1000, GID, 0o2775), "{ctx}");
            assert!(marker_done(&vol), "{ctx}");
        }
    }
}
