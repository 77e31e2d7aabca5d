//! Deterministic tree shapes (same seed and size, same tree):
//!
//! - **atlantis**: a Terraform automation server's data volume: `bin/` (terraform binaries and
//!   one setuid helper), a provider `plugin-cache/`, and `repos/ORG/REPO/PR/default/` git
//!   checkouts, each with `.git/` (HEAD, config, index, refs, logs, 13 hook samples, packs and a
//!   `objects/XX/` fan-out of small read-only loose objects), Terraform modules and envs, and
//!   `.terraform/providers/...` symlinks into the plugin cache. Every 25th checkout shares three
//!   loose objects with the previous one by hard link (as `git clone --local` does).
//! - **flat**: one directory holding every other entry as a file.
//! - **deep**: chains of 300 nested directories, each level holding one file.
//!
//! Files are sparse (sized, no data blocks): every method here reads and writes metadata only.
//! Owners are mixed so every entry needs a change under `--fs-group 2000`: most are 100:100
//! with mode 0644/0755 (objects and packs 0444), some 0:0 or 1000:1000, some 100:2000 whose
//! mode lacks the group bits.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::args::Shape;
use crate::tree::{Counts, Entry, FS_GROUP, Kind, Meta};

/// splitmix64: small, fast, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn hex(&mut self, len: usize) -> String {
        (0..len).map(|_| char::from(b"0123456789abcdef"[self.below(16) as usize])).collect()
    }
}

struct Gen {
    root: PathBuf,
    rng: Rng,
    entries: Vec<Entry>,
    counts: Counts,
    dirs: HashSet<String>,
    budget: u64,
}

impl Gen {
    fn full(&self) -> bool {
        self.counts.entries >= self.budget
    }

    fn owner(&mut self, kind: Kind) -> (u32, u32) {
        match self.rng.below(100) {
            0..85 => (100, 100),
            85..90 => (0, 0),
            90..95 => (1000, 1000),
            // A symlink's mode never changes: its group must differ for it to need a change.
            _ if kind == Kind::Symlink => (100, 100),
            _ => (100, FS_GROUP),
        }
    }

    fn record(&mut self, rel: &str, kind: Kind, mode: u32) {
        let (uid, gid) = self.owner(kind);
        self.entries.push(Entry { rel: rel.into(), kind, golden: Meta { uid, gid, mode } });
        self.counts.entries += 1;
        match kind {
            Kind::Dir => self.counts.dirs += 1,
            Kind::File => self.counts.files += 1,
            Kind::Symlink => self.counts.symlinks += 1,
        }
    }

    /// Creates `rel` and its missing parents.
    fn dir(&mut self, rel: &str) -> io::Result<()> {
        if self.dirs.contains(rel) {
            return Ok(());
        }
        if let Some((parent, _)) = rel.rsplit_once('/') {
            self.dir(parent)?;
        }
        fs::create_dir(self.root.join(rel))?;
        self.dirs.insert(rel.to_string());
        self.record(rel, Kind::Dir, 0o755);
        Ok(())
    }

    fn file(&mut self, rel: &str, size: u64, mode: u32) -> io::Result<()> {
        if let Some((parent, _)) = rel.rsplit_once('/') {
            self.dir(parent)?;
        }
        fs::File::create(self.root.join(rel))?.set_len(size)?;
        if mode & libc::S_ISUID != 0 {
            self.counts.setuid += 1;
        }
        self.record(rel, Kind::File, mode);
        Ok(())
    }

    fn symlink(&mut self, rel: &str, target: &str) -> io::Result<()> {
        if let Some((parent, _)) = rel.rsplit_once('/') {
            self.dir(parent)?;
        }
        std::os::unix::fs::symlink(target, self.root.join(rel))?;
        self.record(rel, Kind::Symlink, 0o777);
        Ok(())
    }

    /// A second name for the recorded file `existing`; same inode, so same metadata.
    fn hardlink(&mut self, rel: &str, existing: &str) -> io::Result<()> {
        if let Some((parent, _)) = rel.rsplit_once('/') {
            self.dir(parent)?;
        }
        fs::hard_link(self.root.join(existing), self.root.join(rel))?;
        let golden =
            self.entries.iter().rev().find(|e| &*e.rel == existing).expect("hard link to a recorded file").golden;
        self.entries.push(Entry { rel: rel.into(), kind: Kind::File, golden });
        self.counts.entries += 1;
        self.counts.files += 1;
        self.counts.hardlinks += 1;
        Ok(())
    }
}

/// Generates a tree of about `n` entries (the root included) under `root`, which must not exist.
pub fn generate(root: &Path, shape: Shape, n: u64, seed: u64) -> io::Result<(Vec<Entry>, Counts)> {
    fs::create_dir(root)?;
    let mut g = Gen {
        root: root.to_path_buf(),
        rng: Rng(seed ^ 0x766f_6c70_7265_7000),
        entries: Vec::with_capacity(n as usize + 1024),
        counts: Counts::default(),
        dirs: HashSet::from([String::new()]),
        budget: n,
    };
    g.record("", Kind::Dir, 0o755);
    match shape {
        Shape::Atlantis => atlantis(&mut g)?,
        Shape::Flat => flat(&mut g)?,
        Shape::Deep => deep(&mut g)?,
    }
    Ok((g.entries, g.counts))
}

fn flat(g: &mut Gen) -> io::Result<()> {
    let mut i = 0;
    while !g.full() {
        let size = g.rng.below(4096);
        g.file(&format!("file-{i:07}.dat"), size, 0o644)?;
        i += 1;
    }
    Ok(())
}

fn deep(g: &mut Gen) -> io::Result<()> {
    const DEPTH: usize = 300;
    let mut chain = 0;
    while !g.full() {
        let mut rel = format!("chain-{chain:03}");
        for level in 0..DEPTH {
            if g.full() {
                break;
            }
            rel.push_str(&format!("/d{level:03}"));
            g.dir(&rel)?;
            let size = g.rng.below(2048);
            g.file(&format!("{rel}/f"), size, 0o644)?;
        }
        chain += 1;
    }
    Ok(())
}

const PROVIDERS: [(&str, &str); 4] = [("aws", "5.31.0"), ("google", "5.10.0"), ("random", "3.6.0"), ("null", "3.2.2")];
const HOOKS: [&str; 13] = [
    "applypatch-msg",
    "commit-msg",
    "fsmonitor-watchman",
    "post-update",
    "pre-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "pre-push",
    "pre-rebase",
    "pre-receive",
    "prepare-commit-msg",
    "push-to-checkout",
    "update",
];
const MODULES: [&str; 8] = ["vpc", "eks", "rds", "iam", "s3", "dns", "alb", "kms"];
const ENVS: [&str; 3] = ["dev", "staging", "prod"];
const ORGS: [&str; 4] = ["acme", "infra", "platform", "data"];

fn atlantis(g: &mut Gen) -> io::Result<()> {
    g.file("atlantis.db", 65536, 0o600)?;
    for (name, size) in [("terraform1.5.7", 80 << 20), ("terraform1.6.6", 85 << 20)] {
        g.file(&format!("bin/{name}"), size, 0o755)?;
    }
    // The one setuid file.
    g.file("bin/atlantis-helper", 1 << 20, 0o4755)?;
    for (p, v) in PROVIDERS {
        let rel = format!("plugin-cache/registry.terraform.io/hashicorp/{p}/{v}/linux_amd64");
        g.file(&format!("{rel}/terraform-provider-{p}_v{v}_x5"), 200 << 20, 0o755)?;
    }
    let mut i = 0;
    let mut prev_objects: Vec<String> = Vec::new();
    while !g.full() {
        let org = ORGS[i % ORGS.len()];
        let pr = g.rng.range(1, 3000);
        let co = format!("repos/{org}/repo-{i:04}/{pr}/default");
        prev_objects = checkout(g, &co, i, &prev_objects)?;
        i += 1;
    }
    Ok(())
}

/// One git checkout with Terraform sources; returns its loose objects' paths.
fn checkout(g: &mut Gen, co: &str, i: usize, prev: &[String]) -> io::Result<Vec<String>> {
    let git = format!("{co}/.git");
    for (f, size) in [
        ("HEAD", 23),
        ("config", 300),
        ("description", 73),
        ("FETCH_HEAD", 100),
        ("ORIG_HEAD", 41),
        ("packed-refs", 400),
        ("info/exclude", 240),
        ("logs/HEAD", 600),
        ("logs/refs/heads/main", 300),
        ("logs/refs/remotes/origin/HEAD", 200),
        ("refs/heads/main", 41),
        ("refs/remotes/origin/HEAD", 32),
        ("refs/remotes/origin/main", 41),
    ] {
        g.file(&format!("{git}/{f}"), size, 0o644)?;
    }
    let branch = g.rng.hex(6);
    g.file(&format!("{git}/refs/heads/atlantis-{branch}"), 41, 0o644)?;
    for t in 0..g.rng.below(5) {
        g.file(&format!("{git}/refs/tags/v1.{t}.0"), 41, 0o644)?;
    }
    g.dir(&format!("{git}/objects/info"))?;
    for h in HOOKS {
        g.file(&format!("{git}/hooks/{h}.sample"), 1000, 0o755)?;
    }
    let index = g.rng.range(1000, 40_000);
    g.file(&format!("{git}/index"), index, 0o644)?;
    for _ in 0..g.rng.range(1, 2) {
        let sha = g.rng.hex(40);
        let size = g.rng.range(4096, 4 << 20);
        g.file(&format!("{git}/objects/pack/pack-{sha}.pack"), size, 0o444)?;
        g.file(&format!("{git}/objects/pack/pack-{sha}.idx"), size / 20, 0o444)?;
    }
    let mut objects = Vec::new();
    for _ in 0..g.rng.range(40, 700) {
        if g.full() {
            return Ok(objects);
        }
        let (dir, name) = (g.rng.hex(2), g.rng.hex(38));
        let rel = format!("{git}/objects/{dir}/{name}");
        let size = g.rng.range(60, 400);
        g.file(&rel, size, 0o444)?;
        objects.push(rel);
    }
    if i % 25 == 24 {
        for (k, src) in prev.iter().take(3).enumerate() {
            // The same object name ("XX/38 hex digits") in this checkout, plus a digit.
            let name = src.rsplit_once("/objects/").map_or("xx/x", |(_, n)| n);
            let rel = format!("{git}/objects/{name}{k}");
            g.hardlink(&rel, src)?;
        }
    }
    g.file(&format!("{co}/README.md"), 900, 0o644)?;
    g.file(&format!("{co}/.gitignore"), 60, 0o644)?;
    let modules = g.rng.range(2, 6) as usize;
    for m in MODULES.iter().take(modules) {
        for f in ["main.tf", "variables.tf", "outputs.tf", "versions.tf"] {
            let size = g.rng.range(100, 6000);
            g.file(&format!("{co}/modules/{m}/{f}"), size, 0o644)?;
        }
    }
    let envs = g.rng.range(1, 3) as usize;
    for env in ENVS.iter().take(envs) {
        let e = format!("{co}/envs/{env}");
        for f in ["main.tf", "backend.tf", "terraform.tfvars", ".terraform.lock.hcl"] {
            let size = g.rng.range(100, 3000);
            g.file(&format!("{e}/{f}"), size, 0o644)?;
        }
        g.file(&format!("{e}/.terraform/modules/modules.json"), 500, 0o644)?;
        g.file(&format!("{e}/.terraform/terraform.tfstate"), 700, 0o644)?;
        for (p, v) in PROVIDERS.iter().take(2) {
            let link = format!("{e}/.terraform/providers/registry.terraform.io/hashicorp/{p}/{v}/linux_amd64");
            let up = "../".repeat(link.matches('/').count());
            let target = format!("{up}plugin-cache/registry.terraform.io/hashicorp/{p}/{v}/linux_amd64");
            g.symlink(&link, &target)?;
        }
    }
    Ok(objects)
}
